"""Audio loading with explicit failures: every problem raises `AudioError` naming the
file (and the manifest line that referenced it, when known)."""
from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import soundfile as sf

from asr_grpo.config.errors import ConfigError

# Below 8 kHz speech loses most of its consonants: such a file is a mistake, not audio
# to upsample. A peak below -80 dBFS is digital silence (e.g. clipped to zeros).
MIN_SAMPLE_RATE = 8000
SILENCE_PEAK = 1e-4


class AudioError(ConfigError):
    """An audio file is missing, unreadable, empty, too short/long, silent, at a rate
    too low for speech, or non-finite (the user's data: one line at the commands)."""

    def __init__(self, path: str | Path, problem: str, *, manifest: str | Path | None = None,
                 line: int | None = None) -> None:
        where = f" (manifest {manifest}, line {line})" if manifest is not None else ""
        super().__init__(f"{path}: {problem}{where}")
        self.path = str(path)
        self.problem = problem


def resample(audio: np.ndarray, orig_sr: int, target_sr: int) -> np.ndarray:
    """Polyphase resampling with the rate ratio reduced, e.g. 22050->16000 is 320/441."""
    if orig_sr == target_sr:
        return audio
    from scipy.signal import resample_poly  # ~2 s to import; most loads never resample
    g = math.gcd(int(orig_sr), int(target_sr))
    return resample_poly(audio, target_sr // g, orig_sr // g).astype(np.float32)


def check_audio_file(path: str | Path, *, min_duration_s: float = 0.0,
                     max_duration_s: float | None = None, manifest: str | Path | None = None,
                     line: int | None = None) -> sf._SoundFileInfo:
    """Cheap header-only check (exists, readable, non-empty, duration in bounds)."""
    def fail(problem: str) -> AudioError:
        return AudioError(path, problem, manifest=manifest, line=line)

    if not os.path.isfile(path):
        raise fail("audio file not found")
    if os.path.getsize(path) == 0:
        raise fail("audio file is empty (0 bytes)")
    try:
        info = sf.info(str(path))
    except Exception as exc:  # libsndfile raises several types for corrupt files
        raise fail(f"unreadable or corrupt audio file ({exc})") from exc
    if info.frames <= 0 or info.samplerate <= 0:
        raise fail("audio file is empty (0 frames)")
    if info.samplerate < MIN_SAMPLE_RATE:
        raise fail(f"sample rate {info.samplerate} Hz is below {MIN_SAMPLE_RATE} Hz: too low for speech")
    duration = info.frames / info.samplerate
    if duration < min_duration_s:
        raise fail(f"audio is {duration:.3f} s, shorter than the minimum {min_duration_s} s")
    if max_duration_s is not None and duration > max_duration_s:
        raise fail(f"audio is {duration:.1f} s, longer than the maximum {max_duration_s} s")
    return info


def load_audio(path: str | Path, target_sr: int = 16000, *, max_duration_s: float | None = None,
               min_duration_s: float = 0.0, manifest: str | Path | None = None,
               line: int | None = None) -> np.ndarray:
    """Read a WAV/FLAC/... file as mono float32 at `target_sr`.

    Stereo is averaged to mono and other sample rates are resampled. Bounds are checked
    on the header first, so an absurdly long file is rejected without being read;
    NaN/inf samples and digital silence (peak below `SILENCE_PEAK`) are rejected after.
    """
    info = check_audio_file(path, min_duration_s=min_duration_s, max_duration_s=max_duration_s,
                            manifest=manifest, line=line)
    try:
        audio, sr = sf.read(str(path), dtype="float32", always_2d=True)
    except Exception as exc:
        raise AudioError(path, f"unreadable or corrupt audio file ({exc})",
                         manifest=manifest, line=line) from exc
    if audio.shape[0] == 0:
        raise AudioError(path, "audio file is empty (0 frames)", manifest=manifest, line=line)
    if not np.isfinite(audio).all():
        raise AudioError(path, "audio contains NaN or infinite samples", manifest=manifest,
                         line=line)
    peak = float(np.abs(audio).max())
    if peak < SILENCE_PEAK:
        raise AudioError(path, f"audio is silent (peak amplitude {peak:.1e})", manifest=manifest,
                         line=line)
    mono = audio.mean(axis=1, dtype=np.float32) if info.channels > 1 else audio[:, 0]
    return np.ascontiguousarray(resample(mono, sr, target_sr), dtype=np.float32)
