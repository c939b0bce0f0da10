"""rollout=vllm end to end: vLLM engines as Ray actors beside real DeepSpeed trainers,
colocated and on bundles of their own, chunked continuations through the prefix cache,
and the weight-sync check after every update. Needs vLLM itself: CI's vLLM leg runs it
on the CPU build (`.ci/vllm_leg.sh`); elsewhere it skips, saying why."""
from __future__ import annotations

import importlib.util

import pytest
import ray
import torch
from helpers import compose_cfg

from asr_grpo.experience.types import SequenceRef
from asr_grpo.recipes.rl import RLRecipe

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not HAVE_VLLM,
                                 reason="vLLM is not importable here (CI's vLLM leg runs this)")]

PLACEMENTS = {
    # One bundle: actor, reference and the engine share it (the engine's share beside the actor's).
    "colocate": ["placement=colocate", "placement.actor_gpus=0.5", "placement.rollout_gpus=0.4"],
    # The engine on a bundle of its own.
    "separate": ["placement=separate"],
}


def _probe(recipe) -> list[SequenceRef]:
    g = recipe._group(recipe.sampler.next(1)[0], 0)
    words = recipe.processor.tokenizer("turn on the lights")["input_ids"]
    return [SequenceRef("probe", g.prompt_ids, words, g.features)]


def _logprobs(group, probe) -> torch.Tensor:
    return ray.get(group.call_rank(0, "compute_logprobs", probe, 1.0))[0]


@pytest.mark.parametrize("placement", sorted(PLACEMENTS))
def test_vllm_engine_actor_follows_every_update(root, placement):
    """Two GRPO steps, overlap=oppo with chunks of 4 (every sequence continued as new
    requests): the sync check passes after each update, the engine's own log-probs move
    with the trainer's, and continuations find their prefix in vLLM's cache."""
    recipe = RLRecipe(compose_cfg(
        root, "rollout=vllm", *PLACEMENTS[placement], "overlap=oppo", "overlap.controller=fixed",
        "overlap.chunk_size=4", "overlap.delta_init=1", "trainer.steps=2", "trainer.lr=1e-3",
        "trainer.lr_warmup_steps=0", "algorithm.entropy_coef=0.01", "rollout.sync_check_every=1",
        "rollout.block_size=32", "rollout.enforce_eager=true", f"rollout.export_dir={root}/vllm-{placement}"))
    try:
        recipe.setup()
        assert "VLLMRolloutRole" in repr(recipe.rollout_group.handles[0])   # Actor(VLLMRolloutRole, <id>)
        bundles = {role: {r["bundle_index"] for r in ranks} for role, ranks in recipe.placement.items()}
        assert (bundles["rollout"] == bundles["actor"]) == (placement == "colocate")
        probe = _probe(recipe)
        before = _logprobs(recipe.rollout_group, probe)
        # Both ends loaded the same SFT checkpoint (the engine from its vLLM-layout export).
        torch.testing.assert_close(before, _logprobs(recipe.policy, probe), rtol=0, atol=1e-4)
        steps = [recipe.train_step(step) for step in range(2)]
        for m in steps:
            assert m["rollout/sync/tokens"] > 0
            assert m["rollout/sync/max_abs_diff"] <= recipe.cfg.rollout.sync_check_tol
        trainer, engine = _logprobs(recipe.policy, probe), _logprobs(recipe.rollout_group, probe)
        assert (trainer - before).abs().max() > 1e-3            # the updates moved the policy
        torch.testing.assert_close(engine, trainer, rtol=0, atol=1e-4)   # and the engine followed
        assert all(m["overlap/decode_calls"] > 1 for m in steps)   # chunked: several generate calls a step
        assert sum(m["perf/decode/prefix_cache_hit"] for m in steps) > 0
    finally:
        recipe.cleanup()
