"""Rollout with the policy model's own forward (the default, no vLLM).

Live sequences sit in KV batches that survive between `decode` calls, so decoding a
chunk and resuming costs nothing extra. The batches are rebuilt (prompt + partial
response re-prefilled) only when sequences are added or the policy version changes:
a carried-over sequence then continues under the new weights, as OPPO specifies.
"""
from __future__ import annotations

import time
from typing import Sequence

import torch

from asr_grpo.models.kv_batch import KVBatch, causal_lm_forward
from asr_grpo.rollout.pool import GroupQuota, SequencePool
from asr_grpo.rollout.sampling import sample_tokens
from asr_grpo.rollout.types import SamplingParams, SequenceState

# Compact a KV batch once at most this share of its rows is still decoding. Measured
# (bench/results/cpu_2core_serial_step/decode_compaction.json): a round's cost grows with its rows on CPU and a select is
# cheap, so dropping finished rows early pays; 0.75-0.95 are within 1% of each other.
COMPACT_BELOW = 0.85


class _Running:
    """One KV batch and the sequences in its rows."""

    def __init__(self, kv: KVBatch, rows: list[SequenceState]):
        self.kv, self.rows = kv, rows

    def compact(self) -> None:
        keep = [i for i, s in enumerate(self.rows) if not s.done]
        if keep and len(keep) <= COMPACT_BELOW * len(self.rows):
            self.kv.select(keep)
            self.rows = [self.rows[i] for i in keep]


class HFChunkedEngine(SequencePool):
    def __init__(self, model, eos_token_ids: Sequence[int], pad_token_id: int,
                 sampling: SamplingParams, max_batch_size: int = 64,
                 suppress_token_ids: Sequence[int] = ()):
        super().__init__(sampling.max_new_tokens, {int(t) for t in eos_token_ids})
        self.model = model
        self.suppress = torch.as_tensor(list(suppress_token_ids), dtype=torch.long)   # goes to the logits' device
        self.pad_id = pad_token_id
        self.sampling = sampling
        self.max_batch_size = max_batch_size
        self._running: list[_Running] | None = None   # None: rebuild before decoding

    def _invalidate(self) -> None:
        """New weights or new sequences: the KV batches get rebuilt (re-prefilled)."""
        self._running = None

    # ---- decoding ------------------------------------------------------------------
    def _prepare(self) -> None:
        if self._running is None:
            self._rebuild()

    @torch.no_grad()
    def _advance(self, quota: GroupQuota | None) -> int:
        rows = sum(self._decode_round(run, quota) for run in self._running)
        self._running = [run for run in self._running if any(not s.done for s in run.rows)]
        return rows

    def _rebuild(self) -> None:
        t0 = time.perf_counter()
        self._running = []
        self._finish_at_budget(self.sampling.max_new_tokens)
        forward = causal_lm_forward(self.model)
        tokens = 0
        for start in range(0, len(self._live), self.max_batch_size):
            rows = self._live[start:start + self.max_batch_size]
            kv = KVBatch(forward, self.pad_id)
            # The samples of one prompt share its prefill (audio encoder included).
            kv.prefill_shared([s.request.prompt_ids for s in rows], [s.request.features for s in rows],
                              [s.tokens for s in rows], outputs=False)
            prompts = {(id(s.request.features), len(s.request.prompt_ids)) for s in rows}
            tokens += sum(n for _, n in prompts) + sum(len(s.tokens) for s in rows)
            self._running.append(_Running(kv, rows))
        self.stats.add_prefill(tokens, time.perf_counter() - t0)

    def _decode_round(self, run: _Running, quota: GroupQuota | None) -> int:
        """One token for every unfinished row of `run`; returns the rows advanced."""
        sp = self.sampling
        active = [i for i, s in enumerate(run.rows) if not s.done]
        if not active:
            return 0
        seqs = [run.rows[i] for i in active]
        # Sampled where the logits are (the model's device); only B ids and log-probs come back.
        # (On CPU the moves are no-ops: the CUDA path is not exercised by the CPU tests.)
        logits = run.kv.last[active]
        self.suppress = self.suppress.to(logits.device)
        tokens, logprobs = sample_tokens(logits, sp.temperature, sp.top_p, sp.seed,
                                         suppress=self.suppress, uids=[s.request.uid for s in seqs],
                                         positions=[len(s.tokens) for s in seqs])
        new: list[list[int]] = [[] for _ in run.rows]
        for i, s, tok, lp in zip(active, seqs, tokens.tolist(), logprobs.tolist()):
            if self._append(s, tok, lp, quota):
                new[i] = [tok]   # a finished row needs no further forward
        if any(new):
            run.kv.extend(new, outputs=False)
            run.compact()
        return len(active)
