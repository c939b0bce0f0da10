"""The rollout scheduler: the one place the overlap modes differ.

- none:  decode every sequence to its end in one call; the scorers run afterwards.
- intra: decode `chunk` tokens at a time; after each chunk the new tokens go to the
         streaming scorers (their own Ray actors), which prefill them while the actor
         decodes the next chunk. The experience is the same as `none`'s.
- inter: keep a buffer of B + Δ prompt groups and decode until B groups are finished:
         the hosts check after every decode round (`overlap.stop_check_every`), apart
         from the chunk size, which only sets how often tokens stream. Train on the
         first B to finish, carry the rest (with every token they have) into the next step.
- oppo:  both.
Within what its mode allows, each step's chunk size and Δ come from a planner
(`overlap.controller`: `cost_model` by default, which stays serial unless overlap is
predicted to pay; the paper's periodic `trial`; or `fixed`).

Rollout hosts (policy ranks or rollout workers) keep the live sequences between steps;
this driver-side object keeps the latest state of every sequence, which is what a
checkpoint stores and what a resume puts back, and what a rollout worker that died
mid-step (Ray restarts it) gets back: `restore_host(rank)` (the recipe's: the current
weights) and then its unfinished sequences with their tokens so far. A streaming scorer
that died loses the calls in flight; `StreamedScores` leaves those sequences out and
the experience maker scores them again in one shot. What streams where, and what each
scorer holds, is `StreamLedger`'s bookkeeping (`stream_ledger.py`).

The scheduler knows nothing of Ray: the caller hands it `resolve` (how a call's result
is awaited: `ray.get`, or the forecast's virtual clock) and `is_death` (whether an error
means a worker process died). A step runs as `groups_wanted(step)` (plans it, says how
many new prompt groups it admits), `rollout(step, groups)`, then `end_step(step, times)`
with what the step measured (`StepTimes`).

With `dynamic_sampling` (DAPO, `dynamic_sampling.py`) a finished group whose rewards are
all equal leaves the buffer and does not count toward B; the step admits another group in
its place, up to a bound.
"""
from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from asr_grpo.experience.types import PromptGroup
from asr_grpo.overlap.cost_model import CostFitter
from asr_grpo.overlap.dynamic_sampling import DynamicSampling
from asr_grpo.overlap.planners import MODES, StepObservation, StepPlan, make_planner, merge_decode_stats
from asr_grpo.overlap.step_times import StepTimes
from asr_grpo.overlap.stream_ledger import StreamedScores, StreamLedger, never_died
from asr_grpo.rollout.feed import FeedSink
from asr_grpo.rollout.types import RolloutRequest, SequenceResult
from asr_grpo.tracking.rollout_metrics import prefix_cache_metrics, staleness_histogram

log = logging.getLogger(__name__)


@dataclass
class BufferedGroup:
    group: PromptGroup
    host: int
    samples: dict[str, SequenceResult] = field(default_factory=dict)
    finished_tick: int | None = None   # decode round (of the run) in which its last sample finished
    judged: bool = False   # dynamic sampling found its rewards spread (it counts toward B)

    @property
    def done(self) -> bool:
        return len(self.samples) == self.group.n and all(s.done for s in self.samples.values())

    def results(self) -> list[SequenceResult]:
        return [self.samples[r.uid] for r in self.group.requests()]


@dataclass
class StepRollout:
    groups: list[PromptGroup]                       # the B groups to train on
    results: dict[str, list[SequenceResult]]        # group uid -> its n samples
    streamed: dict[str, StreamedScores]             # scorer -> its scores of those sequences
    metrics: dict[str, float]
    admitted: list[str] = field(default_factory=list)   # uids of the groups that entered the buffer this step
    # Wall-clock (time.time()) start and end of the step's decoding: with each sample's
    # `finished_at`, when its reward could have been asked for.
    started_at: float = 0.0
    decoded_at: float = 0.0
    plan: StepPlan | None = None   # what the step ran with (the mode's bounds applied): the run's plan record

    @property
    def lengths(self) -> list[list[int]]:
        """Response lengths of each trained group's samples, in `results` order."""
        return [[len(s.tokens) for s in rs] for rs in self.results.values()]


class RolloutScheduler:
    def __init__(self, overlap_cfg, prompts_per_step: int, hosts, scorers: dict | None = None, *,
                 resolve: Callable, is_death: Callable[[BaseException], bool] = never_died,
                 restore_host: Callable[[int], None] | None = None, frozen_scorers: Iterable[str] = (),
                 stream_hidden_prior: float = 0.0, clock: Callable[[], float] = time.monotonic,
                 on_finished: Callable[[list[PromptGroup], list[SequenceResult]], None] | None = None,
                 recorded_plans: Mapping[int, dict] | None = None,
                 feed: FeedSink | None = None, on_fed: Callable[[Any, list[str]], None] | None = None,
                 dynamic_sampling: DynamicSampling | None = None):
        self.mode = overlap_cfg.mode
        if self.mode not in MODES:
            raise ValueError(f"overlap.mode={self.mode!r}: expected one of {', '.join(MODES)}")
        self.streaming, self.overcommit = MODES[self.mode]
        self.B, self.hosts = prompts_per_step, hosts
        # How a call's result is awaited (ray.get, or the forecast's simulated clock), and
        # whether an error means the worker's process died (Ray's actor errors).
        self._get, self._is_death, self._clock = resolve, is_death, clock
        # Puts the current weights on a restarted host; None: a host's death is fatal.
        self.restore_host = restore_host
        self.host_restarts = 0
        # Streaming modes only: the scorers and a streamed reward (`on_finished`).
        self.streams = StreamLedger((scorers or {}) if self.streaming else {}, frozen_scorers,
                                    on_finished if self.streaming else None,
                                    resolve=resolve, is_death=is_death)
        # recorded_plans: `overlap.replay_plan`'s record (the caller reads it from MLflow).
        self.planner = make_planner(overlap_cfg, prompts_per_step, stream_hidden_prior, recorded_plans,
                                    streams_rewards=self.streams.on_finished is not None)
        # With a streamed reward every decode call's finished sequences are sent after
        # the call; with a `feed` (rollout/feed.py) the hosts also send them while the
        # call runs, so each goes soon after its last token, and after the call each
        # host's sends go to `on_fed(call, uids)` (the experience maker collects them).
        self.feeds = self.streams.on_finished is not None
        self.feed = feed if self.feeds and on_fed is not None else None
        self.on_fed = on_fed
        self.stop_check_every = int(overlap_cfg.stop_check_every)
        self.recheck_tokens = int(overlap_cfg.chunk_size)
        self.buffer: list[BufferedGroup] = []
        self.round = 0   # decode calls so far
        self.tick = 0    # decode rounds (one token for every live sequence) so far
        self.counts = {"groups_entered": 0, "groups_trained": 0, "groups_dropped": 0}
        self.dynamic = dynamic_sampling
        self._plan: StepPlan | None = None
        self._planned: tuple[int, float, float] | None = None   # (step, clock, wall clock) when planned
        self._step_info: dict = {}

    @property
    def scorers(self) -> dict:
        """The streaming scorers (name -> role group); none outside intra/oppo."""
        return self.streams.scorers

    # ---- knobs -----------------------------------------------------------------------
    def plan_for(self, step: int) -> StepPlan:
        plan = self.planner.plan(step)
        # The mode bounds what a planner may ask for: no streaming without scorers to
        # stream to, no overcommit outside inter/oppo.
        return StepPlan(plan.chunk if self.streaming and self.streams.active else None,
                        plan.delta if self.overcommit else 0, plan.predicted_s)

    # ---- one step ----------------------------------------------------------------------
    def groups_wanted(self, step: int) -> int:
        """Plan `step` (its chunk size and Δ) and say how many new prompt groups it
        admits: what refills the buffer to B + Δ. The step's rollout starts here."""
        if self._planned is None or self._planned[0] != step:
            t0, started_at = self._clock(), time.time()
            self._plan = self.plan_for(step)
            self._planned = (step, t0, started_at)
        return max(0, self.B + self._plan.delta - len(self.buffer))

    def rollout(self, step: int, new_groups: list[PromptGroup]) -> StepRollout:
        """Admit `new_groups` (at most `groups_wanted(step)`, asked first), decode until
        B groups are finished (all of them without overcommit), hand those over; the
        rest stays for the next step."""
        if self._planned is None or self._planned[0] != step:
            raise RuntimeError(f"step {step} was not planned: ask groups_wanted({step}) before its rollout")
        want = self.groups_wanted(step)
        if len(new_groups) > want:
            raise ValueError(f"step {step} admits {want} new prompt groups, not {len(new_groups)}: "
                             f"the buffer holds B + Δ = {self.B + self._plan.delta}")
        _, t0, started_at = self._planned
        self._planned = None
        plan = self._plan
        chunk, delta = plan.chunk, plan.delta
        self._begin_scorers(streaming=chunk is not None)
        admitted = list(new_groups)
        if admitted:
            self._admit(admitted)
        if self.dynamic is not None:
            self.dynamic.begin_step()
            self._drop_flat(step, admitted)   # carried groups that finished unjudged (a resume)
        rounds = ticks = rows = 0
        # Finished sequences sent to the reward before the decode's last call ended (by
        # the feed, or after an earlier call), and what the latest call's end sent.
        sent_early = sent_last = 0
        # Several hosts each stop at their share of the groups needed: calls of at most
        # `recheck_tokens` let the driver recount the groups finished overall.
        split = self.overcommit and self.hosts.world_size > 1
        call_tokens = chunk if chunk is not None else (self.recheck_tokens if split else None)
        while not self._enough():
            before = {s.uid: len(s.tokens) for e in self.buffer for s in e.samples.values()}
            quotas = self._quotas()
            feed = self.feed.for_groups({e.group.uid: e.group for e in self.buffer}) if self.feed else None
            calls = [self.hosts.call_rank(h, "decode", call_tokens, quotas[h], self.stop_check_every, feed)
                     for h in range(self.hosts.world_size)]
            replies = self._gather(calls)
            if feed is not None:
                sent_early += self._take_fed()
            touched = [r for results in replies for r in results or []]
            if not touched and None not in replies:
                self._lost_sequences()
            gained = {r.uid: len(r.tokens) - before.get(r.uid, 0) for r in touched}
            self.round, rounds = self.round + 1, rounds + 1
            self._record(touched, gained)
            call_ticks = max(gained.values(), default=0)
            self.tick, ticks, rows = self.tick + call_ticks, ticks + call_ticks, rows + sum(gained.values())
            if chunk is not None:
                self.streams.stream(touched, {e.group.uid: e for e in self.buffer})
            if self.feeds:   # what the feed has not sent yet
                sent_early += sent_last
                sent_last = self.streams.send_finished(touched, {e.group.uid: e.group for e in self.buffer})
            self._drop_flat(step, admitted)
        t_decoded = self._clock()
        chosen = self._select()
        waiting = {s.uid for e in self.buffer for s in e.samples.values() if s.done}
        streamed = self.streams.hand_over([s.uid for e in chosen for s in e.results()], waiting)
        results = {e.group.uid: e.results() for e in chosen}
        staleness = [step - min(s.versions) for rs in results.values() for s in rs if s.versions]
        carried_unfinished = sum(not e.done for e in self.buffer)
        out = StepRollout([e.group for e in chosen], results, streamed, {}, [g.uid for g in admitted],
                          started_at, time.time(), plan)
        self._step_info = {"decoded": ticks > 0, "samples": sum(len(rs) for rs in results.values()),
                           "lengths": out.lengths, "prompts": [len(e.group.prompt_ids) for e in chosen],
                           "decode_s": t_decoded - t0, "admitted": out.admitted}
        metrics = {"overlap/chunk": float(chunk or 0), "overlap/delta": float(delta),
                   "overlap/buffer_groups": float(len(self.buffer) + len(chosen)),
                   "overlap/carried_groups": float(len(self.buffer)),
                   "overlap/carried_unfinished_groups": float(carried_unfinished),
                   "overlap/decode_calls": float(rounds), "overlap/decode_rounds": float(ticks),
                   "overlap/rows_decoded": float(rows),
                   "overlap/rescored_sequences": float(self.streams.rescored),
                   "overlap/rewards_sent_during_decode": float(sent_early),
                   "perf/time/rollout_decode": t_decoded - t0,
                   **staleness_histogram(staleness)}
        if plan.predicted_s is not None:
            metrics["overlap/predicted_step_s"] = plan.predicted_s
        if self.dynamic is not None:
            metrics.update(self.dynamic.metrics(len(chosen)))
        out.metrics = metrics
        return out

    def end_step(self, step: int, times: StepTimes) -> dict[str, float]:
        """Feed the planner what this step measured (the phase times and mean reward the
        caller timed, decode costs from the hosts); returns the metrics to log: the
        decode costs and the planner's own."""
        stats = merge_decode_stats(self._get(self.hosts.call("take_decode_stats")))
        obs = StepObservation(step=step, plan=self._plan or StepPlan(None, 0),
                              step_s=times.step_s, rollout_s=times.rollout_s, scoring_s=times.scoring_s,
                              training_s=times.training_s, reward_wait_s=times.reward_wait_s,
                              mean_reward=times.mean_reward,
                              decode_stats=stats, trained_lengths=self._step_info.get("lengths", []),
                              trained_prompts=self._step_info.get("prompts", []),
                              samples=self._step_info.get("samples", 0),
                              decoded=self._step_info.get("decoded", False),
                              admitted=self._step_info.get("admitted", []))
        rounds_s = sum(secs for _, secs in stats["rounds"].values())
        # This step's round cost as a + b·live rows, whatever the planner: a serial run
        # logs what the forecast's profile=run needs without inferring it from totals.
        step_costs = CostFitter(decay=1.0)
        step_costs.observe_decode(stats)
        costs = step_costs.profile()
        return {"perf/time/decode_rounds": rounds_s, "perf/time/rollout_prefill": stats["prefill_seconds"],
                "perf/decode/round_fixed_ms": 1e3 * costs.round_fixed_s,
                "perf/decode/round_per_row_ms": 1e3 * costs.round_per_row_s,
                "perf/decode/prefill_tokens": float(stats["prefill_tokens"]),
                **prefix_cache_metrics(stats),
                **self.planner.observe(obs)}

    # ---- internals -----------------------------------------------------------------------
    def _begin_scorers(self, streaming: bool) -> None:
        """The carried sequences still decoding stay with the scorers (streaming steps only)."""
        live = {s.uid for e in self.buffer for s in e.samples.values() if not s.done} if streaming else set()
        self.streams.begin_step(live)

    def _take_fed(self) -> int:
        """What the hosts' feeds sent during the decode calls just gathered: each call to
        `on_fed`, its sequences marked sent; returns how many. A host that died since
        lost its sends; what it finished comes back with its restored sequences."""
        sent = 0
        for rank in range(self.hosts.world_size):
            try:
                fed = self._get(self.hosts.call_rank(rank, "take_fed"))
            except Exception as exc:
                if not self._is_death(exc):
                    raise
                continue
            for call, uids in fed:
                self.streams.mark_sent(uids)
                self.on_fed(call, uids)
                sent += len(uids)
        return sent

    def _quotas(self) -> list[int | None]:
        """Per host, the groups whose completion ends its decode call: with overcommit
        the B - finished groups still needed, spread over the hosts by their share of
        unfinished groups (one host: exactly the first B to finish); else None."""
        world = self.hosts.world_size
        if not self.overcommit:
            return [None] * world
        needed = self._target() - sum(e.done for e in self.buffer)
        open_by_host = [sum(1 for e in self.buffer if e.host == h and not e.done) for h in range(world)]
        total = max(1, sum(open_by_host))
        # Largest remainder: the quotas add up to exactly what is needed (rounding every
        # host up would let each run to its own quota past the B-th group overall).
        shares = [needed * o / total for o in open_by_host]
        quotas = [int(x) for x in shares]
        for h in sorted(range(world), key=lambda h: (quotas[h] - shares[h], h))[:needed - sum(quotas)]:
            quotas[h] += 1
        return [min(o, q) if o else None for o, q in zip(open_by_host, quotas)]

    def _admit(self, groups: list[PromptGroup]) -> None:
        world = self.hosts.world_size
        # New groups go to the host with the fewest unfinished groups: carried
        # stragglers count, so their hosts take fewer new prompts.
        load = [sum(1 for e in self.buffer if e.host == h and not e.done) for h in range(world)]
        per_host: list[list[RolloutRequest]] = [[] for _ in range(world)]
        for g in groups:
            h = min(range(world), key=lambda i: (load[i], i))
            load[h] += 1
            self.buffer.append(BufferedGroup(g, h))
            per_host[h].extend(g.requests())
        self.counts["groups_entered"] += len(groups)
        self._gather(self.hosts.call_split("add_requests", per_host))

    def _gather(self, refs: list) -> list:
        """One result per host; a host that died is restored (its result is None: the
        re-issued work runs in the next decode round)."""
        out = []
        for rank, ref in enumerate(refs):
            try:
                out.append(self._get(ref))
            except Exception as exc:
                if not self._is_death(exc) or self.restore_host is None:
                    raise
                self._restore(rank, exc)
                out.append(None)
        return out

    def _restore(self, rank: int, cause: BaseException) -> None:
        reqs, parts = self._unfinished([e for e in self.buffer if e.host == rank])
        log.warning("rollout host %d died or restarted (%s): restoring its weights and re-issuing its "
                    "%d unfinished sequences", rank, type(cause).__name__, len(reqs))
        self.restore_host(rank)
        self._get(self.hosts.call_rank(rank, "resume_sequences", reqs, parts))
        self._get(self.hosts.call_rank(rank, "mark_restored"))
        self.host_restarts += 1

    @staticmethod
    def _unfinished(entries: list[BufferedGroup]) -> tuple[list, list[SequenceResult]]:
        """The requests of every unfinished sequence in `entries`, with its latest state."""
        reqs, parts = [], []
        for entry in entries:
            for req in entry.group.requests():
                seen = entry.samples.get(req.uid)
                if seen is None or not seen.done:
                    reqs.append(req)
                    parts.append(seen or SequenceResult(req.uid, req.group, [], [], [], None))
        return reqs, parts

    def _lost_sequences(self) -> None:
        """No host advanced anything while groups wait unfinished: a host no longer
        holds their sequences. Waiting would never end; say which and stop."""
        lost = [s.uid for s in self._unfinished(self.buffer)[1]]
        raise RuntimeError(f"rollout hosts hold none of the {len(lost)} unfinished sequences the step waits for "
                           f"(e.g. {', '.join(lost[:4])}): a host dropped them. Restart the run from its last "
                           "checkpoint (trainer.resume=true); the checkpoint holds their tokens")

    def _target(self) -> int:
        """The finished groups an overcommit step waits for: B, or every group left in
        the buffer where dynamic sampling dropped more than its bound let it replace."""
        return min(self.B, len(self.buffer))

    def _enough(self) -> bool:
        finished = sum(e.done for e in self.buffer)
        return finished >= self._target() if self.overcommit else finished == len(self.buffer)

    def _drop_flat(self, step: int, admitted: list[PromptGroup]) -> None:
        """Dynamic sampling: ask about the groups that finished since the last call; those
        whose rewards do not spread leave the buffer (never trained, never carried, their
        streamed scores discarded) and new groups are admitted in their place, within the
        step's bound (`admitted` records them with the step's other admissions)."""
        if self.dynamic is None:
            return
        fresh = [e for e in self.buffer if e.done and not e.judged]
        if not fresh:
            return
        flat = self.dynamic.judge([e.group for e in fresh], {e.group.uid: e.results() for e in fresh})
        for e in fresh:
            e.judged = True
        dropped = [e for e in fresh if e.group.uid in flat]
        if not dropped:
            return
        self.buffer = [e for e in self.buffer if e.group.uid not in flat]
        self.streams.drop([s.uid for e in dropped for s in e.samples.values()])
        self.counts["groups_dropped"] += len(dropped)
        extra = self.dynamic.replace(len(dropped), step)
        if extra:
            self._admit(extra)
            admitted.extend(extra)

    def _record(self, touched: list[SequenceResult], gained: dict[str, int]) -> None:
        by_uid = {e.group.uid: e for e in self.buffer}
        for r in touched:
            entry = by_uid[r.group]
            before = entry.samples.get(r.uid)
            if before is not None and r.tokens[:len(before.tokens)] != before.tokens:
                raise RuntimeError(f"sequence {r.uid} lost tokens between decode rounds")
            entry.samples[r.uid] = r
        for e in self.buffer:
            if e.finished_tick is None and e.done:
                # Rows advance in lock step, so the tokens a sample gained in this call
                # say in which round of it the sample (and with the last, the group) ended.
                e.finished_tick = self.tick + max((gained.get(s.uid, 0) for s in e.samples.values()), default=0)

    def _select(self) -> list[BufferedGroup]:
        """The first B finished groups (by the round they finished in, then buffer
        order); FIFO for the rest."""
        position = {id(e): i for i, e in enumerate(self.buffer)}
        finished = sorted((e for e in self.buffer if e.done), key=lambda e: (e.finished_tick, position[id(e)]))
        take = self.B if self.overcommit else len(finished)
        if self.dynamic is not None:   # short of B: what divides over the ranks; the rest waits
            take = self.dynamic.batch_size(min(take, len(finished)), self.B)
        chosen = finished[:take]
        ids = {id(e) for e in chosen}
        self.buffer = [e for e in self.buffer if id(e) not in ids]
        chosen.sort(key=lambda e: (e.finished_tick, e.group.entered_step))
        self.counts["groups_trained"] += len(chosen)
        return chosen

    # ---- checkpoint state ---------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"round": self.round, "tick": self.tick, "counts": dict(self.counts),
                "planner": self.planner.state_dict(),
                "buffer": [{"uid": e.group.uid, "item_index": e.group.item_index,
                            "entered_step": e.group.entered_step, "host": e.host,
                            "finished_tick": e.finished_tick, "judged": e.judged,
                            "samples": {u: dataclasses.asdict(s) for u, s in e.samples.items()}}
                           for e in self.buffer]}

    def load_state_dict(self, state: dict, rebuild: Callable[[dict], PromptGroup]) -> None:
        """Restore the buffer; unfinished sequences go back to their hosts with their
        partial tokens. `rebuild(entry)` makes a PromptGroup from a saved buffer entry."""
        self.round, self.tick = state["round"], state.get("tick", 0)
        self.counts = {**self.counts, **state["counts"]}
        self.planner.load_state_dict(state["planner"])
        self.buffer = [BufferedGroup(rebuild(saved), saved["host"] % self.hosts.world_size,
                                     {u: SequenceResult(**s) for u, s in saved["samples"].items()},
                                     saved["finished_tick"], saved.get("judged", False))
                       for saved in state["buffer"]]
        per_host = [self._unfinished([e for e in self.buffer if e.host == h]) for h in range(self.hosts.world_size)]
        self._get([self.hosts.call_rank(h, "resume_sequences", reqs, parts)
                 for h, (reqs, parts) in enumerate(per_host) if reqs])
