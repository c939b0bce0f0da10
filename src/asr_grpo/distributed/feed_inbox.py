"""The reward feed's inbox on a Ray actor (`rollout/feed.FeedInbox`): rollout hosts in
other processes push to it without waiting, and the driver takes from it."""
from __future__ import annotations

from asr_grpo.rollout.feed import FeedInbox
from asr_grpo.rollout.types import SequenceResult


class RayFeedInbox:
    """`put` / `take` as `FeedInbox`, on an actor this object holds a handle to; it
    pickles, so it travels to the hosts inside a `FeedSink`."""

    def __init__(self) -> None:
        import ray

        # No CPU reserved: it only holds lists, and must start on a full node.
        self.handle = ray.remote(FeedInbox).options(num_cpus=0).remote()

    def put(self, results: list[SequenceResult]) -> None:
        self.handle.put.remote(results)   # fire and forget: the decode goes on

    def take(self) -> list[SequenceResult]:
        import ray

        return ray.get(self.handle.take.remote())
