"""A new planner is a class, its registration and a config value: one defined here, chosen
by `overlap.controller`, is what `make_planner` builds and what the scheduler plans with
(and tells what each step measured)."""
from __future__ import annotations

import pytest
from extensions.scripted import ThreeTokenEngine, prompt_groups
from helpers import compose_cfg
from omegaconf import OmegaConf

from asr_grpo.config.schema import OverlapConfig
from asr_grpo.config.validate import ConfigError, validate_config
from asr_grpo.overlap.local_group import LocalGroup, local_resolve
from asr_grpo.overlap.planners import PLANNERS, PlannerContext, StepObservation, StepPlan, make_planner
from asr_grpo.overlap.scheduler import RolloutScheduler
from asr_grpo.overlap.step_times import StepTimes
from asr_grpo.rollout.host import EngineHost

B, N = 2, 2


class StepParityPlanner:
    """Overcommits by `overlap.delta_init` on even steps, not at all on odd ones."""

    def __init__(self, delta: int, ctx: PlannerContext):
        self.delta, self.ctx = delta, ctx
        self.seen: list[StepObservation] = []

    @classmethod
    def from_config(cls, cfg, ctx: PlannerContext) -> "StepParityPlanner":
        return cls(int(cfg.delta_init), ctx)

    def plan(self, step: int) -> StepPlan:
        return StepPlan(None, self.delta if step % 2 == 0 else 0)

    def observe(self, obs: StepObservation) -> dict[str, float]:
        self.seen.append(obs)
        return {"overlap/test_parity_observed": float(len(self.seen))}

    def state_dict(self) -> dict:
        return {"seen": len(self.seen)}

    def load_state_dict(self, state: dict) -> None:
        pass


@pytest.fixture
def parity_planner():
    PLANNERS.register("test_parity")(StepParityPlanner)
    yield StepParityPlanner
    PLANNERS.unregister("test_parity")


class Host(EngineHost):
    def __init__(self):
        self.engine = ThreeTokenEngine()


def overlap_cfg(**kw):
    return OmegaConf.structured(OverlapConfig(**{"mode": "inter", "controller": "test_parity",
                                                 "delta_init": 3, **kw}))


def test_make_planner_builds_it_with_what_the_mode_allows(parity_planner):
    planner = make_planner(overlap_cfg(), prompts_per_step=B)
    assert isinstance(planner, StepParityPlanner) and planner.delta == 3
    assert planner.ctx == PlannerContext(prompts_per_step=B, streams=False, overcommits=True)


def test_the_scheduler_plans_with_it_and_tells_it_each_step(parity_planner):
    sched = RolloutScheduler(overlap_cfg(), B, LocalGroup([Host()]), resolve=local_resolve)
    assert isinstance(sched.planner, StepParityPlanner)
    times = StepTimes(step_s=1.0, rollout_s=0.5, scoring_s=0.2, training_s=0.2, sync_s=0.1, reward_wait_s=0.0,
                      mean_reward=0.5)
    # Step 0 fills the buffer to B + 3; its 3 extra groups carry over, so step 1 (Δ = 0) admits none.
    admitted = 0
    for step, (delta, wanted) in enumerate([(3, B + 3), (0, 0)]):
        assert sched.groups_wanted(step) == wanted
        out = sched.rollout(step, prompt_groups(wanted, N, step, first=admitted))
        admitted += wanted
        assert out.plan == StepPlan(None, delta) and len(out.groups) == B
        assert sched.end_step(step, times)["overlap/test_parity_observed"] == step + 1
    assert [(o.step, o.plan.delta, o.step_s) for o in sched.planner.seen] == [(0, 3, 1.0), (1, 0, 1.0)]


def test_the_config_selects_it_and_an_unknown_name_lists_the_planners(parity_planner, tmp_path):
    validate_config(compose_cfg(tmp_path, "overlap=inter", "overlap.controller=test_parity"))
    with pytest.raises(ConfigError) as err:
        validate_config(compose_cfg(tmp_path, "overlap=inter", "overlap.controller=parity"))
    assert str(err.value) == ("invalid configuration: overlap.controller=parity: "
                              "expected one of fixed, trial, cost_model, test_parity")
