"""DAPO's dynamic sampling, as the rollout scheduler does it (`algorithm.dynamic_sampling`).

A prompt group whose samples all got the same reward gives each a zero advantage under a
group baseline: it teaches nothing. When such a group finishes it does not count toward
the step's B groups: the scheduler drops it (it is never trained and never carried) and
admits another prompt group in its place, the way it admits every group, so replacement
groups are more admissions of the same rollout, in every overlap mode. At most
`max_extra_groups` replacements a step: past that bound the step trains the groups that
spread, fewer than B (as many as divide over the data-parallel ranks), and none if none
did. Filling the batch with flat groups instead would train on what DAPO filters out.

The scheduler knows nothing of rewards: `judge(groups, results)` (the experience maker's,
which keeps the rewards for the groups that stay) names the finished groups whose rewards
do not spread; `draw(k, step)` makes k new prompt groups (the recipe's prompt sampler)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from asr_grpo.experience.types import PromptGroup
from asr_grpo.rollout.types import SequenceResult

Judge = Callable[[list[PromptGroup], dict[str, list[SequenceResult]]], set[str]]


@dataclass
class DynamicSampling:
    judge: Judge
    draw: Callable[[int, int], list[PromptGroup]]
    max_extra_groups: int
    # The trained groups are split over this many data-parallel ranks: a batch short of B
    # keeps a multiple of it, so every rank runs the same number of micro-batches.
    group_multiple: int = 1
    # This step's counts.
    dropped: int = 0        # finished groups dropped for equal rewards
    extra: int = 0          # replacement groups drawn
    bound_hit: bool = False  # a dropped group went unreplaced: the bound was reached
    trimmed: int = 0        # groups that spread but did not divide over the ranks

    def begin_step(self) -> None:
        self.dropped = self.extra = self.trimmed = 0
        self.bound_hit = False

    def replace(self, dropped: int, step: int) -> list[PromptGroup]:
        """`dropped` groups just left the step: the new groups that take their places,
        as many as the step's bound still allows."""
        self.dropped += dropped
        k = min(dropped, self.max_extra_groups - self.extra)
        self.bound_hit = self.bound_hit or k < dropped
        self.extra += k
        return self.draw(k, step) if k else []

    def batch_size(self, finished: int, B: int) -> int:
        """How many of the `finished` groups that spread a step trains: B, or when the
        bound left fewer, the largest multiple of `group_multiple` they fill."""
        if finished >= B:
            return B
        kept = finished - finished % self.group_multiple
        self.trimmed = finished - kept
        return kept

    def metrics(self, trained: int) -> dict[str, float]:
        return {"dynamic_sampling/dropped_groups": float(self.dropped),
                "dynamic_sampling/extra_groups": float(self.extra),
                "dynamic_sampling/bound_hit": float(self.bound_hit),
                "dynamic_sampling/trimmed_groups": float(self.trimmed),
                "dynamic_sampling/trained_groups": float(trained)}
