"""A Ray actor that owns the reward file.

Running the reward in its own process isolates user code: a crash or a hung
`reward_func` (which a thread timeout cannot stop) costs only this actor, which the
caller can `ray.kill` and recreate.
"""
from __future__ import annotations

import functools
from typing import Any, Mapping

from asr_grpo.rewards.loader import call_reward_function, hung_reward_calls, load_reward_function
from asr_grpo.tracking.busy import BusyClock, busy


class RewardWorker(BusyClock):
    """Loads the reward file once; `score` is one validated call per batch.

    The constructor's arguments mirror `RewardConfig`.
    """

    def __init__(self, reward_file: str | None = "", weights: Mapping[str, float] | None = None,
                 timeout_s: float = 30.0, on_bad_reward: str = "error", hang_retries: int = 0) -> None:
        self.reward_file = reward_file
        self.fn = load_reward_function(reward_file)
        self.weights = dict(weights) if weights else None
        self.timeout_s = timeout_s
        self.on_bad = on_bad_reward
        self.hang_retries = hang_retries

    @busy
    def score(self, batch: Mapping[str, Any]) -> dict:
        """batch: queries, prompts, labels, optional sample_ids, and any reward_func
        kwargs (responses, languages, keywords, finish_reasons, weights). Returns
        `RewardResult.to_dict()` (plain lists) and `hung_calls`, the reward_func calls
        that timed out and still run in this process."""
        kwargs = dict(batch)
        if self.weights is not None:
            kwargs.setdefault("weights", self.weights)
        result = call_reward_function(
            self.fn, timeout_s=self.timeout_s, hang_retries=self.hang_retries, source=self.reward_file or None,
            on_bad=self.on_bad, **kwargs)
        # > 0 after a timeout under the drop policy: the caller restarts this actor.
        return {**result.to_dict(), "hung_calls": hung_reward_calls()}


@functools.cache
def remote_reward_worker():
    """`ray.remote(RewardWorker)`, made on first use so importing this module needs no
    Ray; set resources per actor with `.options(num_cpus=..., num_gpus=...)`."""
    import ray
    return ray.remote(RewardWorker)
