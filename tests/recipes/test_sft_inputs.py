"""SFT input corruption (`sft.input_token_dropout`) and the conv stack's memory format:
what they change and what they must leave alone."""
from __future__ import annotations

import torch

from asr_grpo.models import IGNORE_INDEX
from asr_grpo.recipes.sft import corrupt_transcript_inputs, set_frontend_memory_format


def _batch(rows: int = 64, prompt: int = 6, text: int = 20) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    prompt_ids = torch.full((rows, prompt), 900)                     # audio placeholders and tags
    text_ids = torch.randint(10, 300, (rows, text), generator=g)
    ids = torch.cat([prompt_ids, text_ids], dim=1)
    labels = torch.cat([torch.full((rows, prompt), IGNORE_INDEX), text_ids], dim=1)
    return ids, labels


def test_corruption_touches_only_transcript_positions_at_the_rate_with_batch_tokens():
    ids, labels = _batch()
    out = corrupt_transcript_inputs(ids, labels, 0.25, torch.Generator().manual_seed(0))
    changed = out != ids
    assert not changed[labels == IGNORE_INDEX].any()                  # prompt and audio stay
    rate = changed[labels != IGNORE_INDEX].float().mean().item()
    # A replacement can draw the same token again (p = 1/290 here), so the rate is just under 0.25.
    assert 0.21 < rate < 0.27, rate
    assert set(out[changed].tolist()) <= set(ids[labels != IGNORE_INDEX].tolist())
    assert torch.equal(labels, _batch()[1])                           # the targets are not corrupted


def test_no_corruption_at_rate_zero_and_same_corruption_for_the_same_seed():
    ids, labels = _batch()
    assert corrupt_transcript_inputs(ids, labels, 0.0, torch.Generator().manual_seed(0)) is ids
    a = corrupt_transcript_inputs(ids, labels, 0.3, torch.Generator().manual_seed(7))
    b = corrupt_transcript_inputs(ids, labels, 0.3, torch.Generator().manual_seed(7))
    assert torch.equal(a, b) and not torch.equal(a, ids)


def test_channels_last_frontend_gives_the_same_encoder_output_and_saves_contiguous(tiny_model):
    model = tiny_model
    enc = model.model.audio_tower
    x = torch.randn(2, 128, 200)
    mask = torch.ones(2, 200, dtype=torch.long)
    with torch.no_grad():
        before = enc(x, mask).last_hidden_state
        set_frontend_memory_format(model, torch.channels_last)
        assert enc.conv2d2.weight.is_contiguous(memory_format=torch.channels_last)
        after = enc(x, mask).last_hidden_state
        set_frontend_memory_format(model, torch.contiguous_format)
    torch.testing.assert_close(after, before, rtol=1e-4, atol=1e-5)
    assert all(p.is_contiguous() for p in model.parameters())


WAVE_OFF = ("sft.wave_augment.speed_prob=0", "sft.wave_augment.babble_prob=0")


def _sft_losses(root, *overrides: str) -> list[float]:
    """The SFT loss of one batch of 4, computed twice with the recipe's own draws."""
    from helpers import compose_cfg

    from asr_grpo.recipes.sft import SFTRecipe

    recipe = SFTRecipe(compose_cfg(root, *overrides))
    recipe.setup()
    items = [recipe._item(i) for i in range(4)]
    with torch.no_grad():
        return [recipe._loss(items)[0].item() for _ in range(2)]


def test_spec_augment_reaches_the_sft_loss_only_when_enabled(root):
    plain = _sft_losses(root, *WAVE_OFF, "sft.spec_augment.enabled=false")
    masked = _sft_losses(root, *WAVE_OFF, "sft.spec_augment.enabled=true", "sft.spec_augment.freq_width=60")
    assert plain[0] == plain[1]                     # no randomness without masks
    assert masked[0] != masked[1]                   # fresh masks on every call
    assert all(m != plain[0] for m in masked)       # the masks reach the encoder


def test_wave_augment_reaches_the_sft_loss_and_repeats_for_the_same_seed(root):
    plain = _sft_losses(root, *WAVE_OFF)
    for knob in ("speed_prob=1", "babble_prob=1", "conditions.phone=1"):
        perturbed = _sft_losses(root, *WAVE_OFF, f"sft.wave_augment.{knob}")
        assert perturbed[0] != perturbed[1]          # drawn anew every step
        assert all(p != plain[0] for p in perturbed), knob
        assert _sft_losses(root, *WAVE_OFF, f"sft.wave_augment.{knob}") == perturbed   # seeded


def test_conditions_start_at_sft_conditions_from_step(root):
    """Before sft.conditions_from_step the loss is the clean loss (no condition drawn),
    from that step on the condition reaches it."""
    from helpers import compose_cfg

    from asr_grpo.recipes.sft import SFTRecipe

    plain = _sft_losses(root, *WAVE_OFF)
    recipe = SFTRecipe(compose_cfg(root, *WAVE_OFF, "sft.wave_augment.conditions.phone=1",
                                   "sft.conditions_from_step=3"))
    recipe.setup()
    items = [recipe._item(i) for i in range(4)]
    with torch.no_grad():
        before = [recipe._loss(items, step=s)[0].item() for s in (0, 2)]
        after = recipe._loss(items, step=3)[0].item()
    assert before == [plain[0], plain[0]]
    assert after != plain[0]
