"""The reward feed's target on Ray (rollout/feed.py): a decoding host sends what
finished straight to a reward worker."""
from __future__ import annotations

from typing import Any, Mapping

from asr_grpo.rewards.request import utterance_fields
from asr_grpo.rollout.types import SequenceResult


class RewardFeed:
    """Picklable (it travels to the hosts inside a `FeedSink`): the reward workers'
    handles and, per prompt group of the decode call, the utterance fields its reward
    reads. A send goes to the workers in turn; the call is (worker rank, ObjectRef)."""

    def __init__(self, workers: list, utterances: Mapping[str, dict] | None = None) -> None:
        self.workers, self.utterances = list(workers), dict(utterances or {})
        self._next = 0

    def for_groups(self, groups: Mapping[str, Any]) -> RewardFeed:
        return RewardFeed(self.workers, {uid: utterance_fields(g.utterance) for uid, g in groups.items()})

    def send(self, results: list[SequenceResult]) -> tuple[int, Any]:
        rank, self._next = self._next, (self._next + 1) % len(self.workers)
        # What the reward reads of a sequence: its tokens and finish reason (not its log-probs).
        slim = [SequenceResult(r.uid, r.group, r.tokens, [], [], r.finish_reason) for r in results]
        ref = self.workers[rank].score_finished.remote(slim, [self.utterances[r.group] for r in results])
        return rank, ref
