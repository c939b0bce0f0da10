"""A new rollout engine is an engine, its registration (with the actor that hosts it) and a
config value: one defined here, chosen by `rollout.engine`, gets the rollout slots it asks
for, is the actor the run starts for its rollout role, and decodes there."""
from __future__ import annotations

import pytest
from extensions.scripted import EOS, LENGTH, TOKEN, ThreeTokenEngine, prompt_groups
from helpers import compose_cfg

from asr_grpo.config.validate import ConfigError, config_problems, validate_config
from asr_grpo.distributed.placement import plan_placement, role_counts
from asr_grpo.rollout.host import EngineHost
from asr_grpo.workers.rollout import ROLLOUT_ENGINES, EngineSpec, rollout_ranks, rollout_role_spec


class ThreeTokenRole(EngineHost):
    """The actor hosting the engine: built from the run config, as a Ray role is."""

    def __init__(self, cfg):
        self.cfg, self.engine = cfg, ThreeTokenEngine()


@pytest.fixture
def three_token_engine():
    @ROLLOUT_ENGINES.register("test_three_token")
    class ThreeTokenSpec(EngineSpec):
        role = ThreeTokenRole
        missing: str | None = None   # what unavailable_reason reports (the test sets it)

        @classmethod
        def unavailable_reason(cls) -> str | None:
            return cls.missing

    yield ThreeTokenSpec
    ROLLOUT_ENGINES.unregister("test_three_token")


def _plan(cfg):
    counts = role_counts(cfg.placement, use_critic=False, use_ref=True)
    counts["rollout"] = rollout_ranks(cfg)
    return plan_placement(cfg.placement, counts)


def test_the_run_places_and_starts_its_actor_and_the_engine_decodes(three_token_engine, tmp_path):
    cfg = compose_cfg(tmp_path, "rollout.engine=test_three_token", "placement=separate",
                      "placement.rollout_num_workers=2")
    validate_config(cfg)
    assert rollout_ranks(cfg) == 2   # workers of its own, one slot each (the default)
    plan = _plan(cfg)
    role, role_plan, kwargs = rollout_role_spec(cfg, plan)
    assert role is ThreeTokenRole and role_plan is plan and kwargs == {}
    assert len(plan.ranks("rollout")) == 2
    host = role(cfg, **kwargs)
    (group,) = prompt_groups(1, n=2)
    assert host.add_requests(group.requests()) == 2
    results = host.decode()
    assert [r.tokens for r in results] == [[TOKEN] * (LENGTH - 1) + [EOS]] * 2


def test_what_keeps_it_from_running_here_fails_the_validation(three_token_engine, tmp_path):
    three_token_engine.missing = "needs the three-token accelerator"
    problems = config_problems(compose_cfg(tmp_path, "rollout.engine=test_three_token"))
    assert "rollout.engine=test_three_token: needs the three-token accelerator" in problems


def test_an_unknown_engine_is_a_one_line_error_listing_the_engines(three_token_engine, tmp_path):
    with pytest.raises(ConfigError) as err:
        validate_config(compose_cfg(tmp_path, "rollout.engine=three_token"))
    assert str(err.value) == ("invalid configuration: rollout.engine=three_token: expected one of hf, vllm, "
                              "test_three_token")
