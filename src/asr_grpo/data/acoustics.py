"""How speech reaches a recogniser outside the studio: a reverberant room, additive noise
at a signal-to-noise ratio, and a telephone line. Pure signal processing on float32 mono
arrays; which of them an utterance gets, and with which parameters, is `conditions.py`'s.

- Room: a shoebox room's impulse response, talker and microphone at random places. The
  early part is pyroomacoustics' image-source model (exact reflections up to
  `EARLY_ORDER`); the late part, where image sources grow by the million (a 0.9 s room
  needs order ~120, 7 s of compute each), is the stochastic model of late reverberation:
  Gaussian noise under an exponential envelope that falls 60 dB in RT60, its level
  matched to the image-source response where that ends. Deterministic from its rng.
- Noise: white, pink and brown (colorednoise's 1/f^beta Gaussian noise) and mains hum
  (50 or 60 Hz and harmonics over a pink floor), scaled to a drawn SNR against the speech.
- Telephone: 8 kHz sampling, the line's band-pass (300-3400 Hz for a POTS line) and
  G.711 companding (mu-law or A-law, 8 bits a sample), back at the model's rate.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from asr_grpo.data.audio import resample

SPEED_OF_SOUND = 343.0        # m/s
EARLY_ORDER = 10              # image-source reflections computed exactly
WALL_MARGIN_M = 0.5           # talker and microphone keep this far from every wall
HEIGHT_M = (1.0, 1.8)         # talker's and microphone's height above the floor
_MAX_PLACEMENTS = 100
PHONE_RATE = 8000             # G.711's sampling rate
MU = 255.0                    # G.711 mu-law
A_LAW = 87.6                  # G.711 A-law
NOISE_KINDS = ("white", "pink", "brown", "hum")
_COLOUR_EXPONENT = {"white": 0.0, "pink": 1.0, "brown": 2.0}


@dataclass(frozen=True)
class Room:
    """A shoebox room: size (length, width, height), talker and microphone positions in
    metres, and the reverberation time the walls' absorption is set for."""
    size_m: tuple[float, float, float]
    talker_m: tuple[float, float, float]
    mic_m: tuple[float, float, float]
    rt60_s: float

    @property
    def distance_m(self) -> float:
        return math.dist(self.talker_m, self.mic_m)


def draw_in(rng: np.random.Generator, ranges) -> float:
    """A value uniform in one of the [low, high] `ranges`, the range drawn in proportion to
    its width (so the union is drawn uniformly)."""
    widths = np.array([high - low for low, high in ranges], dtype=np.float64)
    pick = int(rng.choice(len(ranges), p=widths / widths.sum())) if widths.sum() > 0 else 0
    low, high = ranges[pick]
    return float(rng.uniform(low, high))


def _place(rng: np.random.Generator, size: tuple[float, float, float]) -> tuple[float, float, float]:
    length, width, _ = size
    return (float(rng.uniform(WALL_MARGIN_M, length - WALL_MARGIN_M)),
            float(rng.uniform(WALL_MARGIN_M, width - WALL_MARGIN_M)), float(rng.uniform(*HEIGHT_M)))


def draw_room(rng: np.random.Generator, size_ranges, distance_m, rt60_ranges) -> Room:
    """A room of a size in `size_ranges` ([low, high] for length, width, height), the talker
    `distance_m` ([low, high]) from the microphone, and an RT60 drawn in `rt60_ranges`."""
    for _ in range(_MAX_PLACEMENTS):
        size = tuple(float(rng.uniform(low, high)) for low, high in size_ranges)
        mic = _place(rng, size)
        distance = float(rng.uniform(*distance_m))
        angle = float(rng.uniform(0.0, 2 * math.pi))
        talker = (mic[0] + distance * math.cos(angle), mic[1] + distance * math.sin(angle),
                  float(rng.uniform(*HEIGHT_M)))
        inside = all(WALL_MARGIN_M <= talker[i] <= size[i] - WALL_MARGIN_M for i in range(2))
        if inside and math.dist(talker, mic) >= 0.1:
            return Room(size, talker, mic, draw_in(rng, rt60_ranges))
    raise ValueError(f"no talker {distance_m} m from the microphone fits rooms of {size_ranges} m "
                     f"in {_MAX_PLACEMENTS} draws: widen the sizes or shorten the distances")


def impulse_response(room: Room, sample_rate: int, rng: np.random.Generator) -> np.ndarray:
    """The room's impulse response from talker to microphone, RT60 long (see the module
    docstring), normalised to a unit-energy direct path's peak: float32."""
    import pyroomacoustics as pra  # ~1 s to import; only rooms need it

    absorption, order = pra.inverse_sabine(room.rt60_s, list(room.size_m))
    shoebox = pra.ShoeBox(list(room.size_m), fs=sample_rate, materials=pra.Material(absorption),
                          max_order=min(order, EARLY_ORDER))
    shoebox.add_source(list(room.talker_m))
    shoebox.add_microphone(list(room.mic_m))
    shoebox.compute_rir()
    early = np.asarray(shoebox.rir[0][0], dtype=np.float64)
    length = max(int(room.rt60_s * sample_rate), len(early))
    if order > EARLY_ORDER:
        # Images of the next order along the shortest axis arrive after this: up to it the
        # image-source response is complete.
        complete = int((EARLY_ORDER + 1) * min(room.size_m) / SPEED_OF_SOUND * sample_rate)
        complete = min(complete, len(early))
        window = slice(complete // 2, complete)
        t = np.arange(length) / sample_rate
        decay = 10.0 ** (-3.0 * t / room.rt60_s)             # amplitude: -60 dB at RT60
        level = math.sqrt(float(np.mean(np.square(early[window]) / np.square(decay[window]))))
        tail = level * decay * rng.standard_normal(length)
        out = tail.copy()
        out[:complete] = early[:complete]
    else:   # the image-source model reached the full decay itself
        out = np.pad(early, (0, length - len(early)))
    return (out / np.abs(out).max()).astype(np.float32)


def reverberate(audio: np.ndarray, rir: np.ndarray) -> np.ndarray:
    """`audio` as heard through `rir`, as long as the input (the tail past its end cut off,
    so the duration the manifest states still holds) and at the input's peak."""
    from scipy.signal import fftconvolve

    if audio.size == 0:
        return audio
    wet = fftconvolve(audio.astype(np.float64), rir.astype(np.float64))[:len(audio)]
    peak = float(np.abs(wet).max())
    return (wet * (float(np.abs(audio).max()) / peak if peak > 0 else 0.0)).astype(np.float32)


def power(audio: np.ndarray) -> float:
    return float(np.mean(np.square(audio, dtype=np.float64))) if audio.size else 0.0


def snr_scale(signal: np.ndarray, noise: np.ndarray, snr_db: float) -> float:
    """The factor that puts `noise` `snr_db` below `signal` in mean power (0 for silent noise)."""
    noise_power = power(noise)
    return math.sqrt(power(signal) / (noise_power * 10 ** (snr_db / 10))) if noise_power > 0 else 0.0


def noise(kind: str, n: int, sample_rate: int, rng: np.random.Generator) -> np.ndarray:
    """`n` samples of `kind` noise (NOISE_KINDS), unit power."""
    import colorednoise

    if kind == "hum":
        t = np.arange(n) / sample_rate
        mains = float(rng.choice([50.0, 60.0]))
        out = sum(np.sin(2 * np.pi * mains * k * t + rng.uniform(0, 2 * np.pi)) / k for k in range(1, 6))
        floor = colorednoise.powerlaw_psd_gaussian(1.0, n, random_state=rng)
        out = out / math.sqrt(power(out)) + 0.3 * floor / math.sqrt(max(power(floor), 1e-12))
    elif kind in _COLOUR_EXPONENT:
        out = colorednoise.powerlaw_psd_gaussian(_COLOUR_EXPONENT[kind], n, random_state=rng)
    else:
        raise ValueError(f"unknown noise kind {kind!r}; known: {', '.join(NOISE_KINDS)}")
    p = power(out)
    return (out / math.sqrt(p) if p > 0 else out).astype(np.float32)


def add_noise(audio: np.ndarray, kind: str, snr_db: float, sample_rate: int,
              rng: np.random.Generator) -> np.ndarray:
    """`audio` with `kind` noise `snr_db` below it; peak kept at or below 1."""
    if audio.size == 0:
        return audio
    noisy = audio + snr_scale(audio, (n := noise(kind, len(audio), sample_rate, rng)), snr_db) * n
    peak = float(np.abs(noisy).max())
    return (noisy / max(1.0, peak)).astype(np.float32)


def compand(audio: np.ndarray, law: str) -> np.ndarray:
    """G.711 8-bit companding: compressed by `law` ("mulaw" or "alaw"), quantised to 256
    levels and expanded again, so quiet passages keep their detail and loud ones lose it."""
    x = np.clip(audio.astype(np.float64), -1.0, 1.0)
    mag = np.abs(x)
    if law == "mulaw":
        y = np.log1p(MU * mag) / math.log1p(MU)
    elif law == "alaw":
        small = mag < 1.0 / A_LAW
        y = np.where(small, A_LAW * mag, 1.0 + np.log(np.maximum(A_LAW * mag, 1.0))) / (1.0 + math.log(A_LAW))
    else:
        raise ValueError(f"unknown companding law {law!r}; known: mulaw, alaw")
    y = np.round(y * 127.0) / 127.0                           # 7 bits of magnitude + the sign
    if law == "mulaw":
        mag = np.expm1(y * math.log1p(MU)) / MU
    else:
        scaled = y * (1.0 + math.log(A_LAW))
        mag = np.where(scaled < 1.0, scaled / A_LAW, np.exp(scaled - 1.0) / A_LAW)
    return (np.sign(x) * mag).astype(np.float32)


def telephone(audio: np.ndarray, sample_rate: int, band_hz, law: str) -> np.ndarray:
    """`audio` through a telephone line: down to 8 kHz, band-passed to `band_hz` ([low,
    high] Hz, a 4th-order Butterworth), G.711-companded, and back at `sample_rate` with the
    input's length."""
    from scipy.signal import butter, sosfilt

    if audio.size == 0:
        return audio
    narrow = resample(audio, sample_rate, PHONE_RATE).astype(np.float64)
    low, high = band_hz
    narrow = sosfilt(butter(4, [low, high], btype="bandpass", fs=PHONE_RATE, output="sos"), narrow)
    line = compand(narrow / max(1.0, float(np.abs(narrow).max())), law)
    back = resample(line, PHONE_RATE, sample_rate)
    return np.pad(back, (0, max(0, len(audio) - len(back))))[:len(audio)].astype(np.float32)
