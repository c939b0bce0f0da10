"""The sequence bookkeeping every chunked engine shares: live and finished sequences,
the policy version that new tokens are stamped with, the group quota a decode call
may stop at, and the measured cost of decoding."""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

from asr_grpo.rollout.feed import FeedSink
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
    # Engines that prefill each request themselves (vLLM): prompt tokens sent, and how
    # many of them its prefix cache already held (a continuation's prompt + partial).
    request_prompt_tokens: int = 0
    cached_prompt_tokens: int = 0

    def add_round(self, rows: int, seconds: float, count: int = 1) -> None:
        """`count` rounds at `rows` rows took `seconds` together."""
        slot = self.rounds.setdefault(rows, [0, 0.0])
        slot[0] += count
        slot[1] += seconds

    def add_prefill(self, tokens: int, seconds: float) -> None:
        self.prefill_tokens += tokens
        self.prefill_seconds += seconds

    def add_requests(self, prompt_tokens: int, cached_tokens: int) -> None:
        self.request_prompt_tokens += prompt_tokens
        self.cached_prompt_tokens += cached_tokens

    def as_dict(self) -> dict:
        return {"rounds": {int(r): list(v) for r, v in self.rounds.items()},
                "prefill_tokens": self.prefill_tokens, "prefill_seconds": self.prefill_seconds,
                "request_prompt_tokens": self.request_prompt_tokens,
                "cached_prompt_tokens": self.cached_prompt_tokens}


class SequencePool:
    """Engines that decode round by round (one token for every live sequence per round)
    implement `_prepare` and `_advance`; `decode` runs the rounds, stops at the budget
    or the group quota, and times each round."""

    def __init__(self, max_new_tokens: int = 0, eos: set[int] | None = None) -> None:
        self._version = 0
        self._live: list[SequenceState] = []
        self._finished: list[SequenceState] = []
        self.stats = DecodeStats()
        self.max_new_tokens, self.eos = max_new_tokens, set(eos or ())
        self.clock = time.perf_counter   # the forecast's simulated engines run on a virtual clock
        self.wall_clock = time.time      # stamps `finished_at` (the forecast's engines: their virtual time)
        # The feed (rollout/feed.py): where a decode call sends what finished, what it
        # has not sent yet, and when it last sent (on `clock`).
        self._feed: FeedSink | None = None
        self._fed: list[SequenceState] = []
        self._fed_at = 0.0

    # ---- round-by-round decoding ------------------------------------------------------
    def _prepare(self) -> None:
        """Hook: make the live sequences ready to decode (e.g. prefill their caches)."""

    def _advance(self, quota: GroupQuota | None) -> int:
        """Hook: one token for every unfinished live sequence (through `_append`);
        returns the rows advanced."""
        raise NotImplementedError

    def decode(self, max_tokens: int | None = None, stop_after_groups: int | None = None,
               stop_check_every: int = 1, feed: FeedSink | None = None) -> list[SequenceState]:
        """Advance every live sequence by up to `max_tokens` (None: to the end); with
        `stop_after_groups=k`, stop as soon as k prompt groups have completed in this
        call (checked every `stop_check_every` rounds). Returns the sequences advanced
        (finished ones move to `pop_finished`). Every row advances one token per
        round, so the tokens a sequence gained in a call say in which round it finished.
        `feed`: the sequences that finish are also sent there while the call runs."""
        self.start_feed(feed)
        self._prepare()
        touched = [s for s in self._live if not s.done]
        quota = GroupQuota(touched, stop_after_groups) if stop_after_groups is not None else None
        budget = self.max_new_tokens if max_tokens is None else max_tokens
        for tick in range(budget):
            t0 = self.clock()
            rows = self._advance(quota)
            if not rows:
                break
            self.stats.add_round(rows, self.clock() - t0)
            self._push_fed()
            if quota is not None and quota.met and (tick + 1) % stop_check_every == 0:
                break
        self._retire_finished()
        return touched

    def _append(self, seq: SequenceState, token: int, logprob: float, quota: GroupQuota | None) -> bool:
        """Give `seq` its next token; returns whether it goes on decoding."""
        seq.tokens.append(token)
        seq.logprobs.append(logprob)
        seq.versions.append(self._version)
        if token in self.eos:
            seq.finish_reason = "stop"
        elif len(seq.tokens) >= self.max_new_tokens:
            seq.finish_reason = "length"
        else:
            return True
        self._mark_finished(seq)
        if quota is not None:
            quota.finished(seq)
        return False

    # ---- the feed of finished sequences ---------------------------------------------------
    def start_feed(self, feed: FeedSink | None) -> None:
        """At a decode call's start: where it sends what finishes (None: nowhere). What
        the last call did not send is dropped (the caller had it in that call's results)."""
        self._feed, self._fed, self._fed_at = feed, [], self.clock()

    def _mark_finished(self, seq: SequenceState) -> None:
        seq.finished_at = self.wall_clock()
        if self._feed is not None:
            self._fed.append(seq)

    def _push_fed(self) -> None:
        """Between rounds: send what finished since the last send, once `every_s` passed."""
        if self._fed and self.clock() - self._fed_at >= self._feed.every_s:
            self._feed.send([s.result() for s in self._fed])
            self._fed, self._fed_at = [], self.clock()

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
