"""Small helpers shared by tests (importable: `tests/` is on pytest's pythonpath)."""
from __future__ import annotations

import numpy as np


def noise_audio(seconds: float, seed: int) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(int(16000 * seconds)) * 0.1).astype(np.float32)
