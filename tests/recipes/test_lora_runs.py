"""LoRA (`model.lora.rank`) through the real recipes on the tiny debug=fast setup: SFT
from the SFT checkpoint, GRPO colocated (the policy is its own reference, adapters off)
with checkpoints and a resume, and GRPO with a separate HF rollout worker that follows
the policy from the adapters alone (the sync check compares its log-probs)."""
from __future__ import annotations

import json

import pytest
import ray
import torch
from helpers import compose_cfg, metric_history
from safetensors.torch import load_file

from asr_grpo.config.errors import ConfigError
from asr_grpo.experience.types import SequenceRef
from asr_grpo.models import load_model
from asr_grpo.models import step_checkpoints as ckpt
from asr_grpo.models.lora import ADAPTER_DIR
from asr_grpo.recipes.rl import RLRecipe, run_rl
from asr_grpo.recipes.sft import SFTRecipe, run_sft

pytestmark = pytest.mark.long   # a real run of a minute or more: `make test-long`, CI's own leg

slow = pytest.mark.slow   # Ray actors and DeepSpeed engines: tens of seconds each

LORA = "model.lora.rank=8"
# A certain, visible update in one step: a larger LR, no warm-up (its first step has LR 0),
# an entropy bonus in case every advantage is 0.
MOVES = ("trainer.lr=1e-3", "trainer.lr_warmup_steps=0", "algorithm.entropy_coef=0.01")


def sft_start(root) -> str:
    return str(root / "checkpoints" / "sft-debug-fast")   # the session's SFT checkpoint (conftest.root)


def lm_and_frozen_keys(weights: dict) -> tuple[list[str], list[str]]:
    lm = [k for k in weights if "language_model.layers" in k and k.endswith("proj.weight")]
    frozen = [k for k in weights if "audio_tower" in k or "embed_tokens" in k or "norm" in k]
    return lm, frozen


@slow
def test_sft_trains_the_adapters_and_saves_a_merged_checkpoint_and_the_adapter(root):
    out = root / "checkpoints" / "sft-lora"
    cfg = compose_cfg(root, LORA, f"model.path={sft_start(root)}", f"sft.output_dir={out}", "sft=finetune",
                      "sft.max_steps=3", "sft.ctc_warmup_steps=0", "sft.lr=1e-3", "sft.warmup_steps=0")
    summary = run_sft(cfg)
    assert summary["steps"] == 3
    assert 0 < summary["params/trainable"] < 0.2 * summary["params/total"]   # the adapters only
    model, _ = load_model(str(out))   # a plain HF folder: the merged weights
    assert model is not None and (out / ADAPTER_DIR / "adapter_config.json").is_file()
    adapter = json.loads((out / ADAPTER_DIR / "adapter_config.json").read_text())
    assert adapter["r"] == 8 and adapter["peft_type"] == "LORA"
    start, merged = load_file(f"{sft_start(root)}/model.safetensors"), load_file(f"{out}/model.safetensors")
    assert set(start) == set(merged)   # the plain layout, no adapter names
    lm, frozen = lm_and_frozen_keys(start)
    assert any(not torch.equal(start[k], merged[k]) for k in lm)          # the adapters moved the LM
    assert all(torch.equal(start[k], merged[k]) for k in frozen)         # nothing else trained


@pytest.mark.parametrize("overrides, message", [
    (["model.path=", "sft.ctc_warmup_steps=0"], "LoRA fine-tunes a trained model"),
    (["sft.ctc_warmup_steps=2"], "sft.ctc_warmup_steps=0"),
])
def test_sft_refuses_lora_where_it_has_nothing_to_adapt(root, overrides, message):
    cfg = compose_cfg(root, LORA, f"model.path={sft_start(root)}", f"sft.output_dir={root}/sft-refused", *overrides)
    with pytest.raises(ConfigError, match=message):
        SFTRecipe(cfg).setup()


def probe(recipe) -> list[SequenceRef]:
    g = recipe._group(recipe.sampler.next(1)[0], 0)
    words = recipe.processor.tokenizer("turn on the lights")["input_ids"]
    return [SequenceRef("probe", g.prompt_ids, words, g.features)]


@slow
def test_colocated_grpo_is_its_own_reference_with_the_adapters_off(root):
    recipe = RLRecipe(compose_cfg(root, LORA, "trainer.steps=1", *MOVES))
    try:
        recipe.setup()
        assert "ref" not in recipe.placement   # no reference workers: no second copy of the base
        seqs = probe(recipe)
        policy_before = ray.get(recipe.policy.call_rank(0, "compute_logprobs", seqs))[0]
        ref_before = ray.get(recipe.policy.call_rank(0, "compute_ref_logprobs", seqs))[0]
        torch.testing.assert_close(ref_before, policy_before, rtol=0, atol=1e-6)   # lora_B starts at 0
        metrics = recipe.train_step(0)
        policy_after = ray.get(recipe.policy.call_rank(0, "compute_logprobs", seqs))[0]
        ref_after = ray.get(recipe.policy.call_rank(0, "compute_ref_logprobs", seqs))[0]
        assert (policy_after - policy_before).abs().max() > 1e-4   # the update moved the policy
        torch.testing.assert_close(ref_after, ref_before, rtol=0, atol=1e-6)   # the reference stayed the base
        assert "kl/policy_ref" in metrics
    finally:
        recipe.cleanup()


@slow
def test_colocated_grpo_checkpoints_the_adapter_and_resumes(root):
    out = root / "rl_lora"
    cfg = compose_cfg(root, LORA, "trainer.steps=1", "trainer.save_every=1", *MOVES, f"trainer.output_dir={out}")
    run_id = run_rl(cfg)["mlflow_run_id"]
    latest = ckpt.latest_checkpoint(out)
    assert latest.name == "step_000001" and (latest / "hf" / ADAPTER_DIR / "adapter_model.safetensors").is_file()
    start, merged = load_file(f"{cfg.model.path}/model.safetensors"), load_file(f"{latest}/hf/model.safetensors")
    lm, frozen = lm_and_frozen_keys(start)
    assert any(not torch.equal(start[k], merged[k]) for k in lm)
    assert all(torch.equal(start[k], merged[k]) for k in frozen)
    # The DeepSpeed state holds the adapters, not the frozen base (a resume builds it from model.path).
    state = torch.load(next((latest / "policy_ds" / "state").glob("mp_rank_00_model_states.pt")), weights_only=False)
    assert state["module"] and all("lora_" in k for k in state["module"])
    resumed = run_rl(compose_cfg(root, LORA, "trainer.steps=2", "trainer.save_every=1", "trainer.resume=true",
                                 *MOVES, f"trainer.output_dir={out}"))
    assert resumed["mlflow_run_id"] == run_id
    assert [s for s, _ in metric_history(cfg, run_id, "reward/total")] == [1, 2]
    second = load_file(f"{out}/step_000002/hf/model.safetensors")
    assert any(not torch.equal(merged[k], second[k]) for k in lm)   # it went on training the adapters
    assert all(torch.equal(start[k], second[k]) for k in frozen)


@slow
def test_a_separate_hf_rollout_worker_follows_the_policy_from_the_adapters(root):
    recipe = RLRecipe(compose_cfg(root, LORA, "placement=separate", "trainer.steps=1", *MOVES,
                                  "rollout.sync_check_every=1"))
    try:
        recipe.setup()
        assert "ref" in recipe.placement   # separate placement: the reference's own workers (the base)
        seqs = probe(recipe)
        before = ray.get(recipe.rollout_group.call_rank(0, "compute_logprobs", seqs))[0]
        metrics = recipe.train_step(0)   # trains, sends the adapters, checks the engine on trained samples
        trainer = ray.get(recipe.policy.call_rank(0, "compute_logprobs", seqs))[0]
        engine = ray.get(recipe.rollout_group.call_rank(0, "compute_logprobs", seqs))[0]
        assert (trainer - before).abs().max() > 1e-4
        torch.testing.assert_close(engine, trainer, rtol=0, atol=1e-6)
        assert metrics["rollout/sync/tokens"] > 0 and metrics["rollout/sync/max_abs_diff"] <= 1e-6
    finally:
        recipe.cleanup()
