"""The rollout scheduler: the one place the overlap modes differ.

- none:  decode every sequence to its end in one call; the scorers run afterwards.
- intra: decode `chunk` tokens at a time; after each chunk the new tokens go to the
         streaming scorers (their own Ray actors), which prefill them while the actor
         decodes the next chunk. The experience is the same as `none`'s.
- inter: keep a FIFO buffer of B + Δ prompt groups, decode until B groups are finished,
         train on those, carry the rest (with every token they have) into the next step.
- oppo:  both, with the chunk size and Δ chosen online by the controllers.

Rollout hosts (policy ranks or rollout workers) keep the live sequences between steps;
this driver-side object keeps the latest state of every sequence, which is what a
checkpoint stores and what a resume puts back, and what a rollout worker that died
mid-step (Ray restarts it) gets back: `restore_host(rank)` (the recipe's: the current
weights) and then its unfinished sequences with their tokens so far. A streaming scorer
that died loses the calls in flight; `StreamedScores` leaves those sequences out and
the experience maker scores them again in one shot.
"""
from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field
from typing import Callable

import ray
import torch

from asr_grpo.distributed.faults import is_actor_death
from asr_grpo.experience.types import PromptGroup, SequenceRef
from asr_grpo.overlap.controllers import ChunkSizeController, DeltaController, staleness_histogram
from asr_grpo.rollout.types import RolloutRequest, SequenceResult

log = logging.getLogger(__name__)

# mode -> (stream chunks to the scorers, overcommit the buffer)
MODES = {"none": (False, False), "intra": (True, False), "inter": (False, True), "oppo": (True, True)}


@dataclass
class BufferedGroup:
    group: PromptGroup
    host: int
    samples: dict[str, SequenceResult] = field(default_factory=dict)
    finished_round: int | None = None   # decode round in which its last sample finished

    @property
    def done(self) -> bool:
        return len(self.samples) == self.group.n and all(s.done for s in self.samples.values())

    def results(self) -> list[SequenceResult]:
        return [self.samples[r.uid] for r in self.group.requests()]


class StreamedScores:
    """What one streaming scorer returns for the sequences trained on this step. Which
    sequences it covers is known at once; `get()` waits for its last chunks, so the
    caller can start other work (the actor's old log-probs) while the scorers drain."""

    def __init__(self, uids: set[str], pending: list):
        self.uids, self._pending, self._scores = uids, pending, None
        self.lost_calls = 0   # calls a scorer restart lost: their sequences are missing from get()

    def get(self) -> dict[str, torch.Tensor]:
        if self._scores is None:
            merged: dict[str, torch.Tensor] = {}
            for ref in self._pending:
                try:
                    merged.update(ray.get(ref))
                except Exception as exc:
                    if not is_actor_death(exc):
                        raise
                    self.lost_calls += 1
            if self.lost_calls:
                log.warning("a streaming scorer restarted: %d of its calls were lost", self.lost_calls)
            self._scores = {u: merged[u] for u in self.uids if u in merged}
        return self._scores


@dataclass
class StepRollout:
    groups: list[PromptGroup]                       # the B groups to train on
    results: dict[str, list[SequenceResult]]        # group uid -> its n samples
    streamed: dict[str, StreamedScores]             # scorer -> its scores of those sequences
    metrics: dict[str, float]


class RolloutScheduler:
    def __init__(self, overlap_cfg, prompts_per_step: int, hosts, scorers: dict | None = None,
                 restore_host: Callable[[int], None] | None = None):
        self.mode = overlap_cfg.mode
        if self.mode not in MODES:
            raise ValueError(f"overlap.mode={self.mode!r}: expected one of {', '.join(MODES)}")
        self.streaming, self.overcommit = MODES[self.mode]
        self.B, self.hosts = prompts_per_step, hosts
        # Puts the current weights on a restarted host; None: a host's death is fatal.
        self.restore_host = restore_host
        self.host_restarts = 0
        self.scorers = dict(scorers or {}) if self.streaming else {}
        adaptive = self.mode == "oppo"
        self.chunk_ctrl = ChunkSizeController.from_config(overlap_cfg) if adaptive else None
        self.delta_ctrl = DeltaController.from_config(overlap_cfg) if adaptive else None
        self.fixed_chunk = None if self.mode == "none" else overlap_cfg.chunk_size
        self.fixed_delta = overlap_cfg.delta_init if self.mode == "inter" else 0
        self.buffer: list[BufferedGroup] = []
        self.round = 0
        self._rounds_last_step = 0
        self.counts = {"groups_entered": 0, "groups_trained": 0}
        self.ledger: dict[str, list] | None = None   # set to {} to record every group (tests)
        self._registered: set[tuple[str, str]] = set()   # (scorer, sequence uid)
        self._pending: dict[str, list] = {name: [] for name in self.scorers}       # this step's calls
        self._finishing: dict[str, set[str]] = {name: set() for name in self.scorers}  # finished this step

    # ---- knobs -----------------------------------------------------------------------
    def chunk_for(self, step: int) -> int | None:
        return self.chunk_ctrl.chunk_for_step(step) if self.chunk_ctrl else self.fixed_chunk

    @property
    def delta(self) -> int:
        return self.delta_ctrl.delta if self.delta_ctrl else self.fixed_delta

    # ---- one step ----------------------------------------------------------------------
    def rollout(self, step: int, new_groups: Callable[[int], list[PromptGroup]]) -> StepRollout:
        """Refill the buffer to B + Δ, decode until B groups are finished (all of them
        without overcommit), hand those over; the rest stays for the next step."""
        t0 = time.monotonic()
        chunk, delta = self.chunk_for(step), self.delta
        want = self.B + delta - len(self.buffer)
        if self.scorers:
            # Scorer caches live for one step: carried sequences are re-prefilled in the
            # next one. The critic's weights changed anyway, and this is what makes a run
            # resumed from a checkpoint score exactly like the uninterrupted run.
            ray.get([ref for g in self.scorers.values() for ref in g.call("reset_stream_caches")])
            self._registered.clear()
        if want > 0:
            self._admit(new_groups(want))
        rounds = 0
        while not self._enough():
            per_host = [r or [] for r in self._gather(self.hosts.call("decode", chunk))]
            self.round, rounds = self.round + 1, rounds + 1
            touched = [r for results in per_host for r in results]
            self._record(touched)
            if self.streaming:
                self._stream(touched)
        t_decoded = time.monotonic()
        self._rounds_last_step = rounds
        chosen = self._select()
        streamed = self._hand_over_streamed(chosen)
        results = {e.group.uid: e.results() for e in chosen}
        staleness = [step - min(s.versions) for rs in results.values() for s in rs if s.versions]
        metrics = {"overlap/chunk": float(chunk or 0), "overlap/delta": float(delta),
                   "overlap/buffer_groups": float(len(self.buffer) + len(chosen)),
                   "overlap/carried_groups": float(len(self.buffer)),
                   "overlap/decode_rounds": float(rounds),
                   "perf/time/rollout_decode": t_decoded - t0,
                   **staleness_histogram(staleness)}
        return StepRollout([e.group for e in chosen], results, streamed, metrics)

    def end_step(self, step: int, chunk: int | None, step_seconds: float, mean_reward: float) -> None:
        """Feed the controllers what this step measured."""
        # A step that decoded nothing (enough groups were already finished) says
        # nothing about the chunk size it was given.
        if self.chunk_ctrl is not None and chunk and self._rounds_last_step:
            self.chunk_ctrl.observe(step, chunk, step_seconds)
        if self.delta_ctrl is not None:
            self.delta_ctrl.observe(mean_reward)

    # ---- internals -----------------------------------------------------------------------
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
        if self.ledger is not None:
            self.ledger.setdefault("entered", []).extend(g.uid for g in groups)
        self._gather(self.hosts.call_split("add_requests", per_host))

    def _gather(self, refs: list) -> list:
        """One result per host; a host that died is restored (its result is None: the
        re-issued work runs in the next decode round)."""
        out = []
        for rank, ref in enumerate(refs):
            try:
                out.append(ray.get(ref))
            except Exception as exc:
                if not is_actor_death(exc) or self.restore_host is None:
                    raise
                self._restore(rank, exc)
                out.append(None)
        return out

    def _restore(self, rank: int, cause: BaseException) -> None:
        reqs, parts = self._unfinished([e for e in self.buffer if e.host == rank])
        log.warning("rollout host %d died or restarted (%s): restoring its weights and re-issuing its "
                    "%d unfinished sequences", rank, type(cause).__name__, len(reqs))
        self.restore_host(rank)
        ray.get(self.hosts.call_rank(rank, "resume_sequences", reqs, parts))
        ray.get(self.hosts.call_rank(rank, "mark_restored"))
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

    def _enough(self) -> bool:
        finished = sum(e.done for e in self.buffer)
        return finished >= self.B if self.overcommit else finished == len(self.buffer)

    def _record(self, touched: list[SequenceResult]) -> None:
        by_uid = {e.group.uid: e for e in self.buffer}
        for r in touched:
            entry = by_uid[r.group]
            before = entry.samples.get(r.uid)
            if before is not None and r.tokens[:len(before.tokens)] != before.tokens:
                raise RuntimeError(f"sequence {r.uid} lost tokens between decode rounds")
            entry.samples[r.uid] = r
        for e in self.buffer:
            if e.finished_round is None and e.done:
                e.finished_round = self.round

    def _select(self) -> list[BufferedGroup]:
        """The first B finished groups (by round, then buffer order); FIFO for the rest."""
        finished = sorted((e for e in self.buffer if e.done),
                          key=lambda e: (e.finished_round, self.buffer.index(e)))
        chosen = finished[:self.B] if self.overcommit else finished
        ids = {id(e) for e in chosen}
        self.buffer = [e for e in self.buffer if id(e) not in ids]
        chosen.sort(key=lambda e: (e.finished_round, e.group.entered_step))
        self.counts["groups_trained"] += len(chosen)
        if self.ledger is not None:
            self.ledger.setdefault("trained", []).append([e.group.uid for e in chosen])
        return chosen

    def _stream(self, touched: list[SequenceResult]) -> None:
        """Send this round's tokens to every streaming scorer without waiting."""
        entries = {e.group.uid: e for e in self.buffer}
        for name, scorer in self.scorers.items():
            world = scorer.world_size
            register = [[] for _ in range(world)]
            feed: list[dict[str, list[int]]] = [{} for _ in range(world)]
            finish = [[] for _ in range(world)]
            for r in touched:
                entry = entries[r.group]
                rank = entry.host % world
                if (name, r.uid) not in self._registered:
                    register[rank].append(SequenceRef(r.uid, entry.group.prompt_ids, [], entry.group.features,
                                                      entry.group.utterance["language"]))
                    self._registered.add((name, r.uid))
                feed[rank][r.uid] = r.tokens
                if r.done:
                    finish[rank].append(r.uid)
                    self._finishing[name].add(r.uid)
                    self._registered.discard((name, r.uid))
            for rank in range(world):
                if feed[rank] or register[rank]:
                    self._pending[name].append(
                        scorer.handles[rank].stream.remote(register[rank], feed[rank], finish[rank]))

    def _hand_over_streamed(self, chosen: list[BufferedGroup]) -> dict[str, StreamedScores]:
        """This step's scorer calls go to the experience maker. Only sequences that
        finished during this step are covered: a group that finished earlier but waited
        is scored again when trained on, with that step's weights (as serially)."""
        uids = [s.uid for e in chosen for s in e.results()]
        out = {name: StreamedScores({u for u in uids if u in self._finishing[name]}, self._pending[name])
               for name in self.scorers}
        self._pending = {name: [] for name in self.scorers}
        self._finishing = {name: set() for name in self.scorers}
        return out

    # ---- checkpoint state ---------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"round": self.round, "counts": dict(self.counts),
                "chunk_ctrl": self.chunk_ctrl.state_dict() if self.chunk_ctrl else None,
                "delta_ctrl": self.delta_ctrl.state_dict() if self.delta_ctrl else None,
                "buffer": [{"uid": e.group.uid, "item_index": e.group.item_index,
                            "entered_step": e.group.entered_step, "host": e.host,
                            "finished_round": e.finished_round,
                            "samples": {u: dataclasses.asdict(s) for u, s in e.samples.items()}}
                           for e in self.buffer]}

    def load_state_dict(self, state: dict, rebuild: Callable[[dict], PromptGroup]) -> None:
        """Restore the buffer; unfinished sequences go back to their hosts with their
        partial tokens. `rebuild(entry)` makes a PromptGroup from a saved buffer entry."""
        self.round, self.counts = state["round"], dict(state["counts"])
        if self.chunk_ctrl and state["chunk_ctrl"]:
            self.chunk_ctrl.load_state_dict(state["chunk_ctrl"])
        if self.delta_ctrl and state["delta_ctrl"]:
            self.delta_ctrl.load_state_dict(state["delta_ctrl"])
        self.buffer = [BufferedGroup(rebuild(saved), saved["host"] % self.hosts.world_size,
                                     {u: SequenceResult(**s) for u, s in saved["samples"].items()},
                                     saved["finished_round"])
                       for saved in state["buffer"]]
        per_host = [self._unfinished([e for e in self.buffer if e.host == h]) for h in range(self.hosts.world_size)]
        ray.get([self.hosts.call_rank(h, "resume_sequences", reqs, parts)
                 for h, (reqs, parts) in enumerate(per_host) if reqs])
