"""The reward feed: sequences a decode call finishes, pushed out while the call runs.

Under intra/oppo with `reward.remote.feed`, a rollout host's decode loop pushes what
finished to an inbox at most every `every_s` (a fire-and-forget send: the decode never
waits on it), and the driver takes from the inbox while the call runs and sends each
sequence to the reward service. Pushing from inside the decode keeps the host a plain
one-call-at-a-time actor: a Ray actor with a second concurrency group to read from runs
its calls on a thread Ray made, where a two-thread torch team computed 1.6-1.8x slower
on 2 cores (bench/results/cpu_2core_remote_reward/README.md).

`FeedInbox` is the inbox itself (in process); `distributed/feed_inbox.RayFeedInbox` is
the same calls on a Ray actor, which hosts in other processes reach."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from asr_grpo.rollout.types import SequenceResult


class FeedInbox:
    """Finished sequences put by decode calls, taken by the driver; each once."""

    def __init__(self) -> None:
        self._items: list[SequenceResult] = []

    def put(self, results: list[SequenceResult]) -> None:
        self._items.extend(results)

    def take(self) -> list[SequenceResult]:
        taken, self._items = self._items, []
        return taken


@dataclass
class FeedSink:
    """What a feeding decode call is given: the inbox (anything with `put` and `take`)
    and how often at most it pushes (seconds; 0: after every round that finished some)."""

    inbox: Any
    every_s: float

    def send(self, results: list[SequenceResult]) -> None:
        self.inbox.put(results)
