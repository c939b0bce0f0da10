"""A batch of sequences held in one KV cache and extended in place.

The rollout engine (one token per row per call) and the streaming scorers (a chunk of
tokens per row per call) share this: rows are left-padded prefixes; each `extend` feeds
every row its own new tokens, shorter rows padded and masked, so the cache may hold
masked holes that the attention mask hides. What comes back per row are the outputs
that *predict* the new tokens (the last output kept from the previous call, then the
outputs at all but the last new token), which is exactly what one forward pass over
the whole sequence gives at the same columns.
"""
from __future__ import annotations

from itertools import chain
from typing import Callable, Sequence

import torch

from asr_grpo.models.sequences import AudioFeatures, on_model_device, positions_from_mask, stack_features

# forward(input_ids, attention_mask, position_ids, cache, [input_features, input_features_mask])
#   -> (per-position outputs [B, L, ...], cache)
ForwardFn = Callable[..., tuple[torch.Tensor, object]]


def causal_lm_forward(model) -> ForwardFn:
    """Logits of a (speech) causal LM, with its KV cache."""
    def forward(cache=None, **inputs):
        out = model(**on_model_device(model, inputs), cache=cache, use_cache=True)
        return out.logits.cpu(), out.cache
    return forward


class KVBatch:
    def __init__(self, forward: ForwardFn, pad_id: int):
        self.forward, self.pad_id = forward, pad_id
        self.cache = None
        self.mask: torch.Tensor | None = None       # [B, L] 1 = real token
        self.next_pos: torch.Tensor | None = None   # [B] position of each row's next token
        self.last: torch.Tensor | None = None       # [B, ...] output predicting each row's next token

    def __len__(self) -> int:
        return 0 if self.mask is None else self.mask.shape[0]

    @torch.no_grad()
    def prefill(self, prefixes: Sequence[Sequence[int]], score_last: Sequence[int],
                features: Sequence[AudioFeatures] | None = None) -> list[torch.Tensor]:
        """Start the batch from left-padded prefixes; returns, per row, the outputs that
        predict its last `score_last[i]` prefix tokens (a resumed partial response)."""
        lengths = torch.as_tensor([len(p) for p in prefixes], dtype=torch.long)
        width = int(lengths.max())
        real = torch.arange(width)[None, :] >= width - lengths[:, None]
        ids, mask = _scatter_rows(prefixes, real, self.pad_id), real.long()
        extra = {}
        if features is not None:
            extra["input_features"], extra["input_features_mask"] = stack_features(features)
        out, self.cache = self.forward(input_ids=ids, attention_mask=mask,
                                       position_ids=positions_from_mask(mask), cache=None, **extra)
        self.mask, self.next_pos, self.last = mask, lengths, out[:, -1]
        # Row i's outputs at columns width-1-k .. width-2 predict its last k prefix tokens.
        k = torch.as_tensor(list(score_last), dtype=torch.long)
        col = torch.arange(width)[None, :]
        scored = (col >= width - 1 - k[:, None]) & (col < width - 1)
        return list(out[scored].split(k.tolist()))

    @torch.no_grad()
    def prefill_shared(self, prompts: Sequence[Sequence[int]], features: Sequence[AudioFeatures | None] | None,
                       continuations: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        """Start the batch from prompt + continuation per row, prefilling each distinct
        prompt (same tokens, same features object) once: the n samples of a GRPO group
        share their audio prompt, so the audio encoder and the prompt prefill run once
        per group instead of n times. The shared cache is copied to every row, then each
        row is extended by its own continuation (a partial response, often empty).
        Returns per row the outputs predicting its continuation, as `prefill` does with
        `score_last`; equal to prefilling every row whole, up to float rounding."""
        slot: dict[tuple, int] = {}   # (features object, prompt) -> row of the prefilled batch
        unique, index = [], []        # first row of each distinct prompt; each row's prefilled row
        for i, p in enumerate(prompts):
            key = (id(features[i]) if features else None, tuple(p))
            if key not in slot:
                slot[key] = len(unique)
                unique.append(i)
            index.append(slot[key])
        self.prefill([prompts[i] for i in unique], [0] * len(unique),
                     [features[i] for i in unique] if features else None)
        if len(unique) < len(prompts):
            self.select(index)
        return self.extend(continuations)

    @torch.no_grad()
    def extend(self, new_tokens: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        """Append each row's new tokens; returns per row the outputs predicting them."""
        counts = [len(t) for t in new_tokens]
        steps = max(counts, default=0)
        if steps == 0:
            return list(self.last[:0].split([0] * len(self)))
        count = torch.as_tensor(counts, dtype=torch.long)
        real = torch.arange(steps)[None, :] < count[:, None]
        ids = _scatter_rows(new_tokens, real, self.pad_id)
        positions = self.next_pos[:, None] + torch.arange(steps)[None, :]
        self.mask = torch.cat([self.mask, real.long()], dim=1)
        out, self.cache = self.forward(input_ids=ids, attention_mask=self.mask, position_ids=positions,
                                       cache=self.cache)
        # Column j of `shifted` predicts new token j; column c_i is row i's next-token output
        # (column 0, the kept `last`, for a row with no new token).
        shifted = torch.cat([self.last[:, None], out], dim=1)
        predicting = shifted[:, :steps][real].split(counts)
        self.last = shifted[torch.arange(len(counts)), count]
        self.next_pos = self.next_pos + count
        return list(predicting)

    def select(self, rows: Sequence[int]) -> None:
        """Keep only `rows` (in this order): finished sequences stop costing compute. A
        row listed twice is copied (`prefill_shared` fans a prompt out this way)."""
        index = torch.as_tensor(list(rows), dtype=torch.long)
        self.cache.batch_select_indices(index)
        self.mask, self.next_pos, self.last = self.mask[index], self.next_pos[index], self.last[index]


def _scatter_rows(rows: Sequence[Sequence[int]], real: torch.Tensor, pad_id: int) -> torch.Tensor:
    """Token ids [B, W]: pad_id, with row i's tokens at its True columns of `real`, in
    order (one tensor build for the whole batch rather than one copy per row)."""
    ids = torch.full(real.shape, pad_id, dtype=torch.long)
    ids[real] = torch.as_tensor(list(chain.from_iterable(rows)), dtype=torch.long)
    return ids
