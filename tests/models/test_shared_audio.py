"""A training batch encodes each distinct utterance once (the samples of a group share
their features object) and runs each distinct prompt through the LM once, and gives the
same logits, values and gradients as encoding and running every row on its own."""
from __future__ import annotations

import copy

import pytest
import torch
from helpers import noise_audio

from asr_grpo.models.critic import ValueModel, response_values
from asr_grpo.models.sequences import distinct, encode_prompt, pack_sequences, response_logits


def test_distinct_keeps_first_positions_and_maps_every_key():
    first, index = distinct(["a", "b", "a", "c", "b"])
    assert first == [0, 1, 3] and index == [0, 1, 0, 2, 1]


@pytest.fixture(scope="module")
def batch(tiny_processor, tiny_tokenizer):
    """Two utterances of different lengths, three samples each sharing one features object,
    then a fourth row with its own copy of the first utterance's features (same audio,
    another object: encoded separately), rows interleaved across the groups."""
    g = torch.Generator().manual_seed(5)
    audio_id = tiny_tokenizer.convert_tokens_to_ids(tiny_tokenizer.audio_token)
    special = set(tiny_tokenizer.all_special_ids) | {audio_id}
    ordinary = torch.tensor([t for t in range(len(tiny_tokenizer)) if t not in special])
    utts = [encode_prompt(tiny_processor, noise_audio(secs, j), lang) for j, (secs, lang) in
            enumerate([(1.3, "en"), (2.1, "zh")])]
    rows = [utts[0], utts[1], utts[0], utts[1], utts[1], utts[0], (utts[0][0], copy.deepcopy(utts[0][1]))]
    responses = [ordinary[torch.randint(len(ordinary), (n,), generator=g)].tolist()
                 for n in (5, 0, 8, 3, 6, 1, 4)]
    return pack_sequences([p for p, _ in rows], responses, [f for _, f in rows], tiny_tokenizer.pad_token_id)


def counted(module, fn, count) -> tuple[int, object]:
    """The sum of `count(forward kwargs)` over `module`'s calls while `fn` ran, and its result."""
    seen = []
    handle = module.register_forward_pre_hook(lambda _m, args, kwargs: seen.append(count(kwargs)),
                                              with_kwargs=True)
    try:
        out = fn()
    finally:
        handle.remove()
    return sum(seen), out


def encoded_utterances(model, fn) -> tuple[int, object]:
    """How many utterances went through the audio encoder while `fn` ran, and its result."""
    return counted(model, fn, lambda kwargs: kwargs["input_features"].shape[0])


def grads_after(model, out: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    weights = torch.linspace(-1, 1, out.numel()).reshape(out.shape)   # a loss that weighs every output
    (out * weights * mask.reshape(mask.shape + (1,) * (out.dim() - 2))).sum().backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def close(a: torch.Tensor, b: torch.Tensor, name: str) -> None:
    """Equal up to float rounding relative to the tensor's scale (the copies' gradients are
    summed in another order; a gradient that is zero in exact arithmetic, as a key bias's, is noise)."""
    torch.testing.assert_close(a, b, rtol=0, atol=1e-4 * float(b.abs().max()) + 1e-7,
                               msg=lambda m: f"{name}: {m}")


def test_policy_logits_and_gradients_equal_per_row_encoding(tiny_model, batch):
    model = copy.deepcopy(tiny_model)
    assert batch.audio_rows == ([0, 1, 6], [0, 1, 0, 1, 1, 0, 2])
    n_shared, shared = encoded_utterances(model.model.audio_tower, lambda: response_logits(model, batch))
    n_rows, per_row = encoded_utterances(model.model.audio_tower,
                                         lambda: response_logits(model, batch, share_audio=False,
                                                                 share_prompt=False))
    assert (n_shared, n_rows) == (3, 7)
    mask = batch.response_mask
    torch.testing.assert_close(shared * mask[..., None], per_row * mask[..., None], rtol=0, atol=1e-5)
    g_shared, g_rows = grads_after(model, shared, mask), grads_after(model, per_row, mask)
    assert set(g_shared) == set(g_rows)
    assert any("multi_modal_projector" in n for n in g_shared)   # the adapter trains through the copies
    assert any("audio_tower" in n for n in g_shared)             # and the encoder, when it is not frozen
    for name in g_rows:
        close(g_shared[name], g_rows[name], name)


def test_critic_values_and_gradients_equal_per_row_encoding(tiny_model, batch):
    vm = ValueModel(copy.deepcopy(tiny_model).model, tiny_model.config.text_config.hidden_size)
    torch.nn.init.normal_(vm.value_head.weight, std=0.1)   # a zero head would hide the backbone's gradients
    n_shared, shared = encoded_utterances(vm.backbone.audio_tower, lambda: response_values(vm, batch))
    plain = copy.copy(batch)
    plain.audio_rows = None   # every row its own audio
    n_rows, per_row = encoded_utterances(vm.backbone.audio_tower, lambda: response_values(vm, plain))
    assert (n_shared, n_rows) == (3, 7)
    torch.testing.assert_close(shared, per_row, rtol=0, atol=1e-5)
    g_shared = grads_after(vm, shared, batch.response_mask)
    g_rows = grads_after(vm, per_row, batch.response_mask)
    assert set(g_shared) == set(g_rows) and any("multi_modal_projector" in n for n in g_shared)
    for name in g_rows:
        close(g_shared[name], g_rows[name], name)


def test_rows_with_their_own_audio_use_the_plain_inputs(tiny_model, tiny_processor, tiny_tokenizer):
    utts = [encode_prompt(tiny_processor, noise_audio(1.0, j), "en") for j in range(2)]
    batch = pack_sequences([p for p, _ in utts], [[5], [6, 7]], [f for _, f in utts],
                           tiny_tokenizer.pad_token_id)
    assert batch.shared_audio_inputs(tiny_model).keys() == batch.model_inputs().keys()


def lm_tokens(model, fn) -> tuple[int, object]:
    """How many token positions went through the language model while `fn` ran, and its result."""
    return counted(model.model.language_model, fn, lambda kwargs: kwargs["inputs_embeds"].shape[:2].numel())


def test_shared_prompt_runs_each_prompt_once_with_equal_logits_and_gradients(tiny_model, batch):
    model = copy.deepcopy(tiny_model)
    P, T, B = batch.prompt_width, batch.response_ids.shape[1], batch.input_ids.shape[0]
    assert batch.prompt_rows == ([0, 1, 6], [0, 1, 0, 1, 1, 0, 2])
    n_shared, shared = lm_tokens(model, lambda: response_logits(model, batch))
    n_rows, per_row = lm_tokens(model, lambda: response_logits(model, batch, share_prompt=False))
    assert (n_shared, n_rows) == (3 * P + B * (T - 1), B * (P + T))
    mask = batch.response_mask
    torch.testing.assert_close(shared * mask[..., None], per_row * mask[..., None], rtol=0, atol=1e-5)
    g_shared, g_rows = grads_after(model, shared, mask), grads_after(model, per_row, mask)
    assert set(g_shared) == set(g_rows)
    assert any("language_model.layers" in n for n in g_shared)   # the LM trains through the copied cache
    for name in g_rows:
        close(g_shared[name], g_rows[name], name)


def test_shared_prompt_with_one_token_responses(tiny_model, tiny_processor, tiny_tokenizer):
    """Every response one token long: the prompt pass alone predicts them."""
    utt = encode_prompt(tiny_processor, noise_audio(1.1, 3), "en")
    a, b = tiny_tokenizer.encode("the cat", add_special_tokens=False)[:2]
    batch = pack_sequences([utt[0]] * 3, [[a], [b], []], [utt[1]] * 3, tiny_tokenizer.pad_token_id)
    n_shared, shared = lm_tokens(tiny_model, lambda: response_logits(tiny_model, batch))
    per_row = response_logits(tiny_model, batch, share_prompt=False)
    assert n_shared == batch.prompt_width and shared.shape == per_row.shape == (3, 1, shared.shape[-1])
    torch.testing.assert_close(shared, per_row, rtol=0, atol=1e-5)


def test_gradient_checkpointing_runs_every_row_whole(tiny_model, batch):
    """transformers drops the KV cache under gradient checkpointing, so the prompt cannot be shared there."""
    from asr_grpo.models.hf_compat import enable_checkpointing

    model = copy.deepcopy(tiny_model)
    enable_checkpointing(model, use_reentrant=False)
    model.train()
    n, _ = lm_tokens(model, lambda: response_logits(model, batch))
    assert n == batch.input_ids.numel()


def test_micro_batches_by_group_keep_each_group_together():
    from types import SimpleNamespace

    import numpy as np

    from asr_grpo.workers.training import micro_batches

    # interleaved groups
    items = [SimpleNamespace(uid=f"{g}#{k}", group=str(g)) for k in range(4) for g in range(6)]
    batches = micro_batches(items, 8, np.random.default_rng(1), by_group=True)
    assert [len(b) for b in batches] == [8, 8, 8]
    assert all(len({it.group for it in b}) == 2 for b in batches)
    assert sorted(it.uid for b in batches for it in b) == sorted(it.uid for it in items)
    orders = {tuple(it.group for b in micro_batches(items, 8, np.random.default_rng(s), by_group=True)
                    for it in b)
              for s in range(5)}
    assert len(orders) > 1   # the groups are shuffled
    shuffled = micro_batches(items, 8, np.random.default_rng(1))
    assert sorted(it.uid for b in shuffled for it in b) == sorted(it.uid for it in items)
