"""A role's process-wide RNG streams (torch, numpy, Python): seeded per rank at start,
saved with its step checkpoint and put back on resume."""
from __future__ import annotations

import random

import numpy as np
import torch


def seed_rngs(seed: int) -> None:
    """Seed the process-wide torch, numpy and Python RNGs (a role's are then the same in
    every run with the same seed, and a resume puts them back from the checkpoint)."""
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)


def rng_state() -> dict:
    """The RNG streams as tensors and plain values only, so the checkpoint loads weights-only."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    return {"torch": torch.get_rng_state(),
            "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(gauss)],
            "python": [version, torch.tensor(internal, dtype=torch.int64), gauss_next]}


def set_rng_state(state: dict | None) -> None:
    if not state:
        return
    torch.set_rng_state(state["torch"])
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(int(x) for x in internal.tolist()), gauss_next))
