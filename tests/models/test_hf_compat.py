"""The transformers differences bridged in `hf_compat` give the same numbers either way:
on the installed version, the fallback path (what 5.19-5.20 take) is forced and compared
with the native one."""
from __future__ import annotations

import torch

from asr_grpo.models import hf_compat
from asr_grpo.models.kv_batch import causal_lm_forward


def test_keeping_positions_without_a_mask_gives_the_masked_outputs(tiny_model, monkeypatch):
    ids = torch.tensor([[0, 0, 5, 6, 7], [3, 4, 5, 6, 8]])
    mask = (ids != 0).long()
    keep = torch.tensor([[False, False, False, True, True], [False, True, False, False, True]])
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    inputs = dict(input_ids=ids, attention_mask=mask, position_ids=positions)
    native, _ = causal_lm_forward(tiny_model)(keep=keep, **inputs)
    monkeypatch.setattr(hf_compat, "KEEP_MASK", False)
    fallback, cache = causal_lm_forward(tiny_model)(keep=keep, **inputs)
    assert native.shape == fallback.shape == (4, tiny_model.config.text_config.vocab_size)
    torch.testing.assert_close(fallback, native, rtol=1e-5, atol=1e-5)
    assert cache is not None


def test_the_index_fallback_keeps_only_the_columns_some_row_needs(monkeypatch):
    monkeypatch.setattr(hf_compat, "KEEP_MASK", False)
    keep = torch.tensor([[False, False, True], [False, False, True]])   # a left-padded prefill: last column
    kwargs, picks = hf_compat.keep_kwargs(keep)
    assert kwargs["logits_to_keep"].tolist() == [2] and picks.tolist() == [[True], [True]]
