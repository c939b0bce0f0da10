"""The weight-sync check: after a sync, every rollout engine must score fixed sequences
exactly as the trainer does (same weights, same tokens, temperature 1).

A mismatch means the engines sample from weights the trainer does not hold (a missed
tensor, a stale cache, a wrong name mapping), and every update after it is silently
off-policy. With `rollout.sync_check_every=N` the RL loop runs this check after every
N-th sync (`rollout/sync/*` metrics) and stops with `WeightSyncMismatch` above
`rollout.sync_check_tol`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from asr_grpo.experience.types import SequenceRef


class WeightSyncMismatch(RuntimeError):
    """A rollout engine's log-probs differ from the trainer's after a weight sync."""


@dataclass(frozen=True)
class SyncComparison:
    max_abs_diff: float
    mean_abs_diff: float
    tokens: int

    def metrics(self, prefix: str = "rollout/sync") -> dict[str, float]:
        return {f"{prefix}/max_abs_diff": self.max_abs_diff, f"{prefix}/mean_abs_diff": self.mean_abs_diff,
                f"{prefix}/tokens": float(self.tokens)}


def compare_logprobs(trainer: Sequence[torch.Tensor], engine: Sequence[torch.Tensor]) -> SyncComparison:
    """Per-token |trainer - engine| over the same sequences, in order."""
    if len(trainer) != len(engine):
        raise ValueError(f"{len(trainer)} trainer sequences against {len(engine)} engine sequences")
    diffs = []
    for i, (a, b) in enumerate(zip(trainer, engine)):
        a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
        if a.shape != b.shape:
            raise ValueError(f"sequence {i}: {tuple(a.shape)} trainer log-probs against {tuple(b.shape)}")
        diffs.append((a - b).abs())
    flat = torch.cat(diffs) if diffs else torch.zeros(0, dtype=torch.float64)
    if flat.numel() == 0:
        raise ValueError("no tokens to compare")
    return SyncComparison(float(flat.max()), float(flat.mean()), int(flat.numel()))


def check_sequences(items: Sequence, count: int) -> list[SequenceRef]:
    """The first `count` samples just trained on (prompt + sampled response, audio
    included): real lengths and real audio, no extra data to hold."""
    scored = [it for it in items if len(it.response_ids) > 0]
    return [SequenceRef(it.uid, list(it.prompt_ids), list(it.response_ids), it.features) for it in scored[:count]]


def check_weight_sync(trainer_logprobs: Sequence[torch.Tensor], engines_logprobs: Sequence[Sequence[torch.Tensor]],
                      tol: float, version: int) -> SyncComparison:
    """Every engine against the trainer; the worst comparison, or `WeightSyncMismatch`
    naming the engine rank, the policy version and how far apart they are."""
    worst = None
    for rank, engine in enumerate(engines_logprobs):
        cmp = compare_logprobs(trainer_logprobs, engine)
        if cmp.max_abs_diff > tol:
            raise WeightSyncMismatch(
                f"after the weight sync to policy version {version}, rollout engine {rank} scores fixed "
                f"sequences differently from the trainer: max |log-prob difference| {cmp.max_abs_diff:.3g} "
                f"(mean {cmp.mean_abs_diff:.3g} over {cmp.tokens} tokens) > rollout.sync_check_tol={tol:g}. "
                "The engine is sampling from weights the trainer does not hold; bf16 engines need a "
                "looser tolerance (~5e-2) than float32 ones")
        if worst is None or cmp.max_abs_diff > worst.max_abs_diff:
            worst = cmp
    if worst is None:
        raise ValueError("no rollout engines to check")
    return worst
