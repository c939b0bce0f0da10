import numpy as np
import pytest

from asr_grpo.data import templates
from asr_grpo.data.espeak import EspeakError, EspeakSynthesizer


@pytest.fixture(scope="module")
def synth():
    return EspeakSynthesizer()


def _rms(x):
    return float(np.sqrt(np.mean(x.astype(np.float64) ** 2)))


@pytest.mark.parametrize("text,voice", [
    ("please turn on the lights in the kitchen", "en-us"),
    ("please turn on the lights in the kitchen", "en-gb-x-rp+f3"),
    ("请打开客厅的灯", "cmn-latn-pinyin"),
    ("请打开客厅的灯", "cmn-latn-pinyin+m3"),
])
def test_synthesis_is_plausible_speech(synth, text, voice):
    audio = synth.synthesize(text, voice, rate_wpm=175, pitch=50)
    assert audio.dtype == np.float32 and audio.ndim == 1
    assert 1.0 < len(audio) / 16000 < 4.0          # 16 kHz output, sentence-length
    assert _rms(audio) > 0.02 and np.abs(audio).max() <= 1.0


def test_rate_and_sample_rate(synth):
    slow = synth.synthesize("the train to boston leaves at seven", "en-us", rate_wpm=120)
    fast = synth.synthesize("the train to boston leaves at seven", "en-us", rate_wpm=240)
    assert len(fast) < 0.75 * len(slow)
    at_8k = synth.synthesize("the train to boston leaves at seven", "en-us", rate_wpm=120,
                             sample_rate=8000)
    assert 0.49 < len(at_8k) / len(slow) < 0.51


@pytest.mark.parametrize("voice", ["xx-nonexistent", "en-us+nonexistent"])
def test_missing_voice_raises(synth, voice):
    assert not synth.has_voice(voice)
    with pytest.raises(EspeakError, match="not found"):
        synth.synthesize("hello", voice)


def test_corpus_voices_exist(synth):
    from asr_grpo.data.corpus import HELDOUT_VOICES, VOICES
    assert all(synth.has_voice(v) for voices in VOICES.values() for v in voices)
    assert all(synth.has_voice(v) for voices in HELDOUT_VOICES.values() for v in voices)


def test_held_out_voices_speak_at_the_edges_of_their_ranges(synth):
    """Every held-out voice gives sentence-length speech at its slowest-lowest and
    fastest-highest settings (no variant that silently fails or runs on)."""
    from asr_grpo.data.corpus import HELDOUT_PITCH, HELDOUT_RATE_WPM, HELDOUT_VOICES
    text = {"en": "please turn on the lights in the kitchen", "zh": "请打开客厅的灯"}
    edges = [(HELDOUT_RATE_WPM[0][0], HELDOUT_PITCH[0][0]), (HELDOUT_RATE_WPM[-1][1], HELDOUT_PITCH[-1][1])]
    for language, voices in HELDOUT_VOICES.items():
        for voice in voices:
            for rate, pitch in edges:
                audio = synth.synthesize(text[language], voice, rate_wpm=rate, pitch=pitch)
                assert 1.0 < len(audio) / 16000 < 3.5 and _rms(audio) > 0.02, (voice, rate, pitch)


@pytest.mark.parametrize("voice", ["cmn-latn-pinyin", "cmn"])   # cmn: the held-out voices' base
def test_every_chinese_character_is_pronounced(synth, voice):
    # An unknown character is spelled out (long) or skipped (near silence).
    for char in sorted(templates.zh_characters()):
        audio = synth.synthesize(char, voice)
        assert 0.12 < len(audio) / 16000 < 0.6 and _rms(audio) > 0.02, char


def test_empty_text_raises(synth):
    with pytest.raises(EspeakError, match="empty"):
        synth.synthesize("  ", "en-us")
