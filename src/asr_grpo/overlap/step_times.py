"""What one RL step measured, as the driver timed it: the record the scheduler's
`end_step` hands its planner, and the source of the step's `perf/time/*` metrics.

The recipe (and the forecast's simulated step) builds it from its own timers; every field
is required, so a phase left out fails where the record is made instead of reaching the
planner as zero. The planner and the logs read the same numbers."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StepTimes:
    step_s: float          # the whole step, rollout start to weights synced
    rollout_s: float       # until the B groups are handed over (prompt groups built, decode, streaming)
    scoring_s: float       # scoring wall: old/ref log-probs, values, rewards, advantages
    training_s: float      # policy (and critic) updates
    sync_s: float          # weight sync to the rollout engines
    reward_wait_s: float   # within scoring: time blocked on reward results
    mean_reward: float     # mean total reward of the step's sampled transcripts (reward/total)

    def metrics(self) -> dict[str, float]:
        """The phase times under their MLflow names (what `forecast/runfit.py` reads back).
        The mean reward is logged by the experience maker, with its components."""
        return {"perf/time/step": self.step_s, "perf/time/rollout": self.rollout_s,
                "perf/time/scoring_wall": self.scoring_s, "perf/time/training": self.training_s,
                "perf/time/sync": self.sync_s, "perf/time/reward_wait": self.reward_wait_s}
