"""Simulated rollout engines and hosts: the scheduler's `EngineHost` calls, on the virtual clock.

`SimEngine` is a `SequencePool` whose model is a length table: a sequence emits EOS at
its drawn length (or runs to the cap), and every round advances the engine's own time
by what the profile says a round of that many live rows costs. It rebuilds (prefills
prompts and carried tokens) whenever sequences are added or the weights change, as the
HF engine does. `_advance` is one round; `decode` jumps from one finishing round to the
next, with the same stops, tokens and cost statistics as the round-by-round loop (a test
holds the two equal), so that long responses simulate in milliseconds.

`SimHost` is the real `EngineHost` (`rollout/host.py`) around it: a decode call starts
when the driver sends it (the virtual now) and the engine is free, pays first the
slowdown that streamed scoring on the same GPUs caused (`debt`, inside its first round,
so the round timings the cost-model planner fits hold it), and returns a `Pending` at
its end."""
from __future__ import annotations

from asr_grpo.forecast.clock import Lane, Pending, VirtualClock
from asr_grpo.forecast.costs import DecodeCost, Forward
from asr_grpo.forecast.workload import Workload
from asr_grpo.rollout.host import EngineHost
from asr_grpo.rollout.pool import GroupQuota, SequencePool
from asr_grpo.rollout.types import SequenceState

EOS, TOKEN = 0, 7


class SimEngine(SequencePool):
    def __init__(self, workload: Workload, decode: DecodeCost, prefill: Forward, lane: Lane, role: str = "actor"):
        super().__init__(workload.max_new_tokens, {EOS})
        self.workload, self.costs, self.prefill_cost = workload, decode, prefill
        self.lane, self.role = lane, role
        self.t = 0.0
        self.clock = lambda: self.t   # SequencePool times each round with this
        self.wall_clock = self.clock  # and stamps each sequence's finish: a round's end
        self._stale = True
        self.slowdown = 0.0   # seconds the next round loses to streamed scoring on these GPUs

    # ---- what a sequence does ------------------------------------------------------------
    def _target(self, s: SequenceState) -> int:
        return self.workload.target_length(s.request.uid)

    def _last_token(self, s: SequenceState) -> int:
        """EOS at the natural end; a capped sequence's last token is an ordinary one (`length`)."""
        return EOS if self.workload.natural_length(s.request.uid) <= self.max_new_tokens else TOKEN

    def _context(self, seqs: list[SequenceState]) -> int:
        return sum(self.workload.prompt_tokens(s.request.group) + len(s.tokens) for s in seqs)

    # ---- SequencePool hooks ------------------------------------------------------------------
    def _invalidate(self) -> None:
        self._stale = True

    def _prepare(self) -> None:
        """A rebuild: every distinct prompt once (the samples share it) and every carried token."""
        if not self._stale:
            return
        self._stale = False
        self._finish_at_budget(self.max_new_tokens)
        prompts = {s.request.group for s in self._live}
        tokens = sum(self.workload.prompt_tokens(g) for g in prompts) + sum(len(s.tokens) for s in self._live)
        if not tokens:
            return
        start, seconds = self.t, self.prefill_cost(tokens)
        self.t += seconds
        self.stats.add_prefill(tokens, seconds)
        self.lane.record(self.role, "prefill", start, self.t)

    def _take_slowdown(self) -> float:
        """The contention owed, paid inside the next round (so a round's timing holds it,
        as a measured one would); drawn as its own bar."""
        owed, self.slowdown = self.slowdown, 0.0
        if owed > 0:
            self.lane.record(self.role, "contention", self.t, self.t + owed)
        return owed

    def _advance(self, quota: GroupQuota | None) -> int:
        live = [s for s in self._live if not s.done]
        if not live:
            return 0
        owed = self._take_slowdown()
        start = self.t + owed
        self.t = start + self.costs.round_s(len(live), self._context(live))
        self.lane.record(self.role, "decode", start, self.t)
        for s in live:
            last = len(s.tokens) + 1 >= self._target(s)
            self._append(s, self._last_token(s) if last else TOKEN, 0.0, quota)
        return len(live)

    def decode(self, max_tokens: int | None = None, stop_after_groups: int | None = None,
               stop_check_every: int = 1, feed=None) -> list[SequenceState]:
        """`SequencePool.decode`, a run of rounds at a time: between two rounds in which
        sequences finish, the rows (and so the cost per round) change only by context."""
        self.start_feed(feed)
        self._prepare()
        touched = [s for s in self._live if not s.done]
        quota = GroupQuota(touched, stop_after_groups) if stop_after_groups is not None else None
        budget = self.max_new_tokens if max_tokens is None else max_tokens
        live, ticks = list(touched), 0
        owed = self._take_slowdown() if live else 0.0
        start = self.t + owed
        context = self._context(live)
        while ticks < budget and live:
            rows = len(live)
            left = [self._target(s) - len(s.tokens) for s in live]
            k = min(min(left), budget - ticks)
            if quota is not None and quota.met:   # finishes only end a call at a check round
                k = min(k, stop_check_every - ticks % stop_check_every)
            seconds = self.costs.rounds_s(k, rows, context) + owed
            owed = 0.0
            self.t += seconds
            self.stats.add_round(rows, seconds, count=k)
            context += rows * k
            still = []
            for s, n in zip(live, left):
                plain = k if n > k else k - 1
                s.tokens.extend([TOKEN] * plain)
                s.logprobs.extend([0.0] * plain)
                s.versions.extend([self._version] * plain)
                if n > k:
                    still.append(s)
                else:
                    self._append(s, self._last_token(s), 0.0, quota)
                    context -= self.workload.prompt_tokens(s.request.group) + len(s.tokens)
            live, ticks = still, ticks + k
            if quota is not None and quota.met and ticks % stop_check_every == 0:
                break
        if self.t > start:
            self.lane.record(self.role, "decode", start, self.t)
        self._retire_finished()
        return touched


class SimHost(EngineHost):
    def __init__(self, engine: SimEngine, clock: VirtualClock, call_s: float = 0.0):
        self.engine, self.clock, self.call_s = engine, clock, call_s
        self.debt = 0.0   # seconds streamed scoring on this engine's GPUs took from its decode

    def decode(self, max_tokens: int | None = None, stop_after_groups: int | None = None,
               stop_check_every: int = 1, feed=None) -> Pending:
        engine = self.engine
        engine.t = max(engine.t, self.clock.now) + self.call_s
        # An idle engine's GPU absorbs the scorers' work; a busy one's first round pays it.
        engine.slowdown = self.debt if any(not s.done for s in engine.live()) else 0.0
        self.debt = 0.0
        results = EngineHost.decode(self, max_tokens, stop_after_groups, stop_check_every, feed)
        return Pending(engine.t, results)
