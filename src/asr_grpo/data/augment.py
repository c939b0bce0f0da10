"""Augmentation: waveform perturbation (speed, babble) and SpecAugment masks.

Waveform perturbation is drawn anew every step, so the 13 or so SFT passes over the
corpus each hear a different version of an utterance (and RL prompts, with
trainer.wave_augment, a different version each time they are drawn):
- speed perturbation (Ko et al., 2015): the waveform resampled and played at the
  original rate, so tempo and pitch move together by the drawn factor;
- babble: other utterances of the batch summed under the utterance at a drawn SNR,
  noise that sounds like speech (the corpus itself carries only white noise);
- a named acoustic condition (`data.train_conditions`: a room, noise, a telephone line;
  `conditions.py`), at most one an utterance, each with its probability.

SpecAugment (Park et al., 2019) masks log-mel bands and frames, so the model reads a
word from its surroundings and from several bands rather than one exact pattern.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np
import torch

from asr_grpo.config.schema import SpecAugmentConfig, WaveAugmentConfig
from asr_grpo.data.acoustics import snr_scale
from asr_grpo.data.audio import resample
from asr_grpo.data.conditions import Condition


def speed_perturb(audio: np.ndarray, factor: float) -> np.ndarray:
    """`audio` played `factor` times faster (shorter, higher-pitched above 1); the factor
    is taken to 1/100: the waveform resampled from 100 to that many samples per 100."""
    return resample(audio, int(round(factor * 100)), 100)


def mix_babble(audio: np.ndarray, talkers: list[np.ndarray], snr_db: float,
               rng: np.random.Generator) -> np.ndarray:
    """`audio` with the `talkers` summed under it at `snr_db`; each talker is looped to
    the utterance's length from a random start. Peak kept at or below the original's."""
    if not talkers or audio.size == 0:
        return audio
    noise = np.zeros(len(audio), dtype=np.float64)
    for talker in talkers:
        start = int(rng.integers(len(talker)))
        noise += np.resize(np.roll(talker, -start), len(audio))
    scale = snr_scale(audio, noise, snr_db)
    if scale == 0.0:
        return audio
    mixed = audio + scale * noise
    peak, mixed_peak = float(np.abs(audio).max()), float(np.abs(mixed).max())
    return (mixed * min(1.0, peak / mixed_peak)).astype(np.float32)


def used_conditions(cfg: WaveAugmentConfig) -> list[str]:
    """The condition names `cfg` can draw (a positive probability)."""
    return [name for name, p in cfg.conditions.items() if p > 0]


def pick_condition(conditions: Mapping[str, Condition], probs: Mapping[str, float],
                   rng: np.random.Generator) -> Condition | None:
    """One of `conditions` with its probability in `probs` (they sum to at most 1), or None.
    Draws nothing when no probability is positive, so runs without conditions draw what
    they always drew."""
    if not any(p > 0 for p in probs.values()):
        return None
    u, edge = float(rng.random()), 0.0
    for name, p in probs.items():
        edge += p
        if u < edge:
            return conditions[name]
    return None


def perturb(audio: np.ndarray, others: list[np.ndarray], cfg: WaveAugmentConfig,
            rng: np.random.Generator, conditions: Mapping[str, Condition] | None = None,
            sample_rate: int = 16000) -> np.ndarray:
    """One utterance, speed-perturbed with probability `cfg.speed_prob`, mixed with
    1..`cfg.babble_talkers` of `others` with probability `cfg.babble_prob`, then put under
    one of `conditions` (built from `cfg.conditions`' names) with its probability there.
    The input is not modified."""
    if cfg.speed_prob > 0 and rng.random() < cfg.speed_prob:
        audio = speed_perturb(audio, float(rng.uniform(cfg.speed_min, cfg.speed_max)))
    if others and cfg.babble_prob > 0 and rng.random() < cfg.babble_prob:
        count = int(rng.integers(1, min(cfg.babble_talkers, len(others)) + 1))
        picks = rng.choice(len(others), size=count, replace=False)
        audio = mix_babble(audio, [others[j] for j in picks],
                           float(rng.uniform(cfg.babble_snr_db_min, cfg.babble_snr_db_max)), rng)
    if conditions and (condition := pick_condition(conditions, cfg.conditions, rng)) is not None:
        audio = condition.apply(audio, sample_rate, rng)
    return audio


def perturb_batch(audios: list[np.ndarray], cfg: WaveAugmentConfig, rng: np.random.Generator,
                  conditions: Mapping[str, Condition] | None = None,
                  sample_rate: int = 16000) -> list[np.ndarray]:
    """Each utterance of a batch perturbed (`perturb`) with the other utterances of the
    batch, as they were loaded, as its babble."""
    return [perturb(audio, audios[:i] + audios[i + 1:], cfg, rng, conditions, sample_rate)
            for i, audio in enumerate(audios)]


def spec_augment(features: torch.Tensor, frame_mask: torch.Tensor, cfg: SpecAugmentConfig,
                 generator: torch.Generator) -> torch.Tensor:
    """`features` [B, mels, T] with masks drawn per utterance inside its valid frames
    (`frame_mask` [B, T], 1 = real audio). Masked cells take the utterance's mean, so
    padding and masking never look alike. Returns a new tensor."""
    if not cfg.enabled:
        return features
    out = features.clone()
    n_mels = features.shape[1]
    lengths = frame_mask.sum(dim=1).tolist()
    for b, length in enumerate(int(n) for n in lengths):
        if length == 0:
            continue
        fill = out[b, :, :length].mean()
        for _ in range(cfg.freq_masks):
            width = int(torch.randint(0, cfg.freq_width + 1, (), generator=generator))
            start = int(torch.randint(0, n_mels - width + 1, (), generator=generator))
            out[b, start:start + width, :length] = fill
        max_time = int(cfg.time_width_frac * length)
        for _ in range(cfg.time_masks):
            width = int(torch.randint(0, max_time + 1, (), generator=generator))
            start = int(torch.randint(0, length - width + 1, (), generator=generator))
            out[b, :, start:start + width] = fill
    return out
