"""Rooms, telephone lines and noise (data/acoustics.py), the named conditions built from
them and the held-out-conditions split (data/conditions.py): each measured on the signal
it makes, and the same seed giving the same audio."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
from omegaconf import OmegaConf

from asr_grpo.config.schema import HELDOUT_CONDITIONS, TRAIN_CONDITIONS, DataConfig
from asr_grpo.data import acoustics
from asr_grpo.data.conditions import HELDOUT, TRAIN, build_condition, heldout_condition_manifests

SR = 16000


def speechlike(seconds: float = 2.0, seed: int = 0) -> np.ndarray:
    """Tones that come and go (syllables of 150 ms), so reverberation has gaps to fill."""
    t = np.arange(int(seconds * SR)) / SR
    rng = np.random.default_rng(seed)
    freqs = rng.uniform(200, 2500, size=int(seconds / 0.15) + 1)
    gate = (np.floor(t / 0.15) % 2 == 0).astype(np.float64)
    return (0.3 * gate * np.sin(2 * np.pi * freqs[(t / 0.15).astype(int)] * t)).astype(np.float32)


def band_power(audio: np.ndarray, low: float, high: float) -> float:
    spectrum = np.abs(np.fft.rfft(audio.astype(np.float64))) ** 2
    freqs = np.fft.rfftfreq(len(audio), 1 / SR)
    return float(spectrum[(freqs >= low) & (freqs < high)].sum())


def schroeder_rt60(rir: np.ndarray) -> float:
    """RT60 from the backward-integrated energy's fall from -5 to -25 dB (T20), extrapolated."""
    energy = np.cumsum(np.square(rir.astype(np.float64))[::-1])[::-1]
    db = 10 * np.log10(energy / energy[0] + 1e-30)
    t5, t25 = np.argmax(db <= -5) / SR, np.argmax(db <= -25) / SR
    return 3.0 * (t25 - t5)


@pytest.mark.parametrize("rt60", [0.3, 0.6, 0.9])
def test_a_rooms_impulse_response_decays_in_its_rt60(rt60):
    rng = np.random.default_rng(1)
    room = acoustics.draw_room(rng, [[5, 7], [4, 6], [2.5, 3.5]], [1.0, 2.0], [[rt60, rt60]])
    rir = acoustics.impulse_response(room, SR, rng)
    assert room.rt60_s == rt60 and 1.0 <= room.distance_m <= 2.0
    assert schroeder_rt60(rir) == pytest.approx(rt60, rel=0.25)
    assert len(rir) >= rt60 * SR and np.abs(rir).max() == pytest.approx(1.0)


def test_reverberation_keeps_length_and_peak_and_fills_the_gaps():
    dry = speechlike()
    rng = np.random.default_rng(0)
    rir = acoustics.impulse_response(acoustics.draw_room(rng, [[6, 6], [5, 5], [3, 3]], [2, 2], [[0.8, 0.8]]), SR, rng)
    wet = acoustics.reverberate(dry, rir)
    assert len(wet) == len(dry) and np.abs(wet).max() == pytest.approx(np.abs(dry).max(), rel=1e-5)
    gaps = np.floor(np.arange(len(dry)) / SR / 0.15) % 2 == 1
    assert np.abs(dry[gaps]).max() == 0 and acoustics.power(wet[gaps]) > 0.05 * acoustics.power(wet)


@pytest.mark.parametrize("kind", ["white", "pink", "brown", "hum"])
def test_noise_is_added_at_the_asked_snr(kind):
    speech = 0.1 * speechlike()   # quiet: the peak guard never scales the mixture
    noisy = acoustics.add_noise(speech, kind, 7.5, SR, np.random.default_rng(3))
    measured = 10 * math.log10(acoustics.power(speech) / acoustics.power(noisy - speech))
    assert measured == pytest.approx(7.5, abs=0.05)


def test_noise_colours_tilt_as_named():
    low_over_high = {kind: band_power(acoustics.noise(kind, SR * 2, SR, np.random.default_rng(0)), 50, 500)
                     / band_power(acoustics.noise(kind, SR * 2, SR, np.random.default_rng(0)), 4000, 8000)
                     for kind in ("white", "pink", "brown")}
    assert 0.05 < low_over_high["white"] < 0.2          # 450 Hz of band against 4,000
    assert low_over_high["white"] * 10 < low_over_high["pink"] < low_over_high["brown"] / 10
    hum = acoustics.noise("hum", SR * 2, SR, np.random.default_rng(0))
    assert band_power(hum, 45, 65) > 0.5 * band_power(hum, 0, SR)   # most of it at the mains frequency
    with pytest.raises(ValueError, match="unknown noise kind 'rain'"):
        acoustics.noise("rain", 10, SR, np.random.default_rng(0))


def test_the_telephone_line_passes_its_band_only():
    t = np.arange(SR) / SR
    inside = (0.5 * np.sin(2 * np.pi * 1000 * t)).astype(np.float32)
    for law in ("mulaw", "alaw"):
        line = acoustics.telephone(inside, SR, [300, 3400], law)
        assert len(line) == len(inside)
        settled = line[SR // 10:]    # past the filter's onset
        assert acoustics.power(settled) == pytest.approx(acoustics.power(inside), rel=0.15), law
        assert band_power(settled, 980, 1020) > 0.95 * band_power(settled, 0, SR), law   # the tone, little else
    above = (0.5 * np.sin(2 * np.pi * 5000 * t)).astype(np.float32)    # above 8 kHz's Nyquist
    below = (0.5 * np.sin(2 * np.pi * 80 * t)).astype(np.float32)      # under the band
    assert acoustics.power(acoustics.telephone(above, SR, [300, 3400], "mulaw")) < 1e-4 * acoustics.power(above)
    assert acoustics.power(acoustics.telephone(below, SR, [300, 3400], "mulaw")) < 0.05 * acoustics.power(below)


@pytest.mark.parametrize("law", ["mulaw", "alaw"])
def test_companding_keeps_8_bits_with_relative_precision(law):
    x = np.concatenate([np.linspace(-1, 1, 4001), [0.001, -0.01, 0.5]]).astype(np.float32)
    y = acoustics.compand(x, law)
    assert len(np.unique(y)) <= 256
    loud = np.abs(x) > 0.05
    assert np.max(np.abs(y[loud] - x[loud]) / np.abs(x[loud])) < 0.07   # a log-scale step, not a linear one
    assert np.array_equal(np.sign(y[x != 0]), np.sign(x[x != 0]))


def small_condition(**overrides):
    """A default condition shrunk to 3 rooms, so tests build it in well under a second."""
    cfg = OmegaConf.structured(DataConfig())
    for key, value in overrides.items():
        OmegaConf.update(cfg, key, value, merge=False)
    for group in ("train_conditions", "heldout_conditions"):
        for condition in cfg[group].values():
            condition.room.rooms = 3
    return cfg


def test_the_same_seed_gives_the_same_audio_and_another_seed_other_rooms():
    cfg = small_condition()
    speech = speechlike()
    for name in ("room", "phone", "noise"):
        a = build_condition(name, cfg.heldout_conditions[name], 0, HELDOUT, SR)
        b = build_condition(name, OmegaConf.to_object(cfg.heldout_conditions[name]), 0, HELDOUT, SR)
        out_a = a.apply(speech, SR, np.random.default_rng(7))
        assert np.array_equal(out_a, b.apply(speech, SR, np.random.default_rng(7))), name
        assert len(out_a) == len(speech) and not np.array_equal(out_a, speech), name
    room = cfg.heldout_conditions.room
    base = build_condition("room", room, 0, HELDOUT, SR).rirs
    for other in (build_condition("room", room, 1, HELDOUT, SR).rirs,    # another seed
                  build_condition("room", room, 0, TRAIN, SR).rirs):     # a training room
        assert all(not (len(x) == len(y) and np.allclose(x, y)) for x in base for y in other)


def test_held_out_rt60s_and_snrs_are_values_no_training_condition_draws():
    def spans(ranges):
        return [tuple(r) for r in ranges]

    def overlaps(a, b):
        return any(lo1 < hi2 and lo2 < hi1 for lo1, hi1 in a for lo2, hi2 in b)

    train_rt60 = spans(TRAIN_CONDITIONS["room"].room.rt60_s)
    train_snr = [r for c in TRAIN_CONDITIONS.values() if c.noise.kinds for r in spans(c.noise.snr_db)]
    for name, held in HELDOUT_CONDITIONS.items():
        assert not overlaps(spans(held.room.rt60_s), train_rt60), name
        if held.noise.kinds:
            same_line = [r for c in TRAIN_CONDITIONS.values() if c.noise.kinds and c.channel.kind == held.channel.kind
                         for r in spans(c.noise.snr_db)]
            assert not overlaps(spans(held.noise.snr_db), same_line), name
    assert train_snr and HELDOUT_CONDITIONS["phone"].channel.companding != TRAIN_CONDITIONS["phone"].channel.companding


@pytest.fixture
def voices_manifest(tmp_path):
    """A 4-utterance held-out-voice manifest of speech-like WAVs."""
    import soundfile as sf
    rows = []
    for i in range(4):
        audio = speechlike(1.0 + 0.25 * i, seed=i)
        sf.write(tmp_path / f"u{i}.wav", audio, SR, subtype="PCM_16")
        rows.append({"id": f"u{i}", "audio": f"u{i}.wav", "text": f"text {i}", "language": "en",
                     "keywords": [], "duration": len(audio) / SR})
    path = tmp_path / "heldout_voices.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_the_held_out_conditions_split_is_rendered_once_and_reproducibly(voices_manifest, tmp_path):
    cfg = small_condition(num_heldout_conditions=3)
    first = heldout_condition_manifests(voices_manifest, cfg, tmp_path / "a")
    assert sorted(first) == ["noise", "phone", "room"]
    rows = [json.loads(line) for line in first["phone"].read_text().splitlines()]
    assert [r["id"] for r in rows] == ["u0@phone", "u1@phone", "u2@phone"]
    assert [r["text"] for r in rows] == ["text 0", "text 1", "text 2"]
    stamp = first["room"].stat().st_mtime_ns
    assert heldout_condition_manifests(voices_manifest, cfg, tmp_path / "a") == first   # cached
    assert first["room"].stat().st_mtime_ns == stamp
    again = heldout_condition_manifests(voices_manifest, cfg, tmp_path / "b")
    for name in first:
        for row in map(json.loads, first[name].read_text().splitlines()):
            assert (first[name].parent / row["audio"]).read_bytes() == (again[name].parent / row["audio"]).read_bytes()
    other = heldout_condition_manifests(voices_manifest, small_condition(num_heldout_conditions=3, conditions_seed=1),
                                        tmp_path / "a")
    assert other["room"].parent != first["room"].parent     # another seed: another folder
    assert heldout_condition_manifests(None, cfg, tmp_path / "a") == {}
    assert heldout_condition_manifests(voices_manifest, small_condition(num_heldout_conditions=0), tmp_path) == {}


def test_evaluation_sets_add_each_held_out_condition(voices_manifest, tmp_path):
    from asr_grpo.data.corpus import CorpusManifests
    from asr_grpo.evaluation import evaluation_sets, metrics_of_sets
    cfg = small_condition(num_heldout_conditions=2)
    manifests = CorpusManifests(tmp_path, voices_manifest, voices_manifest, None, heldout_voices=voices_manifest)
    sets = evaluation_sets(manifests, cfg, tmp_path / "out")
    assert list(sets) == ["dev", "heldout_voices", "heldout_conditions/room", "heldout_conditions/phone",
                          "heldout_conditions/noise"]
    assert [len(s) for s in sets.values()] == [4, 4, 2, 2, 2]
    metrics = metrics_of_sets(lambda name, ds: {"cer": float(len(ds))}, sets)
    assert metrics["heldout_conditions/phone/cer"] == 2.0 and metrics["cer"] == 4.0


def test_a_room_that_cannot_be_built_is_one_config_line():
    from asr_grpo.config.errors import ConfigError
    cfg = small_condition()
    cfg.heldout_conditions.room.room.size_m = [[40.0, 40.0], [40.0, 40.0], [20.0, 20.0]]   # a hall
    cfg.heldout_conditions.room.room.rt60_s = [[0.1, 0.1]]                                  # too dry for it
    with pytest.raises(ConfigError, match=r"^data\.heldout_conditions\.room\.room: "):
        build_condition("room", cfg.heldout_conditions.room, 0, HELDOUT, SR)
