"""The sequence bookkeeping every chunked engine shares: live and finished sequences,
the policy version that new tokens are stamped with, the group quota a decode call
may stop at, and the measured cost of decoding."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from asr_grpo.rollout.types import RolloutRequest, SequenceState


class GroupQuota:
    """Stops a decode call once `needed` prompt groups have completed in it: a group
    completes when the last of its live sequences finishes (its other samples finished
    earlier or on another call). OPPO's overcommit trains on the first B groups to
    finish, so the engine can stop the moment B are done, whatever the chunk size."""

    def __init__(self, live: list[SequenceState], needed: int):
        self.needed = needed
        self._open = Counter(s.request.group for s in live if not s.done)
        self.completed = 0

    def finished(self, seq: SequenceState) -> None:
        group = seq.request.group
        self._open[group] -= 1
        if self._open[group] == 0:
            self.completed += 1

    @property
    def met(self) -> bool:
        return self.completed >= self.needed


@dataclass
class DecodeStats:
    """What decoding cost on this engine since the last `take`: seconds per decode
    round binned by how many rows it advanced, and the prefill work (rebuilds, carried
    sequences re-prefilled). A cost model fits round(rows) = a + b * rows from it."""
    rounds: dict[int, list[float]] = field(default_factory=dict)   # rows -> [count, seconds]
    prefill_tokens: int = 0
    prefill_seconds: float = 0.0

    def add_round(self, rows: int, seconds: float, count: int = 1) -> None:
        """`count` rounds at `rows` rows took `seconds` together."""
        slot = self.rounds.setdefault(rows, [0, 0.0])
        slot[0] += count
        slot[1] += seconds

    def add_prefill(self, tokens: int, seconds: float) -> None:
        self.prefill_tokens += tokens
        self.prefill_seconds += seconds

    def as_dict(self) -> dict:
        return {"rounds": {int(r): list(v) for r, v in self.rounds.items()},
                "prefill_tokens": self.prefill_tokens, "prefill_seconds": self.prefill_seconds}


class SequencePool:
    def __init__(self) -> None:
        self._version = 0
        self._live: list[SequenceState] = []
        self._finished: list[SequenceState] = []
        self.stats = DecodeStats()

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

    def take_stats(self) -> dict:
        """The decode cost measured since the last call (and reset)."""
        out, self.stats = self.stats.as_dict(), DecodeStats()
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
