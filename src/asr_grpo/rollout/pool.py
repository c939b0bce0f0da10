"""The sequence bookkeeping every chunked engine shares: live and finished sequences,
and the policy version that new tokens are stamped with."""
from __future__ import annotations

from asr_grpo.rollout.types import RolloutRequest, SequenceState


class SequencePool:
    def __init__(self) -> None:
        self._version = 0
        self._live: list[SequenceState] = []
        self._finished: list[SequenceState] = []

    def _invalidate(self) -> None:
        """Hook: whatever an engine cached for its live sequences is stale now."""

    @property
    def policy_version(self) -> int:
        return self._version

    @policy_version.setter
    def policy_version(self, version: int) -> None:
        if version != self._version:
            self._invalidate()
        self._version = version

    def add_requests(self, requests: list[RolloutRequest]) -> None:
        self._live.extend(SequenceState(r) for r in requests)
        self._invalidate()

    def add_sequences(self, sequences: list[SequenceState]) -> None:
        """Resume partial sequences (carried over from an earlier step or a checkpoint)."""
        self._live.extend(s for s in sequences if not s.done)
        self._invalidate()

    def live(self) -> list[SequenceState]:
        return list(self._live)

    def pop_finished(self) -> list[SequenceState]:
        done, self._finished = self._finished, []
        return done

    def drain(self) -> list[SequenceState]:
        """Take every sequence out of the engine, finished or not."""
        out = self.pop_finished() + self._live
        self._live = []
        self._invalidate()
        return out

    def _retire_finished(self) -> None:
        self._finished.extend(s for s in self._live if s.done)
        self._live = [s for s in self._live if not s.done]

    def _finish_at_budget(self, max_new_tokens: int) -> None:
        """A resumed sequence may already hold its whole budget."""
        for s in self._live:
            if not s.done and len(s.tokens) >= max_new_tokens:
                s.finish_reason = "length"
        self._retire_finished()
