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
            predicting.append(torch.cat([self.last[i][None], out[i, :c - 1]]) if c else self.last[i][None][:0])
            if c:
                new_last[i] = out[i, c - 1]
        self.last, self.next_pos = new_last, self.next_pos + torch.as_tensor(counts)
        return predicting

    def select(self, rows: Sequence[int]) -> None:
        """Keep only `rows` (in this order): finished sequences stop costing compute. A
        row listed twice is copied (`prefill_shared` fans a prompt out this way)."""
        index = torch.as_tensor(list(rows), dtype=torch.long)
        self.cache.batch_select_indices(index)
        self.mask, self.next_pos, self.last = self.mask[index], self.next_pos[index], self.last[index]
