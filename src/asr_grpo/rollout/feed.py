"""The reward feed: sequences a decode call finishes, sent to the reward while it runs.

Under intra/oppo with `reward.remote.feed`, a rollout host's decode loop sends what
finished at most every `every_s` straight to a reward worker (one fire-and-forget Ray
call from the decoding process; the decode never waits on it). The driver learns of
those calls only after the decode call, from the host (`EngineHost.take_fed`), and
collects their results like its own: nothing polls while the actor decodes, so the
feed's own work on the decode's cores is one call per send. Sending from inside the
decode keeps the host a plain one-call-at-a-time actor (a second actor thread to read
from computed 1.6-1.8x slower on 2 cores: bench/results/cpu_2core_remote_reward/).

`FeedSink` is what a decode call is given; its `target` makes the calls
(`distributed/reward_feed.RewardFeed` on Ray, a list in tests)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from asr_grpo.rollout.types import SequenceResult


@dataclass
class FeedSink:
    """`target.send(results)` makes one reward call and returns it (anything the driver
    can collect); `target.for_groups(groups)` is the target that knows those prompt
    groups. `every_s`: how often at most a decode sends (0: after every round that
    finished some). `sent`: this call's sends, (call, uids), until `take_sent`."""

    target: Any
    every_s: float
    sent: list[tuple[Any, list[str]]] = field(default_factory=list)

    def for_groups(self, groups: Mapping[str, Any]) -> FeedSink:
        """The sink a decode call over these groups gets (before the call)."""
        return FeedSink(self.target.for_groups(groups), self.every_s)

    def send(self, results: list[SequenceResult]) -> None:
        self.sent.append((self.target.send(results), [r.uid for r in results]))

    def take_sent(self) -> list[tuple[Any, list[str]]]:
        taken, self.sent = self.sent, []
        return taken
