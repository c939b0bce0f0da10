"""Rollout with the policy model's own forward (the default, no vLLM): a KV-cached
decode loop over the live sequences that stops after `max_tokens` and resumes later
by re-prefilling prompt + partial response."""
from __future__ import annotations

from typing import Sequence

import torch

from asr_grpo.models.sequences import positions_from_mask, stack_features
from asr_grpo.rollout.sampling import sample_tokens
from asr_grpo.rollout.types import RolloutRequest, SamplingParams, SequenceState


class HFChunkedEngine:
    def __init__(self, model, eos_token_ids: Sequence[int], pad_token_id: int,
                 sampling: SamplingParams, max_batch_size: int = 64,
                 suppress_token_ids: Sequence[int] = ()):
        self.model = model
        self.eos = set(int(t) for t in eos_token_ids)
        self.suppress = torch.as_tensor(list(suppress_token_ids), dtype=torch.long)
        self.pad_id = pad_token_id
        self.sampling = sampling
        self.max_batch_size = max_batch_size
        self.policy_version = 0
        self._live: list[SequenceState] = []
        self._finished: list[SequenceState] = []

    # ---- bookkeeping ---------------------------------------------------------------
    def add_requests(self, requests: list[RolloutRequest]) -> None:
        self._live.extend(SequenceState(r) for r in requests)

    def add_sequences(self, sequences: list[SequenceState]) -> None:
        """Resume partial sequences (carried over from an earlier step)."""
        self._live.extend(s for s in sequences if not s.done)

    def live(self) -> list[SequenceState]:
        return list(self._live)

    def pop_finished(self) -> list[SequenceState]:
        done, self._finished = self._finished, []
        return done

    def drain(self) -> list[SequenceState]:
        """Take every sequence out of the engine, finished or not."""
        out = self.pop_finished() + self._live
        self._live = []
        return out

    # ---- decoding ------------------------------------------------------------------
    @torch.no_grad()
    def decode(self, max_tokens: int | None = None) -> list[SequenceState]:
        """Advance every live sequence by up to `max_tokens` (None: to the end)."""
        touched: list[SequenceState] = []
        for start in range(0, len(self._live), self.max_batch_size):
            batch = self._live[start:start + self.max_batch_size]
            self._decode_batch(batch, max_tokens)
            touched.extend(batch)
        self._finished.extend(s for s in self._live if s.done)
        self._live = [s for s in self._live if not s.done]
        return touched

    def _decode_batch(self, seqs: list[SequenceState], max_tokens: int | None) -> None:
        sp = self.sampling
        budget = [sp.max_new_tokens - len(s.tokens) for s in seqs]
        steps = max(budget) if max_tokens is None else min(max_tokens, max(budget))
        if steps <= 0:
            for s in seqs:
                s.finish_reason = s.finish_reason or "length"
            return
        prefixes = [s.request.prompt_ids + s.tokens for s in seqs]
        width = max(len(p) for p in prefixes)
        ids = torch.full((len(seqs), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, p in enumerate(prefixes):
            ids[i, width - len(p):] = torch.as_tensor(p)
            mask[i, width - len(p):] = 1
        feats, feat_mask = stack_features([s.request.features for s in seqs])
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions_from_mask(mask),
                         input_features=feats, input_features_mask=feat_mask, use_cache=True)
        cache, logits = out.cache, out.logits[:, -1, :]
        positions = mask.sum(dim=1) - 1
        active = [not s.done for s in seqs]
        for _ in range(steps):
            tokens, logprobs = sample_tokens(logits, sp.temperature, sp.top_p, sp.seed,
                                             suppress=self.suppress,
                                             uids=[s.request.uid for s in seqs],
                                             positions=[len(s.tokens) for s in seqs])
            for i, s in enumerate(seqs):
                if not active[i]:
                    continue
                tok = int(tokens[i])
                s.tokens.append(tok)
                s.logprobs.append(float(logprobs[i]))
                s.versions.append(self.policy_version)
                if tok in self.eos:
                    s.finish_reason = "stop"
                elif len(s.tokens) >= sp.max_new_tokens:
                    s.finish_reason = "length"
                active[i] = not s.done
            if not any(active):
                break
            # Finished rows keep decoding a pad (masked out) so the batch stays rectangular.
            step_ids = torch.where(torch.tensor(active), tokens, torch.full_like(tokens, self.pad_id))
            mask = torch.cat([mask, torch.tensor(active, dtype=torch.long)[:, None]], dim=1)
            positions = positions + 1
            out = self.model(input_ids=step_ids[:, None], attention_mask=mask, position_ids=positions[:, None],
                             cache=cache, use_cache=True)
            cache, logits = out.cache, out.logits[:, -1, :]
