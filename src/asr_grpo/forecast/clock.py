"""The virtual clock, the results that complete on it, and the lanes that keep time.

A `Pending` is what a Ray ref is to the real scheduler: a result that exists at a time
on the virtual clock. `resolve` is the scheduler's `ray.get`: it moves the clock to the
result's time. A `Lane` is one thing that computes one job at a time (a rollout engine,
a device group, a scorer's queue of streamed calls): a job starts when it is ready and
the lane is free."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable


class VirtualClock:
    def __init__(self) -> None:
        self.now = 0.0

    def advance_to(self, t: float) -> None:
        self.now = max(self.now, t)


@dataclass
class Pending:
    done_at: float
    value: Any


def make_resolve(clock: VirtualClock) -> Callable[[Any], Any]:
    """`ray.get` on the virtual clock: a list resolves element by element."""
    def resolve(ref: Any) -> Any:
        if isinstance(ref, list):
            return [resolve(r) for r in ref]
        if isinstance(ref, Pending):
            clock.advance_to(ref.done_at)
            return ref.value
        return ref
    return resolve


@dataclass
class Span:
    lane: str
    role: str
    kind: str      # decode, prefill, contention, stream, old_logprobs, score, reward, train, sync
    start: float
    end: float


@dataclass
class Lane:
    name: str
    free_at: float = 0.0
    spans: list[Span] = field(default_factory=list)

    def run(self, ready_at: float, seconds: float, role: str, kind: str) -> float:
        """Run a job of `seconds` once it is ready and the lane is free; returns its end."""
        start = max(ready_at, self.free_at)
        end = start + max(0.0, seconds)
        if end > start:
            self.record(role, kind, start, end)
        self.free_at = end
        return end

    def record(self, role: str, kind: str, start: float, end: float) -> None:
        last = self.spans[-1] if self.spans else None
        if last is not None and last.kind == kind and last.role == role and abs(last.end - start) < 1e-12:
            last.end = end   # back-to-back pieces of one kind read as one bar
        else:
            self.spans.append(Span(self.name, role, kind, start, end))

    def take_spans(self) -> list[Span]:
        out, self.spans = self.spans, []
        return out
