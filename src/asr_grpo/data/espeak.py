"""eSpeak NG text-to-speech through ctypes, using the library and data that the
`espeakng-loader` wheel ships (no system package needed).

eSpeak keeps global state, so the library is initialised once per process; every
`EspeakSynthesizer` in a process shares it. Output is float32 at 16 kHz by default.

Determinism: voices with breath noise (e.g. the +f2/+f3 variants) draw random numbers;
`seed` fixes them. The waveform also depends slightly on what the process synthesized
before (static state inside libespeak-ng, e.g. the pitch-flutter phase, survives calls
and re-initialisation). The same sequence of calls in a fresh process gives the same
samples, which is what the corpus builder relies on.
"""
from __future__ import annotations

import ctypes
import os
import threading

import numpy as np

from asr_grpo.data.audio import resample

ESPEAK_SAMPLE_RATE = 22050

# Constants from speak_lib.h.
_AUDIO_OUTPUT_SYNCHRONOUS = 2
_CHARS_UTF8 = 1
_PARAM_RATE = 1
_PARAM_PITCH = 3
_EE_OK = 0
_EE_NOT_FOUND = 2

# int callback(short *wav, int numsamples, espeak_EVENT *events)
_SYNTH_CALLBACK = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.c_void_p)


class EspeakError(RuntimeError):
    """eSpeak NG failed to initialise, lacks a voice, or failed to synthesize."""


class _Engine:
    """The process-wide library handle; the callback appends into `chunks`."""

    def __init__(self) -> None:
        import espeakng_loader

        lib = ctypes.CDLL(espeakng_loader.get_library_path())
        lib.espeak_Initialize.restype = ctypes.c_int
        lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
        lib.espeak_SetVoiceByName.restype = ctypes.c_int
        lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
        lib.espeak_SetParameter.restype = ctypes.c_int
        lib.espeak_SetParameter.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
        lib.espeak_Synth.restype = ctypes.c_int
        lib.espeak_Synth.argtypes = [
            ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint, ctypes.c_int, ctypes.c_uint,
            ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p]
        lib.espeak_Synchronize.restype = ctypes.c_int
        lib.espeak_ng_SetRandSeed.restype = None
        lib.espeak_ng_SetRandSeed.argtypes = [ctypes.c_long]

        data_path = espeakng_loader.get_data_path().encode()
        rate = lib.espeak_Initialize(_AUDIO_OUTPUT_SYNCHRONOUS, 0, data_path, 0)
        if rate != ESPEAK_SAMPLE_RATE:
            raise EspeakError(f"espeak_Initialize returned {rate} (expected "
                              f"{ESPEAK_SAMPLE_RATE} Hz) with data at {data_path.decode()}")
        self.lib = lib
        self.variants_dir = os.path.join(data_path.decode(), "voices", "!v")
        self.chunks: list[np.ndarray] = []
        # Keep a reference: ctypes callbacks are freed when garbage-collected.
        self._callback = _SYNTH_CALLBACK(self._on_audio)
        lib.espeak_SetSynthCallback(self._callback)
        self.lock = threading.Lock()

    def _on_audio(self, wav, num_samples, _events) -> int:
        if num_samples > 0 and wav:
            self.chunks.append(np.ctypeslib.as_array(wav, shape=(num_samples,)).copy())
        return 0  # 0 = continue synthesis


_ENGINE: _Engine | None = None


def _engine() -> _Engine:
    global _ENGINE
    if _ENGINE is None:
        _ENGINE = _Engine()
    return _ENGINE


class EspeakSynthesizer:
    """Synthesize text with an eSpeak NG voice, e.g. `en-us`, `en-us+f3`,
    `cmn-latn-pinyin+m3` (the Mandarin voice reads Chinese characters)."""

    def __init__(self) -> None:
        self._engine = _engine()

    def _voice_problem(self, voice: str) -> str | None:
        """None if `voice` can be selected, else why not. Must hold the engine lock."""
        engine = self._engine
        _, _, variant = voice.partition("+")
        # eSpeak silently ignores an unknown "+variant", so check its file ourselves.
        if variant and not os.path.isfile(os.path.join(engine.variants_dir, variant)):
            return f"variant {variant!r} not found in {engine.variants_dir}"
        status = engine.lib.espeak_SetVoiceByName(voice.encode())
        if status != _EE_OK:
            return "voice not found" if status == _EE_NOT_FOUND else f"error code {status}"
        return None

    def has_voice(self, voice: str) -> bool:
        with self._engine.lock:
            return self._voice_problem(voice) is None

    def synthesize(self, text: str, voice: str, rate_wpm: int = 175, pitch: int = 50,
                   sample_rate: int = 16000, seed: int = 0) -> np.ndarray:
        """Return mono float32 audio in [-1, 1] at `sample_rate`.

        `rate_wpm` is eSpeak's speaking rate (80-450), `pitch` its base pitch (0-100),
        `seed` seeds eSpeak's breath noise."""
        if not text.strip():
            raise EspeakError("cannot synthesize empty text")
        engine = self._engine
        lib = engine.lib
        with engine.lock:
            problem = self._voice_problem(voice)
            if problem is not None:
                raise EspeakError(f"eSpeak NG voice {voice!r}: {problem}")
            # Set after the voice: selecting a voice resets rate and pitch.
            lib.espeak_SetParameter(_PARAM_RATE, int(rate_wpm), 0)
            lib.espeak_SetParameter(_PARAM_PITCH, int(pitch), 0)
            lib.espeak_ng_SetRandSeed(int(seed))
            data = text.encode("utf-8")
            engine.chunks = []
            status = lib.espeak_Synth(data, len(data) + 1, 0, 0, 0, _CHARS_UTF8, None, None)
            lib.espeak_Synchronize()
            chunks, engine.chunks = engine.chunks, []
        if status != _EE_OK:
            raise EspeakError(f"espeak_Synth failed with code {status} for text {text!r}")
        if not chunks:
            return np.zeros(0, dtype=np.float32)
        pcm = np.concatenate(chunks).astype(np.float32) / 32768.0
        return resample(pcm, ESPEAK_SAMPLE_RATE, sample_rate)
