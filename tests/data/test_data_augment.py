"""SpecAugment masks: where they fall, how wide, and what they leave alone."""
from __future__ import annotations

import torch

from asr_grpo.config.schema import SpecAugmentConfig
from asr_grpo.data.augment import spec_augment

CFG = SpecAugmentConfig(enabled=True, freq_masks=2, freq_width=20, time_masks=2, time_width_frac=0.1)


def _batch(lengths=(300, 120, 0), mels=128, frames=300):
    g = torch.Generator().manual_seed(0)
    feats = torch.randn(len(lengths), mels, frames, generator=g)
    mask = torch.zeros(len(lengths), frames, dtype=torch.long)
    for b, n in enumerate(lengths):
        mask[b, :n] = 1
    return feats, mask


def test_masks_stay_inside_real_frames_and_within_their_widths():
    feats, mask = _batch()
    for seed in range(20):
        out = spec_augment(feats, mask, CFG, torch.Generator().manual_seed(seed))
        changed = out != feats
        assert not changed[mask.unsqueeze(1).expand_as(changed) == 0].any()  # padding untouched
        assert torch.equal(out[2], feats[2])                                 # empty row untouched
        for b, n in enumerate((300, 120)):
            fill = feats[b, :, :n].mean()
            assert torch.allclose(out[b][changed[b]], fill.expand(int(changed[b].sum())))
            masked_bins = changed[b].all(dim=1).sum().item()
            masked_frames = changed[b].all(dim=0).sum().item()
            assert masked_bins <= CFG.freq_masks * CFG.freq_width
            assert masked_frames <= CFG.time_masks * int(CFG.time_width_frac * n)


def test_masks_are_drawn_per_utterance_and_repeat_for_the_same_seed():
    feats, mask = _batch(lengths=(300, 300))
    out = spec_augment(feats, mask, CFG, torch.Generator().manual_seed(3))
    again = spec_augment(feats, mask, CFG, torch.Generator().manual_seed(3))
    assert torch.equal(out, again)
    assert not torch.equal(out[0] != feats[0], out[1] != feats[1])          # not one mask for all
    total_masked = sum((spec_augment(feats, mask, CFG, torch.Generator().manual_seed(s)) != feats).any()
                       for s in range(10))
    assert total_masked == 10


def test_disabled_returns_the_features_unchanged():
    feats, mask = _batch()
    off = SpecAugmentConfig(enabled=False)
    assert spec_augment(feats, mask, off, torch.Generator().manual_seed(0)) is feats
