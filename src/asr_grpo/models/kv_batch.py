"""A batch of sequences held in one KV cache and extended in place.

The rollout engine (one token per row per call) and the streaming scorers (a chunk of
tokens per row per call) share this: rows are left-padded prefixes; each `extend` feeds
every row its own new tokens, shorter rows padded and masked, so the cache may hold
masked holes that the attention mask hides. What comes back per row are the outputs
that *predict* the new tokens (the last output kept from the previous call, then the
outputs at all but the last new token), which is exactly what one forward pass over
the whole sequence gives at the same columns.

Only the outputs that are used are computed: the forward is told which positions to
keep (`logits_to_keep`), so a prefill projects no prompt position onto the vocabulary
but the last, and outputs stay on the model's device. With a `score` function the
per-token scores (log-probs of the new tokens, say) are computed there too, for the
whole batch at once, and only they (one float a token) come back to the CPU, never
full-vocabulary logits. (The CPU tests check which positions are computed and the
results; the device moves themselves are no-ops there and only run on a GPU.)
"""
from __future__ import annotations

from itertools import chain
from typing import Callable, Sequence

import torch

from asr_grpo.models.hf_compat import keep_kwargs, output_cache, pick_kept, with_cache
from asr_grpo.models.sequences import (
    AudioFeatures,
    distinct,
    on_model_device,
    positions_from_mask,
    stack_features,
)

# forward(input_ids, attention_mask, position_ids, cache, keep, [input_features, input_features_mask])
#   -> (outputs, cache): with keep=None the per-position outputs [B, L, ...]; with `keep` a
#   bool [B, L] mask, only the kept positions' outputs, packed row by row [n_kept, ...].
#   Outputs stay on the model's device.
ForwardFn = Callable[..., tuple[torch.Tensor, object]]
# (outputs predicting some tokens [m, ...], those tokens [m]) -> per-token scores [m]
ScoreFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def causal_lm_forward(model) -> ForwardFn:
    """Logits of a (speech) causal LM, with its KV cache; only the kept positions go
    through the LM head (`logits_to_keep`; see `hf_compat.keep_kwargs`)."""
    def forward(cache=None, keep=None, **inputs):
        picks = None
        if keep is not None:
            extra, picks = keep_kwargs(keep)
            inputs.update(extra)
        out = model(**with_cache(on_model_device(model, inputs), cache), use_cache=True)
        return pick_kept(out.logits, picks), output_cache(out)
    return forward


class KVBatch:
    def __init__(self, forward: ForwardFn, pad_id: int):
        self.forward, self.pad_id = forward, pad_id
        self.cache = None
        self.mask: torch.Tensor | None = None       # [B, L] 1 = real token (CPU)
        self.next_pos: torch.Tensor | None = None   # [B] position of each row's next token (CPU)
        # [B, ...] output predicting each row's next token (model device)
        self.last: torch.Tensor | None = None

    def __len__(self) -> int:
        return 0 if self.mask is None else self.mask.shape[0]

    @torch.no_grad()
    def prefill(self, prefixes: Sequence[Sequence[int]], score_last: Sequence[int],
                features: Sequence[AudioFeatures] | None = None,
                score: ScoreFn | None = None) -> list[torch.Tensor]:
        """Start the batch from left-padded prefixes; returns, per row, the outputs that
        predict its last `score_last[i]` prefix tokens (a resumed partial response), or
        with `score` their per-token scores (on the CPU)."""
        lengths = torch.as_tensor([len(p) for p in prefixes], dtype=torch.long)
        width = int(lengths.max())
        real = torch.arange(width)[None, :] >= width - lengths[:, None]
        ids, mask = _scatter_rows(prefixes, real, self.pad_id), real.long()
        extra = {}
        if features is not None:
            extra["input_features"], extra["input_features_mask"] = stack_features(features)
        # Row i's outputs at columns width-1-k .. width-2 predict its last k prefix tokens;
        # column width-1 predicts its next token. No other column is computed.
        k = torch.as_tensor(list(score_last), dtype=torch.long)
        keep = torch.arange(width)[None, :] >= width - 1 - k[:, None]
        out, self.cache = self.forward(input_ids=ids, attention_mask=mask,
                                       position_ids=positions_from_mask(mask), cache=None, keep=keep, **extra)
        # `out` holds row by row its k_i scored outputs, then its next-token output.
        ends = torch.cumsum(k + 1, 0) - 1
        scored = torch.ones(len(out), dtype=torch.bool)
        scored[ends] = False
        self.mask, self.next_pos, self.last = mask, lengths, out[ends.to(out.device)]
        tokens = [p[len(p) - n:] if n else [] for p, n in zip(prefixes, k.tolist())]
        return _per_row(out[scored.to(out.device)], k.tolist(), tokens, score)

    @torch.no_grad()
    def prefill_shared(self, prompts: Sequence[Sequence[int]],
                       features: Sequence[AudioFeatures | None] | None,
                       continuations: Sequence[Sequence[int]], score: ScoreFn | None = None,
                       outputs: bool = True) -> list[torch.Tensor] | None:
        """Start the batch from prompt + continuation per row, prefilling each distinct
        prompt (same tokens, same features object) once: the n samples of a GRPO group
        share their audio prompt, so the audio encoder and the prompt prefill run once
        per group instead of n times. The shared cache is copied to every row, then each
        row is extended by its own continuation (a partial response, often empty).
        Returns what `extend` returns for the continuations; equal to prefilling every
        row whole, up to float rounding."""
        # The first row of each distinct (features object, prompt); each row's prefilled row.
        unique, index = distinct([(id(features[i]) if features else None, tuple(p))
                                  for i, p in enumerate(prompts)])
        self.prefill([prompts[i] for i in unique], [0] * len(unique),
                     [features[i] for i in unique] if features else None)
        # The extend pads every row to the longest continuation, so rows without one
        # (fresh samples beside carried partial ones) share their prompt's row through
        # it and fan out after: the extend costs rows with a continuation, not all rows.
        staged, row_of, plain = [], [], {}
        for i, u in enumerate(index):
            if continuations[i] or u not in plain:
                if not continuations[i]:
                    plain[u] = len(staged)
                row_of.append(len(staged))
                staged.append(i)
            else:
                row_of.append(plain[u])
        if [index[i] for i in staged] != list(range(len(unique))):
            self.select([index[i] for i in staged])
        out = self.extend([continuations[i] for i in staged], score, outputs)
        if row_of != list(range(len(staged))):
            self.select(row_of)
        return None if out is None else [out[j] for j in row_of]

    @torch.no_grad()
    def extend(self, new_tokens: Sequence[Sequence[int]], score: ScoreFn | None = None,
               outputs: bool = True) -> list[torch.Tensor] | None:
        """Append each row's new tokens; returns per row the outputs predicting them, or
        with `score` their per-token scores (on the CPU). `outputs=False`: nothing is
        returned and only each row's next-token output is computed (a rollout needs no
        more)."""
        counts = [len(t) for t in new_tokens]
        steps = max(counts, default=0)
        if steps == 0:
            return None if not outputs else _per_row(self.last[:0], counts, new_tokens, score)
        count = torch.as_tensor(counts, dtype=torch.long)
        real = torch.arange(steps)[None, :] < count[:, None]
        ids = _scatter_rows(new_tokens, real, self.pad_id)
        positions = self.next_pos[:, None] + torch.arange(steps)[None, :]
        self.mask = torch.cat([self.mask, real.long()], dim=1)
        keep = real if outputs else torch.arange(steps)[None, :] == count[:, None] - 1
        out, self.cache = self.forward(input_ids=ids, attention_mask=self.mask, position_ids=positions,
                                       cache=self.cache, keep=keep)
        # `out` holds row by row the kept outputs (rows with no new token hold none); a
        # row's last one predicts its next token.
        kept = count if outputs else (count > 0).long()
        ends = torch.cumsum(kept, 0) - 1
        rows = (count > 0).nonzero().squeeze(-1)
        device = self.last.device
        result = None
        if outputs and score is not None:
            result = self._score_new(out, count, rows, new_tokens, score)
        elif outputs:
            # Row i's outputs predicting its new tokens: the kept `last`, then all its new
            # outputs but the last. Indices into [last; out].
            B, first = len(counts), torch.cumsum(count, 0) - count
            row_of = torch.repeat_interleave(torch.arange(B), count)
            j = torch.arange(int(count.sum())) - first[row_of]
            src = torch.where(j == 0, row_of, B + first[row_of] + j - 1)
            result = _per_row(torch.cat([self.last, out])[src.to(device)], counts, new_tokens, None)
        self.last = self.last.index_copy(0, rows.to(device), out[ends[rows].to(device)])
        self.next_pos = self.next_pos + count
        return result

    def _score_new(self, out: torch.Tensor, count: torch.Tensor, rows: torch.Tensor,
                   new_tokens: Sequence[Sequence[int]], score: ScoreFn) -> list[torch.Tensor]:
        """Per-row scores of the new tokens without gathering their predicting outputs
        into a copy ([tokens, vocab] each): a row's first new token is scored against the
        kept `last`, every other one against the new output before it, which is `out`
        one place back; `out`'s last output per row predicts a token not known yet and
        is scored against a stand-in, its score dropped."""
        ids = torch.as_tensor(list(chain.from_iterable(new_tokens)), dtype=torch.long)
        first = (torch.cumsum(count, 0) - count)[rows]   # flat index of each row's first new token
        following = torch.cat([ids[1:], ids[:1]])        # the token each output of `out` predicts
        following[first[1:] - 1] = ids[first[1:] - 1]    # stand-ins where a row ends (any valid id)
        following[-1] = ids[-1]
        device = out.device
        by_out = score(out, following.to(device)).cpu()
        scores = torch.cat([by_out[:1], by_out[:-1]])    # token p scored by output p - 1
        scores[first] = score(self.last[rows.to(device)], ids[first].to(device)).cpu()
        return list(scores.split(count.tolist()))

    def select(self, rows: Sequence[int]) -> None:
        """Keep only `rows` (in this order): finished sequences stop costing compute. A
        row listed twice is copied (`prefill_shared` fans a prompt out this way)."""
        index = torch.as_tensor(list(rows), dtype=torch.long)
        self.cache.batch_select_indices(index)
        self.mask, self.next_pos = self.mask[index], self.next_pos[index]
        self.last = self.last[index.to(self.last.device)]


def _per_row(packed: torch.Tensor, counts: list[int], tokens: Sequence[Sequence[int]],
             score: ScoreFn | None) -> list[torch.Tensor]:
    """Split outputs packed row by row ([sum counts, ...]) into one tensor per row; with
    `score`, score them against their tokens first, on their device, in one call, and
    bring only the scores to the CPU."""
    if score is None:
        return list(packed.split(counts))
    if not packed.shape[0]:
        return [torch.zeros(0) for _ in counts]
    ids = torch.as_tensor(list(chain.from_iterable(tokens)), dtype=torch.long, device=packed.device)
    return list(score(packed, ids).cpu().split(counts))


def _scatter_rows(rows: Sequence[Sequence[int]], real: torch.Tensor, pad_id: int) -> torch.Tensor:
    """Token ids [B, W]: pad_id, with row i's tokens at its True columns of `real`, in
    order (one tensor build for the whole batch rather than one copy per row)."""
    ids = torch.full(real.shape, pad_id, dtype=torch.long)
    ids[real] = torch.as_tensor(list(chain.from_iterable(rows)), dtype=torch.long)
    return ids
