"""Shared helpers for the data tests: small WAV files written on demand."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soundfile as sf


def _tone(seconds: float, sr: int = 16000, freq: float = 440.0, channels: int = 1) -> np.ndarray:
    t = np.arange(int(round(seconds * sr))) / sr
    x = (0.5 * np.sin(2 * np.pi * freq * t)).astype(np.float32)
    # Channels differ (scaled copies) so a downmix is observable.
    return x if channels == 1 else np.stack([x * (c + 1) / channels for c in range(channels)], 1)


@pytest.fixture
def tone():
    """tone(seconds, sr=16000, freq=440.0, channels=1) -> float32 sine (frames[, channels])"""
    return _tone


@pytest.fixture
def make_wav(tmp_path: Path):
    """make_wav(name, seconds=1.0, sr=16000, channels=1, audio=None, subtype=None) -> Path"""
    def make(name: str, seconds: float = 1.0, sr: int = 16000, channels: int = 1,
             audio: np.ndarray | None = None, subtype: str | None = None) -> Path:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        data = _tone(seconds, sr, channels=channels) if audio is None else audio
        sf.write(path, data, sr, subtype=subtype)
        return path
    return make
