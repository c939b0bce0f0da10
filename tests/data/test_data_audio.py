import numpy as np
import pytest

from asr_grpo.data.audio import AudioError, load_audio, resample


def _peak_hz(x: np.ndarray, sr: int) -> float:
    spectrum = np.abs(np.fft.rfft(x))
    return float(np.fft.rfftfreq(len(x), 1 / sr)[spectrum.argmax()])


def test_mono_16k_roundtrip(make_wav, tone):
    audio = load_audio(make_wav("a.wav", 1.0))
    assert audio.dtype == np.float32 and audio.ndim == 1 and len(audio) == 16000
    np.testing.assert_allclose(audio, tone(1.0), atol=1e-4)  # PCM16 quantisation only


def test_stereo_is_downmixed_to_channel_mean(make_wav, tone):
    stereo = tone(0.5, channels=2)
    audio = load_audio(make_wav("s.wav", audio=stereo, subtype="FLOAT"))
    np.testing.assert_allclose(audio, stereo.mean(axis=1), atol=1e-6)


@pytest.mark.parametrize("sr", [8000, 44100, 22050])
def test_other_rates_are_resampled_keeping_duration_and_pitch(make_wav, sr):
    audio = load_audio(make_wav(f"r{sr}.wav", 1.5, sr=sr))
    assert abs(len(audio) - 24000) <= 1
    # A wrong ratio would shift the 440 Hz tone (e.g. play at double speed).
    assert abs(_peak_hz(audio, 16000) - 440.0) < 2.0


def test_flac_is_read(make_wav):
    assert len(load_audio(make_wav("f.flac", 0.5))) == 8000


def test_resample_reduces_ratio():
    assert len(resample(np.zeros(22050, np.float32), 22050, 16000)) == 16000
    x = np.ones(10, np.float32)
    assert resample(x, 16000, 16000) is x


def _assert_names_file(exc: pytest.ExceptionInfo, path) -> None:
    assert str(path) in str(exc.value)


def test_missing_file(tmp_path):
    path = tmp_path / "nope.wav"
    with pytest.raises(AudioError, match="not found") as exc:
        load_audio(path)
    _assert_names_file(exc, path)


def test_corrupt_file(tmp_path):
    path = tmp_path / "corrupt.wav"
    path.write_bytes(b"RIFF\x00\x00\x00\x00WAVEgarbage" + bytes(100))
    with pytest.raises(AudioError, match="unreadable or corrupt") as exc:
        load_audio(path)
    _assert_names_file(exc, path)


def test_empty_wav(make_wav):
    path = make_wav("empty.wav", audio=np.zeros(0, np.float32))
    with pytest.raises(AudioError, match="empty") as exc:
        load_audio(path)
    _assert_names_file(exc, path)


def test_too_long_and_too_short(make_wav):
    path = make_wav("long.wav", 2.0)
    with pytest.raises(AudioError, match="longer than the maximum") as exc:
        load_audio(path, max_duration_s=1.5)
    _assert_names_file(exc, path)
    with pytest.raises(AudioError, match="shorter than the minimum"):
        load_audio(path, min_duration_s=3.0)
    assert len(load_audio(path, min_duration_s=1.0, max_duration_s=3.0)) == 32000


def test_nan_samples(make_wav, tone):
    audio = tone(0.5)
    audio[100] = np.nan
    path = make_wav("nan.wav", audio=audio, subtype="FLOAT")
    with pytest.raises(AudioError, match="NaN") as exc:
        load_audio(path)
    _assert_names_file(exc, path)


def test_error_names_manifest_and_line(tmp_path):
    with pytest.raises(AudioError) as exc:
        load_audio(tmp_path / "x.wav", manifest="/m/train.jsonl", line=7)
    assert "x.wav" in str(exc.value) and "/m/train.jsonl" in str(exc.value)
    assert "line 7" in str(exc.value)

    assert issubclass(AudioError, ValueError)
