"""Waveform perturbation for SFT: speed perturbation and babble from other utterances."""
from __future__ import annotations

import numpy as np
import pytest

from asr_grpo.config.schema import WaveAugmentConfig
from asr_grpo.data.augment import mix_babble, perturb_batch, speed_perturb

SR = 16000


def _tone(hz: float, seconds: float, amplitude: float = 0.5) -> np.ndarray:
    return (amplitude * np.sin(2 * np.pi * hz * np.arange(int(SR * seconds)) / SR)).astype(np.float32)


def _peak_hz(audio: np.ndarray) -> float:
    spectrum = np.abs(np.fft.rfft(audio))
    return float(np.fft.rfftfreq(len(audio), 1 / SR)[spectrum.argmax()])


@pytest.mark.parametrize("factor", [0.85, 0.9, 1.1, 1.15])
def test_speed_perturbation_scales_duration_and_pitch_together(factor):
    tone = _tone(440.0, 2.0)
    out = speed_perturb(tone, factor)
    assert out.dtype == np.float32
    assert len(out) == pytest.approx(len(tone) / factor, abs=2)
    assert _peak_hz(out) == pytest.approx(440.0 * factor, rel=0.01)


def test_speed_factor_one_returns_the_input():
    tone = _tone(440.0, 0.5)
    assert speed_perturb(tone, 1.0) is tone


@pytest.mark.parametrize("snr_db", [5.0, 15.0, 25.0])
def test_babble_sits_at_the_drawn_snr_and_keeps_length_and_peak(snr_db):
    speech, talkers = _tone(300.0, 1.0), [_tone(700.0, 0.4), _tone(1100.0, 1.7, 0.2)]
    mixed = mix_babble(speech, talkers, snr_db, np.random.default_rng(0))
    assert len(mixed) == len(speech) and mixed.dtype == np.float32
    assert np.abs(mixed).max() <= np.abs(speech).max() + 1e-6
    gain = np.dot(mixed, speech) / np.dot(speech, speech)    # the tones are orthogonal over 1 s
    noise = mixed - gain * speech
    measured = 10 * np.log10(np.mean((gain * speech) ** 2) / np.mean(noise ** 2))
    assert measured == pytest.approx(snr_db, abs=0.2)


def test_babble_without_talkers_or_with_silent_ones_leaves_the_audio():
    speech = _tone(300.0, 0.5)
    rng = np.random.default_rng(0)
    assert mix_babble(speech, [], 10.0, rng) is speech
    assert mix_babble(speech, [np.zeros(800, np.float32)], 10.0, rng) is speech


def test_perturb_batch_draws_per_utterance_repeats_per_seed_and_leaves_inputs():
    batch = [_tone(200.0 + 100 * i, 0.5 + 0.1 * i) for i in range(6)]
    copies = [a.copy() for a in batch]
    cfg = WaveAugmentConfig(speed_prob=0.5, babble_prob=0.5)
    out = perturb_batch(batch, cfg, np.random.default_rng(7))
    again = perturb_batch(batch, cfg, np.random.default_rng(7))
    assert all(np.array_equal(a, b) for a, b in zip(out, again))
    assert all(np.array_equal(a, c) for a, c in zip(batch, copies))           # inputs untouched
    changed = [not (len(o) == len(a) and np.array_equal(o, a)) for o, a in zip(out, batch)]
    assert any(changed) and not all(changed)                                  # drawn per utterance
    lengths_moved = sum(len(o) != len(a) for o, a in zip(out, batch))
    assert 0 < lengths_moved < len(batch)


def test_perturb_batch_off_and_single_utterance_batches():
    batch = [_tone(250.0, 0.5), _tone(350.0, 0.6)]
    off = WaveAugmentConfig(speed_prob=0.0, babble_prob=0.0)
    assert all(o is a for o, a in zip(perturb_batch(batch, off, np.random.default_rng(0)), batch))
    babble_only = WaveAugmentConfig(speed_prob=0.0, babble_prob=1.0)
    alone = perturb_batch(batch[:1], babble_only, np.random.default_rng(0))
    assert alone[0] is batch[0]                                               # no other talker
    both = perturb_batch(batch, babble_only, np.random.default_rng(0))
    assert all(len(o) == len(a) and not np.array_equal(o, a) for o, a in zip(both, batch))


def _marking_conditions():
    """Two stand-in conditions that mark the audio they touch (plain objects with Condition's
    `apply`), so the test reads which one an utterance got."""
    class Mark:
        def __init__(self, value):
            self.value = value

        def apply(self, audio, sample_rate, rng):
            return np.full_like(audio, self.value)
    return {"a": Mark(0.25), "b": Mark(0.75)}


def test_conditions_are_drawn_with_their_probabilities_and_at_most_one_each():
    from asr_grpo.data.augment import perturb
    cfg = WaveAugmentConfig(speed_prob=0.0, babble_prob=0.0, conditions={"a": 0.2, "b": 0.3})
    rng = np.random.default_rng(0)
    got = [float(perturb(_tone(200, 0.01), [], cfg, rng, _marking_conditions())[0]) for _ in range(4000)]
    share = {v: got.count(v) / len(got) for v in (0.25, 0.75)}
    assert share[0.25] == pytest.approx(0.2, abs=0.03) and share[0.75] == pytest.approx(0.3, abs=0.03)
    assert len(set(got)) == 3     # a, b, or the tone untouched


def test_no_condition_draws_nothing_so_older_runs_draw_what_they_drew():
    from asr_grpo.data.augment import pick_condition
    rng, twin = np.random.default_rng(5), np.random.default_rng(5)
    assert pick_condition(_marking_conditions(), {"a": 0.0}, rng) is None
    assert pick_condition(_marking_conditions(), {}, rng) is None
    assert rng.random() == twin.random()
