"""Only the logits that are used are computed: a prefill projects no prompt position onto
the vocabulary but the last, scoring projects only the positions that predict response
tokens and brings back one float a token, a rollout's extend projects one position a
row; and every result equals a plain full forward of the model within float rounding."""
from __future__ import annotations

import contextlib

import pytest
import torch
from helpers import noise_audio

from asr_grpo.models.critic import ValueModel, value_forward
from asr_grpo.models.hf_compat import KEEP_MASK
from asr_grpo.models.kv_batch import KVBatch, causal_lm_forward
from asr_grpo.models.sequences import encode_prompt, pack_sequences, response_logits, response_logprobs
from asr_grpo.models.streaming import identity_score, score_once, token_logprobs

TEMPERATURE = 0.8


@pytest.fixture(scope="module")
def groups(tiny_processor, tiny_tokenizer):
    """(uid, prompt ids, features, response): 3 prompts of different lengths, 2 samples each
    (one features object per prompt, as a GRPO group has), responses of 0..9 ordinary tokens."""
    g = torch.Generator().manual_seed(3)
    audio_id = tiny_tokenizer.convert_tokens_to_ids(tiny_tokenizer.audio_token)
    special = set(tiny_tokenizer.all_special_ids) | {audio_id}
    ordinary = torch.tensor([t for t in range(len(tiny_tokenizer)) if t not in special])
    out = []
    for j, (secs, lang) in enumerate([(1.0, "en"), (2.2, "zh"), (0.6, "en")]):
        prompt, feats = encode_prompt(tiny_processor, noise_audio(secs, j), lang)
        for k in range(2):
            n = [7, 0, 9, 3, 1, 5][2 * j + k]
            response = ordinary[torch.randint(len(ordinary), (n,), generator=g)].tolist()
            out.append((f"u{j}#{k}", prompt, feats, response))
    return out


@contextlib.contextmanager
def rows_through(module: torch.nn.Module):
    """Records, per call of `module`, its output's leading shape (the positions it saw)."""
    shapes: list[tuple[int, ...]] = []
    handle = module.register_forward_hook(lambda _m, _i, out: shapes.append(tuple(out.shape[:-1])))
    try:
        yield shapes
    finally:
        handle.remove()


def positions(shapes) -> int:
    return sum(int(torch.tensor(s).prod()) for s in shapes)


def full_forward(model, prompts, features, responses, pad_id):
    """The plain forward over the whole sequences: logits at every position [B, P + T, V]."""
    batch = pack_sequences(prompts, responses, features, pad_id)
    with torch.no_grad():
        return model(**batch.model_inputs(), use_cache=False).logits, batch


# Exact counts need `logits_to_keep` masks (transformers >= 5.21); before, the fallback
# projects every column some row needs, for every row (same results: tests/models/test_hf_compat.py).
needs_keep_mask = pytest.mark.skipif(not KEEP_MASK, reason="transformers < 5.21: no position masks")


@needs_keep_mask
def test_prefill_projects_only_the_next_token_position(tiny_model, tiny_tokenizer, groups):
    pad = tiny_tokenizer.pad_token_id
    prompts, feats = [s[1] for s in groups], [s[2] for s in groups]
    kv = KVBatch(causal_lm_forward(tiny_model), pad)
    with rows_through(tiny_model.lm_head) as shapes:
        out = kv.prefill_shared(prompts, feats, [[] for _ in groups])
    # 3 distinct prompts prefilled once each, one position each: no prompt position.
    assert shapes == [(3,)]
    assert [tuple(o.shape) for o in out] == [(0, len(tiny_tokenizer))] * len(groups)
    full, batch = full_forward(tiny_model, prompts, feats, [[] for _ in groups], pad)
    assert kv.last.shape == (len(groups), len(tiny_tokenizer))
    # The next-token logits equal the full forward's at each prompt's last column.
    torch.testing.assert_close(kv.last, full[:, batch.prompt_width - 1], atol=2e-5, rtol=1e-5)


@needs_keep_mask
def test_prefill_scoring_a_resumed_tail_projects_only_that_tail(tiny_model, tiny_tokenizer, groups):
    pad = tiny_tokenizer.pad_token_id
    k = [3, 0, 2, 1, 0, 4]
    prefixes = [s[1] + s[3][:n] for s, n in zip(groups, k)]
    kv = KVBatch(causal_lm_forward(tiny_model), pad)
    with rows_through(tiny_model.lm_head) as shapes:
        out = kv.prefill(prefixes, k, [s[2] for s in groups])
    assert positions(shapes) == sum(k) + len(groups)
    full, batch = full_forward(tiny_model, [s[1] for s in groups], [s[2] for s in groups],
                               [s[3][:n] for s, n in zip(groups, k)], pad)
    P = batch.prompt_width
    for i, n in enumerate(k):
        torch.testing.assert_close(out[i], full[i, P - 1:P - 1 + n], atol=2e-5, rtol=1e-5)
        torch.testing.assert_close(kv.last[i], full[i, P - 1 + n], atol=2e-5, rtol=1e-5)


@needs_keep_mask
def test_rollout_extend_projects_one_position_a_row(tiny_model, tiny_tokenizer, groups):
    pad = tiny_tokenizer.pad_token_id
    a, b, c, d = groups[0][3][:4]   # ordinary tokens
    step = [[a], [], [b], [c], [], [d]]
    kv = KVBatch(causal_lm_forward(tiny_model), pad)
    with rows_through(tiny_model.lm_head) as shapes:
        assert kv.prefill_shared([s[1] for s in groups], [s[2] for s in groups], [s[3] for s in groups],
                                 outputs=False) is None
        assert kv.extend(step, outputs=False) is None
    # prefill: 3 prompts, 1 position each; continuations: the 5 non-empty rows' last
    # token only; the decode step: its 4 rows.
    assert [positions([s]) for s in shapes] == [3, 5, 4]
    responses = [s[3] + t for s, t in zip(groups, step)]
    full, batch = full_forward(tiny_model, [s[1] for s in groups], [s[2] for s in groups], responses, pad)
    P = batch.prompt_width
    for i, r in enumerate(responses):
        torch.testing.assert_close(kv.last[i], full[i, P - 1 + len(r)], atol=2e-5, rtol=1e-5)


@needs_keep_mask
def test_scored_logprobs_equal_the_full_forward_and_only_they_come_back(tiny_model, tiny_tokenizer, groups):
    pad = tiny_tokenizer.pad_token_id
    uids, prompts, feats, responses = ([s[i] for s in groups] for i in range(4))
    with rows_through(tiny_model.lm_head) as shapes:
        got = score_once(lambda: causal_lm_forward(tiny_model), pad, token_logprobs(TEMPERATURE), uids,
                         prompts, feats, responses)
    # 3 prompts' next-token positions, then one per response token: never a prompt position.
    assert positions(shapes) == 3 + sum(len(r) for r in responses)
    full, batch = full_forward(tiny_model, prompts, feats, responses, pad)
    P = batch.prompt_width
    want = torch.log_softmax(full[:, P - 1:-1] / TEMPERATURE, dim=-1).gather(
        -1, batch.response_ids[..., None]).squeeze(-1)
    for i, r in enumerate(responses):
        assert got[i].shape == (len(r),) and got[i].dtype == torch.float32   # one float a token
        torch.testing.assert_close(got[i], want[i, :len(r)], atol=2e-5, rtol=1e-5)


def test_response_logits_project_only_response_positions(tiny_model, tiny_tokenizer, groups):
    pad = tiny_tokenizer.pad_token_id
    prompts, feats, responses = [s[1] for s in groups], [s[2] for s in groups], [s[3] for s in groups]
    full, batch = full_forward(tiny_model, prompts, feats, responses, pad)
    T = batch.response_ids.shape[1]
    with rows_through(tiny_model.lm_head) as shapes, torch.no_grad():
        whole = response_logits(tiny_model, batch, share_prompt=False)
        logits = response_logits(tiny_model, batch)
        logp = response_logprobs(tiny_model, batch, TEMPERATURE)
    # Not P + T positions a row: T each run whole; sharing a prompt, its last position
    # once (3 distinct prompts) and the rows' T - 1 response positions.
    assert shapes[0] == (len(groups), T)
    assert positions(shapes[1:3]) == positions(shapes[3:]) == 3 + len(groups) * (T - 1)
    for got in (whole, logits):
        torch.testing.assert_close(got, full[:, batch.prompt_width - 1:-1], atol=2e-5, rtol=1e-5)
    want = torch.log_softmax(full[:, batch.prompt_width - 1:-1] / TEMPERATURE, -1).gather(
        -1, batch.response_ids[..., None]).squeeze(-1) * batch.response_mask
    assert logp.shape == (len(groups), T)
    torch.testing.assert_close(logp, want, atol=2e-5, rtol=1e-5)


def test_value_forward_keeps_only_the_scored_positions(tiny_model, tiny_tokenizer, groups):
    vm = ValueModel(tiny_model.model, tiny_model.config.text_config.hidden_size).eval()
    torch.nn.init.normal_(vm.value_head.weight, std=0.5)
    pad = tiny_tokenizer.pad_token_id
    uids, prompts, feats, responses = ([s[i] for s in groups] for i in range(4))
    with rows_through(vm.value_head) as shapes:
        got = score_once(lambda: value_forward(vm), pad, identity_score, uids, prompts, feats, responses)
    assert positions(shapes) == 3 + sum(len(r) for r in responses)
    batch = pack_sequences(prompts, responses, feats, pad)
    with torch.no_grad():
        full = vm(**batch.model_inputs())[:, batch.prompt_width - 1:-1]
    for i, r in enumerate(responses):
        torch.testing.assert_close(got[i], full[i, :len(r)], atol=2e-5, rtol=1e-5)


def test_a_bf16_model_takes_fp32_features_and_scores_in_fp32(tiny_model, tiny_tokenizer, groups):
    """A bf16 model (DeepSpeed's bf16 mode casts the weights) gets its audio features cast
    to bf16 on the way in; its scores come back as fp32, close to the fp32 model's."""
    import copy

    bf16 = copy.deepcopy(tiny_model).to(torch.bfloat16)
    pad = tiny_tokenizer.pad_token_id
    uids, prompts, feats, responses = ([s[i] for s in groups] for i in range(4))
    args = (pad, token_logprobs(TEMPERATURE), uids, prompts, feats, responses)
    got = score_once(lambda: causal_lm_forward(bf16), *args)
    ref = score_once(lambda: causal_lm_forward(tiny_model), *args)
    for a, b in zip(got, ref):
        assert a.dtype == torch.float32
        torch.testing.assert_close(a, b, atol=0.1, rtol=0.05)
