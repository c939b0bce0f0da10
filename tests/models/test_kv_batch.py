"""`KVBatch` extended row by row with 0, 1 or k new tokens gives, per row, the outputs one
forward pass over the whole sequence gives at the same columns; and the vectorised
`prefill` / `extend` return what the per-row loops they replaced returned, bit for bit
on most CPUs (to the last bit's rounding on some), since the forward sees the same
inputs (the next-token output they keep may differ by float rounding: only its
position goes through the LM head)."""
from __future__ import annotations

import pytest
import torch
from helpers import noise_audio

from asr_grpo.models.kv_batch import KVBatch, causal_lm_forward
from asr_grpo.models.sequences import encode_prompt, pack_sequences, positions_from_mask, response_logits


class LoopKVBatch(KVBatch):
    """The per-row `prefill` / `extend` as they were before vectorising: the oracle."""

    @torch.no_grad()
    def prefill(self, prefixes, score_last, features=None, score=None):
        from asr_grpo.models.sequences import stack_features

        width = max(len(p) for p in prefixes)
        ids = torch.full((len(prefixes), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, p in enumerate(prefixes):
            ids[i, width - len(p):] = torch.as_tensor(list(p), dtype=torch.long)
            mask[i, width - len(p):] = 1
        extra = {}
        if features is not None:
            extra["input_features"], extra["input_features_mask"] = stack_features(features)
        out, self.cache = self.forward(input_ids=ids, attention_mask=mask,
                                       position_ids=positions_from_mask(mask), cache=None, **extra)
        self.mask, self.next_pos, self.last = mask, mask.sum(dim=1), out[:, -1]
        return [out[i, width - 1 - k:width - 1] for i, k in enumerate(score_last)]

    @torch.no_grad()
    def extend(self, new_tokens, score=None, outputs=True):
        counts = [len(t) for t in new_tokens]
        steps = max(counts, default=0)
        if steps == 0:
            return [self.last[i][None][:0] for i in range(len(self))]
        rows = len(counts)
        ids = torch.full((rows, steps), self.pad_id, dtype=torch.long)
        step_mask = torch.zeros((rows, steps), dtype=torch.long)
        for i, t in enumerate(new_tokens):
            if counts[i]:
                ids[i, :counts[i]] = torch.as_tensor(list(t), dtype=torch.long)
                step_mask[i, :counts[i]] = 1
        positions = self.next_pos[:, None] + torch.arange(steps)[None, :]
        self.mask = torch.cat([self.mask, step_mask], dim=1)
        out, self.cache = self.forward(input_ids=ids, attention_mask=self.mask, position_ids=positions,
                                       cache=self.cache)
        predicting = []
        new_last = self.last.clone()
        for i, c in enumerate(counts):
            last = self.last[i][None]
            predicting.append(torch.cat([last, out[i, :c - 1]]) if c else last[:0])
            if c:
                new_last[i] = out[i, c - 1]
        self.last, self.next_pos = new_last, self.next_pos + torch.as_tensor(counts)
        return predicting


# Per round, how many new tokens each of the 5 rows gets: decode-like rounds (0/1 each),
# streaming-like chunks (k each) and both mixed.
ROUNDS = [[1, 1, 1, 1, 1], [1, 0, 1, 1, 0], [3, 0, 1, 5, 2], [0, 0, 0, 0, 0], [1, 1, 0, 1, 1],
          [4, 2, 0, 0, 6], [0, 1, 0, 0, 0]]


@pytest.fixture(scope="module")
def rows(tiny_processor, tiny_tokenizer):
    """(prompt ids, features, response) per row: audio of different lengths, responses
    long enough for every round, one prompt shared by rows 0 and 3 (a GRPO group)."""
    g = torch.Generator().manual_seed(0)
    vocab = len(tiny_tokenizer)
    prompts = [encode_prompt(tiny_processor, noise_audio(secs, j), lang)
               for j, (secs, lang) in enumerate([(1.0, "en"), (2.4, "zh"), (0.6, "en"), (1.6, "zh")])]
    owner = [0, 1, 2, 0, 3]
    total = [sum(r[i] for r in ROUNDS) + 2 for i in range(len(owner))]
    return [(*prompts[o], torch.randint(5, vocab, (n,), generator=g).tolist()) for o, n in zip(owner, total)]


def run_rounds(kv: KVBatch, rows, first: int = 2) -> tuple[list[list[torch.Tensor]], list[list[int]]]:
    """Prefill prompt + `first` tokens (scoring them), then feed ROUNDS; returns each
    call's outputs and, per row, the tokens fed so far."""
    outs = [kv.prefill_shared([p for p, _, _ in rows], [f for _, f, _ in rows],
                              [r[:first] for _, _, r in rows])]
    fed = [first] * len(rows)
    for counts in ROUNDS:
        outs.append(kv.extend([r[fed[i]:fed[i] + c] for i, ((_, _, r), c) in enumerate(zip(rows, counts))]))
        fed = [n + c for n, c in zip(fed, counts)]
    return outs, [r[:n] for (_, _, r), n in zip(rows, fed)]


def test_extend_matches_one_forward_pass(tiny_model, tiny_tokenizer, rows):
    pad = tiny_tokenizer.pad_token_id
    outs, responses = run_rounds(KVBatch(causal_lm_forward(tiny_model), pad), rows)
    batch = pack_sequences([p for p, _, _ in rows], responses, [f for _, f, _ in rows], pad)
    with torch.no_grad():
        full = response_logits(tiny_model, batch)
    for i, resp in enumerate(responses):
        streamed = torch.cat([call[i] for call in outs])
        assert streamed.shape == (len(resp), full.shape[-1])
        torch.testing.assert_close(streamed, full[i, :len(resp)], atol=2e-5, rtol=1e-4)


def test_extend_and_prefill_equal_the_per_row_loops(tiny_model, tiny_tokenizer, rows):
    pad = tiny_tokenizer.pad_token_id
    new, old = KVBatch(causal_lm_forward(tiny_model), pad), LoopKVBatch(causal_lm_forward(tiny_model), pad)
    new_outs, _ = run_rounds(new, rows)
    old_outs, _ = run_rounds(old, rows)
    for new_call, old_call in zip(new_outs, old_outs, strict=True):
        assert len(new_call) == len(old_call) == len(rows)
        for a, b in zip(new_call, old_call):
            # Bit for bit on most CPUs; some (AMD EPYC here) round the last bit of a few
            # outputs differently in the batched matmuls.
            torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    # `last` of the final round comes from a one-row LM head (only the kept position is
    # projected), whose matmul may round differently from the loop's whole-batch one.
    torch.testing.assert_close(new.last, old.last, rtol=0, atol=1e-5)
    assert torch.equal(new.mask, old.mask)
    assert torch.equal(new.next_pos, old.next_pos)


def test_prefill_scores_the_last_prefix_tokens_like_the_loop(tiny_model, tiny_tokenizer, rows):
    pad = tiny_tokenizer.pad_token_id
    prefixes = [p + r[:k] for (p, _, r), k in zip(rows, [0, 3, 1, 5, 2])]
    feats = [f for _, f, _ in rows]
    new = KVBatch(causal_lm_forward(tiny_model), pad).prefill(prefixes, [0, 3, 1, 5, 2], feats)
    old = LoopKVBatch(causal_lm_forward(tiny_model), pad).prefill(prefixes, [0, 3, 1, 5, 2], feats)
    for a, b in zip(new, old, strict=True):
        assert a.shape == b.shape and torch.equal(a, b)


def test_extend_with_no_tokens_changes_nothing_and_select_keeps_rows(tiny_model, tiny_tokenizer, rows):
    pad = tiny_tokenizer.pad_token_id
    kv = KVBatch(causal_lm_forward(tiny_model), pad)
    run_rounds(kv, rows)
    last, mask, pos = kv.last.clone(), kv.mask.clone(), kv.next_pos.clone()
    empty = kv.extend([[] for _ in rows])
    assert [tuple(e.shape) for e in empty] == [(0, last.shape[-1])] * len(rows)
    assert torch.equal(kv.last, last) and torch.equal(kv.mask, mask) and torch.equal(kv.next_pos, pos)
    kv.select([3, 1])
    assert torch.equal(kv.last, last[[3, 1]]) and torch.equal(kv.next_pos, pos[[3, 1]])
    assert len(kv) == 2


def test_shared_prefill_extends_only_rows_with_a_continuation(tiny_model, tiny_tokenizer, tiny_processor):
    # A rollout rebuild: fresh samples (no tokens yet) beside carried partial ones. The
    # continuation extend runs over one row per prompt without a continuation plus the
    # rows with one (4 here, not 6); every row's outputs still equal one forward pass.
    pad = tiny_tokenizer.pad_token_id
    g = torch.Generator().manual_seed(1)
    vocab = len(tiny_tokenizer)
    a = encode_prompt(tiny_processor, noise_audio(1.2, 0), "en")
    b = encode_prompt(tiny_processor, noise_audio(0.8, 1), "zh")
    owners, firsts = [a, a, a, a, b, b], [0, 0, 3, 0, 0, 1]
    full = [torch.randint(5, vocab, (k + 2,), generator=g).tolist() for k in firsts]
    widths = []
    forward = causal_lm_forward(tiny_model)

    def counting(**inputs):
        widths.append(inputs["input_ids"].shape[0])
        return forward(**inputs)

    kv = KVBatch(counting, pad)
    first = kv.prefill_shared([p for p, _ in owners], [f for _, f in owners],
                              [r[:k] for r, k in zip(full, firsts)])
    assert widths == [2, 4]   # the two distinct prompts, then the staged extend
    outs = [first] + [kv.extend([[r[k + j]] for r, k in zip(full, firsts)]) for j in range(2)]
    batch = pack_sequences([p for p, _ in owners], full, [f for _, f in owners], pad)
    with torch.no_grad():
        ref = response_logits(tiny_model, batch)
    for i, resp in enumerate(full):
        got = torch.cat([call[i] for call in outs])
        assert got.shape[0] == len(resp) == firsts[i] + 2
        torch.testing.assert_close(got, ref[i, :len(resp)], atol=2e-5, rtol=1e-4)
