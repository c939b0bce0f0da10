"""One RL step, and a run of them, on the virtual clock: the project's `RolloutScheduler`
(and through it the overlap mode's planner) drives simulated engines and scorers; what
follows the rollout is simulated from the profile as `recipes/rl.py` `train_step` runs it.

After the rollout (the virtual now, when the last decode call ended):
  1. the actor's old log-probs start at once (the experience maker launches them first);
  2. each scorer scores what streaming did not cover, after its streamed calls;
     streamed work still queued on the rollout GPUs runs there first (the drain);
  3. the rule rewards follow the LM reward model's scores (CPU);
  4. a reward service (`remote_per_seq_s`): one slot drains the sequences at r seconds
     each (`service_drain`); under intra/oppo each is sent as it finishes (the
     scheduler's feed, as the recipe wires it: at its last token plus the feed's
     period, half waiting for the host's push and half for the driver's take),
     otherwise all at once after the decode (after the LM reward model's scores, which
     such a reward takes); the wait left when they are sent is added to the step's
     scoring;
  5. training starts when every score is in: actor and critic at once, taking turns
     where they share GPUs; then the weight sync, then the driver's fixed work.
Work on one device group runs one job at a time, in the order it was sent.
The scheduler's `end_step` gets the step's simulated phase times and the engines'
simulated decode statistics, so the cost-model planner fits and plans as in a run."""
from __future__ import annotations

import dataclasses
import statistics
from collections import Counter
from dataclasses import dataclass, field

from omegaconf import OmegaConf

from asr_grpo.config.schema import RemoteRewardConfig
from asr_grpo.forecast.clock import Lane, Span, VirtualClock, make_resolve
from asr_grpo.forecast.costs import SimProfile
from asr_grpo.forecast.hosts import SimEngine, SimHost
from asr_grpo.forecast.scorers import SimScorer
from asr_grpo.forecast.workload import Workload
from asr_grpo.overlap.cost_model import service_drain
from asr_grpo.overlap.local_group import LocalGroup
from asr_grpo.overlap.scheduler import RolloutScheduler
from asr_grpo.overlap.step_times import StepTimes

SCORER_NAMES = {"ref": "ref", "critic": "values", "reward_model": "lm"}   # the recipe's streaming scorer names
FROZEN = ("ref", "lm")                                                   # weights that never change
PHASES = ("rollout", "scoring", "training", "sync")


@dataclass
class StepRecord:
    step: int
    start: float
    rollout_end: float
    scoring_end: float
    training_end: float
    end: float
    chunk: int | None
    delta: int
    samples: int
    decode_rounds: float
    rows_decoded: float
    carried_unfinished: float
    stale_samples: int
    trained: list[str]                  # group uids, in the scheduler's order
    samples_of: dict[str, list[tuple[str, int, str]]]   # group uid -> (sample uid, tokens, finish reason)
    busy: dict[str, float]              # role -> busy seconds this step (per GPU of its group)
    spans: list[Span] = field(default_factory=list)
    reward_wait: float = 0.0            # seconds the step's scoring waited on the reward service

    @property
    def step_s(self) -> float:
        return self.end - self.start

    def phases(self) -> dict[str, float]:
        return {"rollout": self.rollout_end - self.start, "scoring": self.scoring_end - self.rollout_end,
                "training": self.training_end - self.scoring_end, "sync": self.end - self.training_end}


def mode_config(overlap_cfg, mode: str):
    """The run's overlap config with `mode` set (the scheduler and planner read it). A
    replayed run's record is not what the forecast asks about: its planners plan."""
    plain = OmegaConf.to_container(overlap_cfg, resolve=True) if OmegaConf.is_config(overlap_cfg) \
        else dataclasses.asdict(overlap_cfg)
    return OmegaConf.create({**plain, "mode": mode, "replay_plan": ""})


def reward_at(step: int, trend: str) -> float:
    """The mean reward the Δ controllers see: still improving (`rising`) or converged (`flat`)."""
    if trend == "rising":
        return 0.5 + 0.005 * step
    if trend == "flat":
        return 0.5
    raise ValueError(f"reward_trend={trend!r}: expected rising or flat")


class Simulation:
    def __init__(self, profile: SimProfile, workload: Workload, overlap_cfg, mode: str,
                 reward_trend: str = "rising"):
        self.profile, self.workload, self.mode, self.trend = profile, workload, mode, reward_trend
        self.clock = clock = VirtualClock()
        devices = {profile.rollout_device, *(r.device for r in profile.roles.values())}
        self.dev_lanes = {d: Lane(f"{d} GPUs") for d in sorted(devices)}
        self.cpu = Lane("driver CPU")
        engine_role = "actor" if profile.rollout_device == profile.roles["actor"].device else "rollout"
        self.hosts = [SimHost(SimEngine(workload, profile.decode, profile.prefill, Lane(f"engine {i}"), engine_role),
                              clock, profile.decode_call_s) for i in range(profile.hosts)]
        self.stream_lanes: dict[str, Lane] = {}
        self.scorers: dict[str, SimScorer] = {}
        for role in profile.streaming:
            if role not in profile.roles or role == "actor":
                continue
            cost = profile.roles[role]
            if cost.device == profile.rollout_device:   # shares the engines' GPUs: contends with decode
                lane = self.stream_lanes.setdefault(cost.device, Lane(f"{cost.device} GPUs, streamed"))
                contended, hidden = self.hosts, profile.stream_hidden
            else:
                lane, contended, hidden = self.dev_lanes[cost.device], [], 1.0
            self.scorers[role] = SimScorer(role, cost, workload, clock, lane, profile.stream_call_s, contended, hidden)
        groups = {SCORER_NAMES[r]: LocalGroup([s]) for r, s in self.scorers.items()}
        # A reward service is fed as sequences finish where the run fed it, unless the reward
        # takes the LM reward model's scores (they come after the rollout): `recipes/rl.py`'s rule.
        self.service = Lane("reward service")
        self._sent: list[float] = []    # when this step's sequences went to the service
        self._asked: set[str] = set()   # sequences already sent (carried groups' ones in earlier steps)
        streams_rewards = profile.remote_per_seq_s > 0 and profile.remote_fed and "reward_model" not in profile.roles
        # The cost-model planner's first guess, as the recipe makes it: scorers on GPUs of
        # their own hide everything; sharing the engines' GPUs, the placement's share.
        prior = profile.stream_hidden if self.stream_lanes else 1.0
        self.scheduler = RolloutScheduler(mode_config(overlap_cfg, mode), workload.B, LocalGroup(self.hosts), groups,
                                          frozen_scorers=FROZEN, stream_hidden_prior=prior,
                                          resolve=make_resolve(clock), clock=lambda: clock.now,
                                          on_finished=self._send_finished if streams_rewards else None)
        self._source = workload.source()

    # ---- one step --------------------------------------------------------------------------
    def _send_finished(self, groups, seqs) -> None:
        """The scheduler's `on_finished`: each sequence as it finished (the engines stamp
        their virtual time), sent half the feed's period later on average (the host
        sends what finished at most once a period)."""
        fresh = [s for s in seqs if s.uid not in self._asked]
        self._asked.update(s.uid for s in fresh)
        lag = RemoteRewardConfig.feed_every_s / 2
        self._sent += [(s.finished_at if s.finished_at is not None else self.clock.now) + lag for s in fresh]

    def _reward_wait(self, seqs, sent_at: float) -> float:
        """The service's wait left at `sent_at`, when the rest of the step's sequences go
        out. A step waits for all it sent (the last call holds trained sequences, and one
        slot answers in order), so the service starts every step idle."""
        rest = [s.uid for s in seqs if s.uid not in self._asked]
        arrivals, self._sent = self._sent + [sent_at] * len(rest), []
        self._asked.difference_update(s.uid for s in seqs)
        if self.profile.remote_per_seq_s <= 0 or not arrivals:
            return 0.0
        drained = service_drain(arrivals, self.profile.remote_per_seq_s)
        self.service.record("", "remote", min(arrivals), drained)
        return max(0.0, drained - sent_at)

    def step(self, step: int) -> StepRecord:
        p, clock = self.profile, self.clock
        t0 = clock.now
        ro = self.scheduler.rollout(step, self._source(self.scheduler.groups_wanted(step), step))
        t_r = max(clock.now, t0)
        prompt = {g.uid: self.workload.prompt_tokens(g.uid) for g in ro.groups}
        seqs = [s for g in ro.groups for s in ro.results[g.uid]]

        share = self.workload.train_share

        def scored(skip: set[str]) -> float:
            """Tokens a scorer forwards after the rollout: the responses of the samples that train,
            and each group's prompt once (the samples of one prompt share its prefill, as
            `score_once` does)."""
            chosen = [s for s in seqs if s.uid not in skip]
            return share * sum(len(s.tokens) for s in chosen) + sum(prompt[g] for g in {s.group for s in chosen})

        total = scored(set())
        trained = share * sum(prompt[s.group] + len(s.tokens) for s in seqs)   # every trained sequence whole
        for device, lane in self.stream_lanes.items():   # streamed work left when decoding ended
            if lane.free_at > t_r:
                self.dev_lanes[device].run(t_r, lane.free_at - t_r, "", "drain")
        ends = [t_r]
        actor = p.roles["actor"]
        if p.recompute_old_logprobs and total:
            ends.append(self.dev_lanes[actor.device].run(t_r, actor.forward(total), "actor", "old_logprobs"))
        lm_done = t_r
        for role in p.scorers():
            cost, scorer = p.roles[role], self.scorers.get(role)
            streamed = ro.streamed.get(SCORER_NAMES[role])
            covered = set(streamed.get()) if streamed is not None else set()
            end = max(t_r, scorer.last_done) if scorer is not None and streamed is not None else t_r
            rest = scored(covered)
            if rest:
                end = max(end, self.dev_lanes[cost.device].run(t_r, cost.forward(rest), role, "score"))
            ends.append(end)
            if role == "reward_model":
                lm_done = end
        ends.append(self.cpu.run(lm_done, p.reward_per_sample_s * len(seqs), "reward", "reward"))
        # Added to the local scoring, not overlapped with it: the run fit took the local
        # scoring as the wall less this wait, and `cost_model.predict` adds them the same way.
        wait = self._reward_wait(seqs, lm_done if "reward_model" in p.roles else t_r)
        scoring_end = max(ends) + wait
        train_ends = [scoring_end]
        for role in ("actor", "critic"):
            cost = p.roles.get(role)
            if cost is not None and trained:
                seconds = p.train_epochs * cost.train_per_token_s * trained + cost.train_fixed_s
                train_ends.append(self.dev_lanes[cost.device].run(scoring_end, seconds, role, "train"))
        training_end = max(train_ends)
        synced = self.dev_lanes[actor.device].run(training_end, p.sync_s, "actor", "sync")
        end = self.cpu.run(synced, p.step_fixed_s, "driver", "driver")
        clock.advance_to(end)
        times = StepTimes(step_s=end - t0, rollout_s=t_r - t0, scoring_s=scoring_end - t_r,
                          training_s=training_end - scoring_end, sync_s=end - training_end,
                          reward_wait_s=wait, mean_reward=reward_at(step, self.trend))
        self.scheduler.end_step(step, times)
        for h in self.hosts:
            h.set_policy_version(step + 1)   # what the weight sync does: carried sequences rebuild
            h.debt = 0.0
        spans = [s for lane in self._lanes() for s in lane.take_spans()]
        m = ro.metrics
        return StepRecord(step, t0, t_r, scoring_end, training_end, end, int(m["overlap/chunk"]) or None,
                          int(m["overlap/delta"]), len(seqs), m["overlap/decode_rounds"], m["overlap/rows_decoded"],
                          m["overlap/carried_unfinished_groups"],
                          int(round(m["overlap/staleness_frac_ge1"] * len(seqs))), [g.uid for g in ro.groups],
                          {g: [(s.uid, len(s.tokens), s.finish_reason) for s in rs] for g, rs in ro.results.items()},
                          self._busy(spans), spans, wait)

    def run(self, steps: int) -> list[StepRecord]:
        return [self.step(k) for k in range(steps)]

    # ---- bookkeeping ----------------------------------------------------------------------
    def _lanes(self) -> list[Lane]:
        return [h.engine.lane for h in self.hosts] + list(self.stream_lanes.values()) \
            + list(self.dev_lanes.values()) + [self.cpu, self.service]

    def _busy(self, spans: list[Span]) -> dict[str, float]:
        """Busy seconds per role; an engine's time counts as its share of the engines."""
        busy: Counter = Counter()
        engines = {h.engine.lane.name for h in self.hosts}
        for s in spans:
            if not s.role or s.kind in ("drain", "contention"):
                continue
            busy[s.role] += (s.end - s.start) / (len(engines) if s.lane in engines else 1)
        return dict(busy)


@dataclass
class ModeResult:
    mode: str
    steps: list[StepRecord]
    warmup: int

    @property
    def measured(self) -> list[StepRecord]:
        return self.steps[self.warmup:] or self.steps

    def summary(self) -> dict:
        steps = self.measured
        med = lambda xs: float(statistics.median(xs))  # noqa: E731
        step_s = med([s.step_s for s in steps])
        samples = max(1, med([s.samples for s in steps]))
        roles = sorted({r for s in steps for r in s.busy})
        wall = statistics.fmean(s.step_s for s in steps)
        busy = {r: statistics.fmean(s.busy.get(r, 0.0) for s in steps) for r in roles}
        plans = Counter((s.chunk, s.delta) for s in steps)
        (chunk, delta), _ = plans.most_common(1)[0]
        return {"step_s": step_s, "mean_step_s": wall, "per_sample_s": step_s / samples, "samples_per_step": samples,
                "phases_s": {k: med([s.phases()[k] for s in steps]) for k in PHASES},
                "reward_wait_s": med([s.reward_wait for s in steps]),
                "busy_s": busy, "util": {r: b / wall for r, b in busy.items()},
                "idle_s": {r: max(0.0, wall - b) for r, b in busy.items()},
                "chunk": chunk, "delta": delta,
                "plans": {f"{c or 0}/{d}": n for (c, d), n in sorted(plans.items(), key=lambda kv: -kv[1])},
                "decode_rounds": statistics.fmean(s.decode_rounds for s in steps),
                "rows_decoded": statistics.fmean(s.rows_decoded for s in steps),
                "carried_unfinished_groups": statistics.fmean(s.carried_unfinished for s in steps),
                "stale_share": sum(s.stale_samples for s in steps) / max(1, sum(s.samples for s in steps)),
                "steps_measured": len(steps)}

    def typical_step(self) -> StepRecord:
        """The measured step closest to the median step time (the Gantt plot's)."""
        target = self.summary()["step_s"]
        return min(self.measured, key=lambda s: abs(s.step_s - target))


def simulate(profile: SimProfile, workload: Workload, overlap_cfg, modes=("none", "intra", "inter", "oppo"),
             steps: int = 40, warmup: int = 8, reward_trend: str = "rising") -> dict[str, ModeResult]:
    """Every mode over the same prompts, each from a fresh clock."""
    if steps <= warmup:
        raise ValueError(f"steps={steps} must exceed warmup={warmup}: no step would be measured")
    return {m: ModeResult(m, Simulation(profile, workload, overlap_cfg, m, reward_trend).run(steps), warmup)
            for m in modes}
