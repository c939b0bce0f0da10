"""Where rollout=vllm puts its engines and how they join the weight sync: slots per
engine (tensor parallel), the sync group's backend, and the config group itself."""
from __future__ import annotations

import importlib.util

import pytest
from helpers import compose_cfg
from omegaconf import OmegaConf

from asr_grpo.config.validate import ConfigError, config_problems, validate_config
from asr_grpo.distributed.placement import plan_placement, role_counts
from asr_grpo.workers.rollout import RolloutRole, rollout_ranks, rollout_role_spec, sync_backend
from asr_grpo.workers.vllm_rollout import engine_plan

HAVE_VLLM = importlib.util.find_spec("vllm") is not None


def _plan(cfg):
    counts = role_counts(cfg.placement, use_critic=False, use_ref=True)
    counts["rollout"] = rollout_ranks(cfg)
    return plan_placement(cfg.placement, counts)


def test_default_is_the_hf_engine_as_before(tmp_path):
    cfg = compose_cfg(tmp_path)
    assert cfg.rollout.engine == "hf"
    assert rollout_ranks(cfg) == 0   # colocated HF: the actor ranks decode
    separate = compose_cfg(tmp_path, "placement=separate")
    assert rollout_ranks(separate) == 1
    cls, plan, extra = rollout_role_spec(separate, _plan(separate))
    assert cls is RolloutRole and extra == {}
    assert sync_backend(separate) in ("gloo", "nccl")


def test_vllm_group_composes_typed(tmp_path):
    cfg = compose_cfg(tmp_path, "rollout=vllm", "rollout.tensor_parallel_size=2")
    OmegaConf.resolve(cfg)
    assert cfg.rollout.engine == "vllm" and cfg.rollout.dtype == cfg.model.dtype
    assert cfg.rollout.export_dir == f"{tmp_path}/checkpoints/vllm"
    with pytest.raises(Exception, match="tensor_parallel_sizze"):
        compose_cfg(tmp_path, "rollout=vllm", "rollout.tensor_parallel_sizze=2")


def test_colocated_vllm_engines_share_the_actor_bundles(tmp_path):
    cfg = compose_cfg(tmp_path, "rollout=vllm", "placement.actor_gpus=0.5", "placement.rollout_gpus=0.4")
    assert rollout_ranks(cfg) == 1
    plan = _plan(cfg)
    bundles = {role: [s.bundle_index for s in plan.ranks(role)] for role in ("rollout", "actor")}
    assert bundles["rollout"] == [0] == bundles["actor"]
    assert sync_backend(cfg) == "gloo"   # one GPU for both ends: NCCL would refuse
    assert sync_backend(compose_cfg(tmp_path, "rollout=vllm", "rollout.sync_backend=nccl")) == "nccl"
    # The default fractions leave no room next to actor 0.75 + ref 0.1: said at planning time.
    with pytest.raises(ValueError, match="placement.rollout_gpus"):
        _plan(compose_cfg(tmp_path, "rollout=vllm"))


def test_tensor_parallel_engines_span_consecutive_bundles(tmp_path):
    cfg = compose_cfg(tmp_path, "rollout=vllm", "placement=separate", "placement.gpus_per_node=8",
                      "placement.rollout_num_workers=2", "rollout.tensor_parallel_size=2")
    plan = _plan(cfg)
    assert len(plan.ranks("rollout")) == 4
    engines, bundles = engine_plan(plan, 2)
    assert bundles == [[2, 3], [4, 5]]   # after actor (0) and ref (1)
    placed = [(s.rank, s.bundle_index, s.num_gpus) for s in engines.ranks("rollout")]
    assert placed == [(0, 2, 0.0), (1, 4, 0.0)]
    assert engines.ranks("actor") == plan.ranks("actor")
    same, one = engine_plan(plan, 1)
    assert same is plan and one == [[2], [3], [4], [5]]
    with pytest.raises(ValueError, match="tensor_parallel_size=3"):
        engine_plan(plan, 3)


@pytest.mark.skipif(HAVE_VLLM, reason="vLLM is importable here: the missing-vLLM error cannot show")
def test_vllm_without_vllm_fails_at_validation_naming_why(tmp_path):
    cfg = compose_cfg(tmp_path, "rollout=vllm")
    problems = [p for p in config_problems(cfg) if p.startswith("rollout.engine=vllm")]
    assert problems and "not installed" in problems[0]
    with pytest.raises(ConfigError, match="rollout.engine=vllm: the vllm package is not installed"):
        validate_config(cfg)


def test_rollout_knobs_are_checked(tmp_path):
    cfg = compose_cfg(tmp_path, "rollout.sleep_level=3", "rollout.gpu_memory_utilization=0",
                      "rollout.tensor_parallel_size=0")
    text = "\n".join(config_problems(cfg))
    for key in ("rollout.sleep_level=3", "rollout.gpu_memory_utilization=0",
                "rollout.tensor_parallel_size=0"):
        assert key in text
