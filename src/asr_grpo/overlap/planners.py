"""What each step runs with: the chunk size (None: no streaming) and the overcommit Δ.

Each overlap mode opens a search space: `intra` the chunk (streaming or not), `inter`
Δ (overcommit or not), `oppo` both; `overlap.controller` picks within it:

* `CostModelPlanner` (`cost_model`, the default for every mode): fits a cost model from
  the run's own timings and picks the plan with the least predicted time per trained
  sample; the reward-slope rule bounds Δ from above (it guards convergence, the cost
  model guards speed). It runs serial steps until its fit is ready, and stays serial
  unless overlap is predicted to pay: every mode is safe to leave on.
* `TrialPlanner` (`trial`): the OPPO paper's controllers: chunk by periodic trials, Δ
  by the slope of the reward.
* `FixedPlanner` (`fixed`, and `none`): `chunk_size` and `delta_init` every step, as
  far as the mode allows; the ablation that measures what a mode costs when forced.
* `ReplayPlanner` (`overlap.replay_plan=<MLflow run id>`, whatever the controller): the
  plans that run recorded (`plan_record`), step by step, so a comparison can repeat it
  exactly although its own timings would have planned differently.

Every planner carries its whole state in `state_dict()`: a resumed run plans as the
uninterrupted run would have from the same measurements.

`overlap.controller=<name>` picks the class registered under that name in `PLANNERS`
(a `Planner`, built by its `from_config`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Protocol, Sequence

from asr_grpo.config.registry import Registry
from asr_grpo.config.schema import OverlapMode
from asr_grpo.config.validate import ConfigError
from asr_grpo.overlap.controllers import ChunkSizeController, DeltaController
from asr_grpo.overlap.cost_model import CostFitter, best_plan

# mode -> (streams chunks to the scorers, overcommits B + Δ groups)
MODES = {OverlapMode.none: (False, False), OverlapMode.intra: (True, False),
         OverlapMode.inter: (False, True), OverlapMode.oppo: (True, True)}


@dataclass(frozen=True)
class StepPlan:
    chunk: int | None                  # tokens per streaming call; None: no streaming
    delta: int                         # groups admitted beyond B
    predicted_s: float | None = None   # the planner's forecast of the step (cost model)


@dataclass
class StepObservation:
    """What a finished step measured, as a planner needs it."""
    step: int
    plan: StepPlan
    step_s: float
    rollout_s: float
    scoring_s: float
    training_s: float
    decode_stats: dict = field(default_factory=dict)   # merged `take_decode_stats` of the hosts
    trained_lengths: list[list[int]] = field(default_factory=list)   # response lengths per trained group
    trained_prompts: list[int] = field(default_factory=list)         # prompt tokens per trained group
    samples: int = 0
    mean_reward: float = float("nan")
    decoded: bool = True
    admitted: list[str] = field(default_factory=list)   # uids of the groups that entered the buffer
    reward_wait_s: float = 0.0   # time blocked on reward results (perf/time/reward_wait)


@dataclass(frozen=True)
class PlannerContext:
    """What a planner is built with besides `overlap.*`: the run's B and what its mode allows."""
    prompts_per_step: int
    streams: bool                       # the mode streams chunks to the scorers (intra, oppo)
    overcommits: bool                   # the mode admits B + Δ groups (inter, oppo)
    stream_hidden_prior: float = 0.0    # first guess at the share of streamed scoring the decode hides
    streams_rewards: bool = False       # rewards are requested as sequences finish (a reward service)


class Planner(Protocol):
    """What the scheduler calls on a planner, and how `make_planner` builds one."""

    @classmethod
    def from_config(cls, cfg, ctx: PlannerContext) -> "Planner":
        """A planner for `overlap` config `cfg`, searching what `ctx` allows."""

    def plan(self, step: int) -> StepPlan:
        """The chunk and Δ step `step` runs with (the mode bounds them afterwards)."""

    def observe(self, obs: StepObservation) -> dict[str, float]:
        """Learn from a finished step; returns metrics to log."""

    def state_dict(self) -> dict:
        """Everything it has learnt (checkpointed with the run)."""

    def load_state_dict(self, state: dict) -> None: ...


PLANNERS: Registry[type[Planner]] = Registry("overlap.controller")


def merge_decode_stats(parts: list[dict]) -> dict:
    """The hosts' decode stats as one (rounds binned by live rows, summed)."""
    rounds: dict[int, list[float]] = {}
    summed = dict.fromkeys(("prefill_tokens", "prefill_seconds", "request_prompt_tokens", "cached_prompt_tokens"), 0)
    for part in parts:
        for rows, (count, s) in part.get("rounds", {}).items():
            slot = rounds.setdefault(int(rows), [0, 0.0])
            slot[0] += count
            slot[1] += s
        for key in summed:
            summed[key] += part.get(key, 0)
    return {"rounds": rounds, **summed}


def decode_seconds(stats: dict) -> float:
    return sum(s for _, s in stats.get("rounds", {}).values()) + stats.get("prefill_seconds", 0.0)


@PLANNERS.register("fixed")
class FixedPlanner:

    def __init__(self, chunk: int | None, delta: int):
        self._plan = StepPlan(chunk, delta)

    @classmethod
    def from_config(cls, cfg, ctx: PlannerContext) -> "FixedPlanner":
        return cls(int(cfg.chunk_size) if ctx.streams else None,
                   int(cfg.delta_init) if ctx.overcommits else 0)

    def plan(self, step: int) -> StepPlan:
        return self._plan

    def observe(self, obs: StepObservation) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


@PLANNERS.register("trial")
class TrialPlanner:
    """The paper's two controllers side by side (a mode without streaming runs no trials)."""

    def __init__(self, cfg, streams: bool = True):
        self.streams = streams
        self.chunk_ctrl = ChunkSizeController.from_config(cfg)
        self.delta_ctrl = DeltaController.from_config(cfg)

    @classmethod
    def from_config(cls, cfg, ctx: PlannerContext) -> "TrialPlanner":
        return cls(cfg, ctx.streams)

    def plan(self, step: int) -> StepPlan:
        chunk = self.chunk_ctrl.chunk_for_step(step) if self.streams else None
        return StepPlan(chunk or None, self.delta_ctrl.delta)

    def observe(self, obs: StepObservation) -> dict[str, float]:
        # A step that decoded nothing (enough groups were already finished) says
        # nothing about the chunk size it was given.
        if obs.decoded and self.streams:
            self.chunk_ctrl.observe(obs.step, obs.plan.chunk or 0, obs.step_s)
        self.delta_ctrl.observe(obs.mean_reward)
        return {}

    def state_dict(self) -> dict:
        return {"chunk_ctrl": self.chunk_ctrl.state_dict(), "delta_ctrl": self.delta_ctrl.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if state.get("chunk_ctrl"):
            self.chunk_ctrl.load_state_dict(state["chunk_ctrl"])
        if state.get("delta_ctrl"):
            self.delta_ctrl.load_state_dict(state["delta_ctrl"])


@PLANNERS.register("cost_model")
class CostModelPlanner:

    def __init__(self, cfg, prompts_per_step: int, stream_hidden_prior: float = 0.0,
                 streams: bool = True, overcommits: bool = True, streams_rewards: bool = False):
        self.B = prompts_per_step
        # Rewards from a service go out as sequences finish (the scheduler's feed, every
        # step of a streaming mode): the fit keeps the service's wait apart from the
        # local scoring, and it is the same whatever the plan.
        self.streams_rewards = streams_rewards and streams
        self.chunks = sorted({int(c) for c in cfg.chunk_candidates if int(c) > 0}) if streams else []
        self.overcommits = overcommits
        self.warmup = int(cfg.cost_model_warmup)
        self.margin = float(cfg.cost_model_margin)
        self.delta_bound = DeltaController.from_config(cfg)
        self.fitter = CostFitter(stream_hidden_prior=stream_hidden_prior)
        # The planned step's predicted decode (the same for any chunk): a streaming step's
        # decode is measured against it to see how much streaming slowed the decode.
        self._planned_decode_s: float | None = None

    @classmethod
    def from_config(cls, cfg, ctx: PlannerContext) -> "CostModelPlanner":
        return cls(cfg, ctx.prompts_per_step, ctx.stream_hidden_prior, ctx.streams, ctx.overcommits,
                   ctx.streams_rewards)

    def plan(self, step: int) -> StepPlan:
        self._planned_decode_s = None
        if step < self.warmup or not self.fitter.ready:
            return StepPlan(None, 0)
        choice, _ = best_plan(self.fitter.profile(), list(self.fitter.groups), self.B,
                              [None, *self.chunks], range(self.delta_bound.delta + 1 if self.overcommits else 1),
                              self.margin, list(self.fitter.prompts), fed=self.streams_rewards)
        self._planned_decode_s = choice.predicted.decode_s
        return StepPlan(choice.chunk, choice.delta, choice.predicted.step_s)

    def observe(self, obs: StepObservation) -> dict[str, float]:
        self.delta_bound.observe(obs.mean_reward)
        out = {"overlap/delta_bound": float(self.delta_bound.delta)}
        if obs.step < 1 or not obs.decoded:   # step 0 pays start-up costs; an idle step fits nothing
            return out
        fitter = self.fitter
        trained_tokens = sum(sum(g) for g in obs.trained_lengths)
        decode_s = decode_seconds(obs.decode_stats)
        streamed = obs.plan.chunk is not None
        predicted_decode = streamed_work = None
        if streamed and self._planned_decode_s is not None:
            predicted_decode = self._planned_decode_s
            streamed_work = fitter.profile().score_per_token_s * trained_tokens
        fitter.observe_decode(obs.decode_stats)
        fitter.observe_lengths(obs.trained_lengths, obs.trained_prompts or None)
        fitter.observe_step(streamed=streamed, decode_s=decode_s, scoring_s=obs.scoring_s,
                            training_s=obs.training_s, fixed_s=max(0.0, obs.step_s - decode_s - obs.scoring_s
                                                                   - obs.training_s),
                            samples=obs.samples, trained_tokens=trained_tokens,
                            predicted_decode_s=predicted_decode, streamed_work_s=streamed_work,
                            remote_wait_s=obs.reward_wait_s,
                            remote_sequences=obs.samples if self.streams_rewards else 0,
                            fed=self.streams_rewards)
        costs = fitter.profile()
        out.update({"overlap/cost/round_fixed_ms": 1e3 * costs.round_fixed_s,
                    "overlap/cost/round_per_row_ms": 1e3 * costs.round_per_row_s,
                    "overlap/cost/stream_hidden": costs.stream_hidden,
                    "overlap/cost/remote_per_seq_ms": 1e3 * costs.remote_per_seq_s,
                    "overlap/cost/remote_fed_wait_s": costs.remote_fed_wait_s,
                    "overlap/cost/measured_step_s": obs.step_s})
        if obs.plan.predicted_s is not None and math.isfinite(obs.plan.predicted_s):
            out["overlap/cost/prediction_error"] = obs.plan.predicted_s / obs.step_s - 1.0 if obs.step_s else 0.0
        return out

    def state_dict(self) -> dict:
        return {"fitter": self.fitter.state_dict(), "delta_ctrl": self.delta_bound.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if state.get("fitter"):
            self.fitter.load_state_dict(state["fitter"])
        if state.get("delta_ctrl"):
            self.delta_bound.load_state_dict(state["delta_ctrl"])


def plan_record(step: int, plan: StepPlan, admitted: Sequence[str]) -> dict:
    """One step's line of a run's plan record (what `ReplayPlanner` replays): the plan the
    step ran with, after the mode bounded it, and the groups it admitted."""
    return {"step": step, "chunk": plan.chunk, "delta": plan.delta, "admitted": list(admitted)}


class ReplayDiverged(ConfigError):
    """A replayed step admitted other prompt groups than the recorded one: another config or seed."""


class ReplayPlanner:
    """The plans of a recorded run (`overlap.replay_plan`), by step number. Timings play
    no part, so two replays, or a replay and its original, plan alike; each step's
    admissions are checked against the record, since a run that drifted from it would
    otherwise go on silently comparing something else."""

    def __init__(self, records: Mapping[int, dict], source: str):
        self.records = {int(step): rec for step, rec in records.items()}
        self.source = source   # the recorded run's id, for the messages

    def plan(self, step: int) -> StepPlan:
        rec = self.records.get(step)
        if rec is None:
            held = f"steps {min(self.records)}..{max(self.records)}" if self.records else "no step"
            raise ConfigError(f"overlap.replay_plan={self.source}: that run recorded no plan for step {step} "
                              f"(it holds {held}); replay at most as many steps as it ran")
        return StepPlan(rec["chunk"], int(rec["delta"]))

    def observe(self, obs: StepObservation) -> dict[str, float]:
        want = list(self.records[obs.step]["admitted"])
        if list(obs.admitted) != want:
            raise ReplayDiverged(
                f"overlap.replay_plan={self.source}: step {obs.step} admitted {len(obs.admitted)} prompt groups "
                f"{list(obs.admitted)[:4]} where the recorded run admitted {len(want)} {want[:4]}: this run does "
                "not repeat it (another config, seed or data)")
        return {}

    def state_dict(self) -> dict:
        return {}   # the record is the state: a resumed replay plans by step number

    def load_state_dict(self, state: dict) -> None:
        pass


def make_planner(cfg, prompts_per_step: int, stream_hidden_prior: float = 0.0,
                 recorded_plans: Mapping[int, dict] | None = None, streams_rewards: bool = False) -> Planner:
    """The planner `cfg.controller` names, searching what `cfg.mode` allows; with
    `cfg.replay_plan`, a `ReplayPlanner` of `recorded_plans` (that run's record, read
    from MLflow by the caller: this layer knows nothing of MLflow)."""
    if getattr(cfg, "replay_plan", ""):
        if recorded_plans is None:
            raise ValueError(f"overlap.replay_plan={cfg.replay_plan}: the caller must hand over that run's "
                             "recorded plans (recipes read them with tracking.plans.read_plans)")
        return ReplayPlanner(recorded_plans, cfg.replay_plan)
    streams, overcommits = MODES[OverlapMode(cfg.mode)]
    if not (streams or overcommits):
        return FixedPlanner(None, 0)
    ctx = PlannerContext(prompts_per_step, streams, overcommits, stream_hidden_prior, streams_rewards)
    return PLANNERS.get(cfg.controller).from_config(cfg, ctx)
