"""Streaming (incremental) scoring: a scorer model sees each sequence's tokens chunk by
chunk as the actor produces them and keeps the sequence's KV cache between chunks, so
when the sequence finishes only its last chunk remains to prefill (OPPO's intra-step
overlap). The per-token scores equal those of one forward pass over the finished
sequence, up to float rounding.

Sequences that arrive together share one KV batch (a cohort); a cohort loses rows as
its sequences finish. `reset_caches()` drops every cache but keeps what is registered:
after a scorer's weights change (the critic's update) the next `feed` re-prefills the
tokens so far under the new weights.
"""
from __future__ import annotations

from typing import Callable, Mapping, Sequence

import torch

from asr_grpo.algorithms import logprobs_from_logits
from asr_grpo.models.kv_batch import ForwardFn, KVBatch, ScoreFn
from asr_grpo.models.sequences import AudioFeatures


def token_logprobs(temperature: float = 1.0) -> ScoreFn:
    def score(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        if temperature not in (0.0, 1.0):
            logits = logits.float() / temperature   # bf16 logits: scale in fp32, as the sampler does
        return logprobs_from_logits(logits[None], tokens[None])[0]
    return score


def identity_score(outputs: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    return outputs.float()


class _Cohort:
    def __init__(self, kv: KVBatch, uids: list[str]):
        self.kv, self.uids = kv, uids


class StreamingScorer:
    def __init__(self, forward: Callable[[], ForwardFn], pad_id: int, score: ScoreFn,
                 max_batch_size: int = 64, use_audio: bool = True):
        self.forward, self.pad_id, self.score = forward, pad_id, score
        self.max_batch_size, self.use_audio = max_batch_size, use_audio
        self._prompts: dict[str, tuple[list[int], AudioFeatures | None]] = {}
        self._scores: dict[str, list[torch.Tensor]] = {}
        self._consumed: dict[str, int] = {}
        self._cohort_of: dict[str, _Cohort] = {}

    def __len__(self) -> int:
        return len(self._prompts)

    def register(self, uid: str, prompt_ids: Sequence[int], features: AudioFeatures | None = None) -> None:
        self._prompts[uid] = (list(prompt_ids), features if self.use_audio else None)

    def feed(self, tokens: Mapping[str, Sequence[int]]) -> None:
        """`tokens[uid]` is the sequence's whole response so far; only what this scorer
        has not seen yet is prefilled."""
        fresh = [u for u in tokens if u not in self._cohort_of]
        for uid in tokens:
            if uid not in self._prompts:
                raise KeyError(f"streaming scorer: sequence {uid!r} was never registered")
        by_cohort: dict[int, tuple[_Cohort, dict[str, list[int]]]] = {}
        for uid, toks in tokens.items():
            cohort = self._cohort_of.get(uid)
            if cohort is None:
                continue
            seen = self._consumed[uid]
            if len(toks) < seen:
                raise ValueError(f"streaming scorer: sequence {uid!r} shrank from {seen} "
                                 f"to {len(toks)} tokens")
            by_cohort.setdefault(id(cohort), (cohort, {}))[1][uid] = list(toks[seen:])
        for cohort, new in by_cohort.values():
            scores = cohort.kv.extend([new.get(u, []) for u in cohort.uids], self.score)
            for uid, sc in zip(cohort.uids, scores):
                if uid in new and new[uid]:
                    self._append(uid, sc, new[uid])
        for start in range(0, len(fresh), self.max_batch_size):
            self._start_cohort(fresh[start:start + self.max_batch_size], tokens)

    def finish(self, uids: Sequence[str]) -> dict[str, torch.Tensor]:
        """Per-token scores of finished sequences (fed to their end); frees their caches."""
        out, leaving = {}, {}
        for uid in uids:
            parts = self._scores.pop(uid, [])
            out[uid] = torch.cat(parts) if parts else torch.zeros(0)
            self._consumed.pop(uid, None)
            self._prompts.pop(uid, None)
            cohort = self._cohort_of.pop(uid, None)
            if cohort is not None:
                leaving.setdefault(id(cohort), (cohort, set()))[1].add(uid)
        for cohort, gone in leaving.values():
            keep = [i for i, u in enumerate(cohort.uids) if u not in gone]
            if keep:
                cohort.kv.select(keep)
            cohort.uids = [cohort.uids[i] for i in keep]
        return out

    def reset_caches(self) -> None:
        """Weights changed: forget caches and partial scores, keep the registrations."""
        self._scores, self._consumed, self._cohort_of = {}, {}, {}

    def clear(self) -> None:
        """Forget every sequence: registrations, caches and partial scores."""
        self._prompts = {}
        self.reset_caches()

    def retain(self, uids) -> None:
        """Forget every sequence but `uids` (their caches and partial scores stay)."""
        keep = set(uids)
        self.finish([u for u in self._prompts if u not in keep])

    def registered(self) -> list[str]:
        return list(self._prompts)

    # ---- internals -----------------------------------------------------------------
    def _start_cohort(self, uids: list[str], tokens: Mapping[str, Sequence[int]]) -> None:
        kv = KVBatch(self.forward(), self.pad_id)
        feats = [self._prompts[u][1] for u in uids] if self.use_audio else None
        # Sequences of one prompt (a GRPO group, or every text-LM context) share its prefill.
        scores = kv.prefill_shared([self._prompts[u][0] for u in uids], feats,
                                   [list(tokens[u]) for u in uids], self.score)
        cohort = _Cohort(kv, list(uids))
        for uid, sc in zip(uids, scores):
            self._cohort_of[uid] = cohort
            self._scores[uid] = []
            self._consumed[uid] = 0
            if len(tokens[uid]):
                self._append(uid, sc, list(tokens[uid]))

    def _append(self, uid: str, scores: torch.Tensor, new: list[int]) -> None:
        """`scores`: the new tokens' scores, computed by the KV batch on the model's
        device for the whole cohort at once and brought to the CPU."""
        self._scores[uid].append(scores)
        self._consumed[uid] += len(new)


def score_once(forward: Callable[[], ForwardFn], pad_id: int, score: ScoreFn, uids: Sequence[str],
               prompts: Sequence[Sequence[int]], features: Sequence[AudioFeatures | None] | None,
               responses: Sequence[Sequence[int]], max_batch_size: int = 64) -> list[torch.Tensor]:
    """One-shot per-token scores of finished sequences, through the same shared-prompt
    KV path as streaming: each prompt group's audio prompt is prefilled once, then its
    responses are scored together (rather than n full forwards over prompt + response)."""
    scorer = StreamingScorer(forward, pad_id, score, max_batch_size, use_audio=features is not None)
    for i, uid in enumerate(uids):
        scorer.register(uid, prompts[i], features[i] if features is not None else None)
    scorer.feed(dict(zip(uids, responses)))
    out = scorer.finish(uids)
    return [out[u] for u in uids]
