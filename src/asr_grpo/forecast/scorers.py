"""Simulated streaming scorers (reference, critic values, LM reward model): the calls the
scheduler makes on them, `begin_step` and `stream`, on the virtual clock.

A stream call prefills what it has not seen yet (a registered prompt once per group,
then each sequence's new tokens; everything again for a scorer whose weights changed)
on the scorer's lane: it starts when the call arrives (the virtual now) and the lane is
free, and its result is a `Pending` at its end, never waited on during the rollout.

Contention: a scorer on the rollout engines' own GPUs slows the decode. Of each call's
seconds, the share `hidden` runs in the decode's shadow (a memory-bound decode leaves
the GPU's compute idle) and the rest is added to every engine's next decode call
(`SimHost.debt`): hidden = 1 is free overlap, 0 is taking turns (one CPU, say)."""
from __future__ import annotations

from asr_grpo.forecast.clock import Lane, Pending, VirtualClock
from asr_grpo.forecast.costs import RoleCost
from asr_grpo.forecast.workload import Workload


class SimScorer:
    def __init__(self, role: str, cost: RoleCost, workload: Workload, clock: VirtualClock, lane: Lane,
                 call_s: float = 0.0, contended: list | None = None, hidden: float = 1.0):
        self.role, self.cost, self.workload, self.clock, self.lane = role, cost, workload, clock, lane
        self.call_s, self.contended, self.hidden = call_s, list(contended or []), hidden
        self.seen: dict[str, int] = {}   # sequence -> tokens in its cache
        self.stale: set[str] = set()     # kept sequences to prefill again (new weights)
        self.last_done = 0.0
        self.calls = 0
        self.tokens = 0

    def begin_step(self, keep: list[str], weights_changed: bool) -> list[str]:
        kept = [u for u in keep if u in self.seen]
        self.seen = {u: self.seen[u] for u in kept}
        self.stale = set(kept) if weights_changed else set()
        return kept

    def stream(self, register: list, feed: dict[str, list[int]], finish: list[str]) -> Pending:
        groups: set[str] = set()
        tokens = 0
        for ref in register:
            self.seen[ref.uid] = 0
            groups.add(ref.uid.rsplit("#", 1)[0])
        for uid, toks in feed.items():
            have = self.seen.get(uid, 0)
            if uid in self.stale:
                self.stale.discard(uid)
                have = 0
                groups.add(uid.rsplit("#", 1)[0])
            tokens += len(toks) - have
            self.seen[uid] = len(toks)
        tokens += sum(self.workload.prompt_tokens(g) for g in groups)
        for uid in finish:
            self.seen.pop(uid, None)
        seconds = self.call_s + self.cost.forward(tokens)
        end = self.lane.run(self.clock.now, seconds, self.role, "stream")
        for host in self.contended:
            host.debt += (1.0 - self.hidden) * seconds
        self.last_done = max(self.last_done, end)
        self.calls += 1
        self.tokens += tokens
        return Pending(end, {u: 0.0 for u in finish})
