"""The RL loop end to end on the tiny embedded default: real Ray actors, real DeepSpeed
engines, real MLflow. Slow (multi-process), still run in CI."""
from __future__ import annotations

import pytest
import ray
import torch
from helpers import compose_cfg, metric_history
from mlflow.tracking import MlflowClient
from safetensors.torch import load_file

import asr_grpo.recipes.rl as rl_recipe
from asr_grpo.experience.sync_check import WeightSyncMismatch, check_weight_sync
from asr_grpo.experience.types import SequenceRef
from asr_grpo.models import is_complete_checkpoint, load_model
from asr_grpo.models import step_checkpoints as ckpt
from asr_grpo.recipes.rl import RLRecipe, run_rl
from asr_grpo.tracking import absolute_tracking_uri
from asr_grpo.tracking.runs import group_lengths

pytestmark = [pytest.mark.long, pytest.mark.slow]


def test_grpo_colocate_trains_logs_checkpoints_and_resumes(root):
    # With a weight average (trainer.ema_decay), which the resume must carry exactly too.
    ema = "trainer.ema_decay=0.5"
    cfg = compose_cfg(root, "trainer.steps=2", "trainer.save_every=1", ema,
                      f"trainer.output_dir={root}/rl_a")
    summary = run_rl(cfg)
    run_id = summary["mlflow_run_id"]
    for key in ["reward/total", "reward/cer", "reward/keyword", "reward/language", "reward/smoothness",
                "loss/policy", "kl/loss", "policy/clip_frac", "perf/time/rollout", "perf/time/training",
                "perf/time/scoring", "perf/time/sync", "eval/cer", "eval/heldout_voices/cer",
                "eval/ema/cer", "eval/ema/heldout_voices/cer", "charts/ema_decay"]:
        steps = [s for s, _ in metric_history(cfg, run_id, key)]
        assert steps and max(steps) == 2, key
    assert [s for s, _ in metric_history(cfg, run_id, "eval/cer")][0] == 0   # CER before RL
    # The held-out-voice split next to dev, per language too, on the same utterance cap.
    summary_eval = summary["eval_after"]
    assert summary_eval["heldout_voices/n"] == summary_eval["n"] == cfg.trainer.eval_max_utterances
    languages = [k.rsplit("/", 1)[1] for k in summary_eval if k.startswith("heldout_voices/cer/")]
    assert languages and all(metric_history(cfg, run_id, f"eval/heldout_voices/cer/{lang}") for lang in languages)
    latest = ckpt.latest_checkpoint(cfg.trainer.output_dir)
    assert latest.name == "step_000002" and is_complete_checkpoint(latest / "hf")
    model, _ = load_model(str(latest / "hf"))   # plain transformers folder
    sft_weights = load_file(f"{cfg.model.path}/model.safetensors")
    rl_weights = load_file(f"{latest}/hf/model.safetensors")
    enc = [k for k in sft_weights if "audio_tower" in k]
    lm = [k for k in sft_weights if "language_model.layers" in k]
    assert all(torch.equal(sft_weights[k], rl_weights[k]) for k in enc)        # frozen encoder
    assert any(not torch.equal(sft_weights[k], rl_weights[k]) for k in lm)     # the LM learned
    # The average: warmed-up decays 1/10 then 2/11 (under 0.5), and between the SFT and RL
    # weights, unequal to both, with the encoder (not trained) untouched.
    assert [v for _, v in metric_history(cfg, run_id, "charts/ema_decay")] == pytest.approx([0.1, 2 / 11])
    assert is_complete_checkpoint(latest / "hf_ema")
    ema_weights = load_file(f"{latest}/hf_ema/model.safetensors")
    assert all(torch.equal(sft_weights[k], ema_weights[k]) for k in enc)
    moved = [k for k in lm if not torch.equal(sft_weights[k], rl_weights[k])]
    assert all(not torch.equal(ema_weights[k], rl_weights[k]) for k in moved)

    # Resume to step 3 == an uninterrupted 3-step run, in the same MLflow run.
    resumed = run_rl(compose_cfg(root, "trainer.steps=3", "trainer.save_every=1", "trainer.resume=true", ema,
                                 f"trainer.output_dir={root}/rl_a"))
    assert resumed["mlflow_run_id"] == run_id
    assert [s for s, _ in metric_history(cfg, run_id, "reward/total")] == [1, 2, 3]
    straight = run_rl(compose_cfg(root, "trainer.steps=3", "trainer.save_every=3", ema,
                                  f"trainer.output_dir={root}/rl_b"))
    for folder in ("hf", "hf_ema"):
        a = load_file(f"{root}/rl_a/step_000003/{folder}/model.safetensors")
        b = load_file(f"{root}/rl_b/step_000003/{folder}/model.safetensors")
        assert set(a) == set(b)
        for k in a:
            torch.testing.assert_close(a[k], b[k], rtol=0, atol=1e-6, msg=f"{folder}: {k}")
    hist_a = dict(metric_history(cfg, run_id, "reward/total"))
    hist_b = dict(metric_history(cfg, straight["mlflow_run_id"], "reward/total"))
    assert hist_a == pytest.approx(hist_b, abs=1e-6)
    # Every trained group's response lengths, by step, survive the resume (the forecast's
    # profile=run reads them): the same as the uninterrupted run's.
    client = MlflowClient(absolute_tracking_uri(cfg.logger.tracking_uri))
    lengths_a, lengths_b = group_lengths(client, run_id), group_lengths(client, straight["mlflow_run_id"])
    assert sorted(lengths_a) == [1, 2, 3] and lengths_a == lengths_b
    assert all(len(groups) == cfg.trainer.prompts_per_step for groups in lengths_a.values())
    assert all(len(g) == cfg.algorithm.n_samples_per_prompt and min(g) > 0 for gs in lengths_a.values() for g in gs)


@pytest.mark.parametrize("max_minutes, inside, steps", [("0.0001", None, 1), ("30", 2, 2)])
def test_wall_clock_cap_ends_the_run_evaluated_and_saved(root, monkeypatch, max_minutes, inside, steps):
    # A cap the first step already exceeds (the real clock): the loop stops after it, with the
    # evaluation and checkpoint of a last step although neither interval is due. A cap that
    # step 2's periodic evaluation reaches (a scripted clock: the checks after the training of
    # steps 1 and 2 are `inside` it, the one after the evaluation is not): the run ends at step
    # 2 with that evaluation as its last, not a step later with a second of nearly the same weights.
    if inside is not None:
        checks = iter([False] * inside)
        monkeypatch.setattr(rl_recipe, "out_of_time", lambda *_: next(checks, True))
    cfg = compose_cfg(root, "trainer.steps=50", f"trainer.max_minutes={max_minutes}", "trainer.eval_every=2",
                      "trainer.save_every=25", f"trainer.output_dir={root}/rl_capped_{steps}")
    summary = run_rl(cfg)
    assert summary["steps"] == steps
    assert [s for s, _ in metric_history(cfg, summary["mlflow_run_id"], "eval/cer")] == [0, steps]
    assert ckpt.latest_checkpoint(cfg.trainer.output_dir).name == f"step_{steps:06d}"


def test_ppo_trains_its_critic(root):
    cfg = compose_cfg(root, "algorithm=ppo", "trainer.steps=1", "trainer.save_every=0",
                      f"trainer.output_dir={root}/rl_ppo")
    summary = run_rl(cfg)
    for key in ["loss/value", "critic/explained_variance", "critic/value_clip_frac", "charts/returns_mean"]:
        assert metric_history(cfg, summary["mlflow_run_id"], key), key


def test_roles_land_where_the_placement_says(root):
    colocated = RLRecipe(compose_cfg(root, "trainer.steps=1"))
    try:
        colocated.setup()
        actor, ref = colocated.placement["actor"][0], colocated.placement["ref"][0]
        assert actor["bundle_index"] == ref["bundle_index"] == 0 and actor["as_planned"] and ref["as_planned"]
        assert "rollout" not in colocated.placement    # the actor rolls out itself
        # RL prompts come from the corpus' rl split (sentences SFT never saw), eval from dev.
        assert colocated.train_set.manifest_path.name == "rl.jsonl"
        assert colocated.dev_set.manifest_path.name == "dev.jsonl"
        assert colocated.eval_sets["heldout_voices"].manifest_path.name == "heldout_voices.jsonl"
        groups = colocated._new_groups(3, step=0)
        assert [g.utterance["id"][:3] for g in groups] == ["rl-"] * 3
    finally:
        colocated.cleanup()


def test_separate_rollout_worker_matches_trainer_after_sync(root):
    # An entropy bonus guarantees a non-zero update even if every advantage is 0 (and no
    # warm-up: HF warm-up schedules start the first step at LR 0).
    recipe = RLRecipe(compose_cfg(root, "placement=separate", "trainer.steps=1", "trainer.lr=1e-3",
                                  "algorithm.entropy_coef=0.01", "trainer.lr_warmup_steps=0",
                                  "rollout.sync_check_every=1"))
    try:
        recipe.setup()
        bundles = {role: {r["bundle_index"] for r in ranks} for role, ranks in recipe.placement.items()
                   if role != "reward"}
        assert bundles["actor"].isdisjoint(bundles["rollout"]) and bundles["actor"].isdisjoint(bundles["ref"])
        assert all(r["as_planned"] for ranks in recipe.placement.values() for r in ranks)
        g = recipe._group(recipe.sampler.next(1)[0], 0)
        words = recipe.processor.tokenizer("turn on the lights")["input_ids"]
        probe = [SequenceRef("probe", g.prompt_ids, words, g.features)]
        before = ray.get(recipe.rollout_group.call_rank(0, "compute_logprobs", probe))[0]
        metrics = recipe.train_step(0)   # trains, syncs, and checks the sync on trained samples
        trainer = ray.get(recipe.policy.call_rank(0, "compute_logprobs", probe))[0]
        engine = ray.get(recipe.rollout_group.call_rank(0, "compute_logprobs", probe))[0]
        assert not torch.allclose(before, trainer)          # the update changed the policy
        torch.testing.assert_close(engine, trainer, rtol=0, atol=1e-6)   # and the engine has it
        assert metrics["rollout/sync/tokens"] > 0 and metrics["rollout/sync/max_abs_diff"] <= 1e-6
        # The same check catches an engine that missed the sync: the update moved the
        # probe's log-probs by more than the default tolerance.
        with pytest.raises(WeightSyncMismatch, match="policy version 1"):
            check_weight_sync([trainer], [[before]], recipe.cfg.rollout.sync_check_tol, version=1)
    finally:
        recipe.cleanup()


def test_prompt_groups_stay_unique_when_the_prompt_set_wraps_inside_a_step(root):
    """12 groups from the 8 debug RL prompts: the sampler wraps into its next epoch
    inside one step, and the second draw of an utterance must not reuse a uid (the
    rollout host and the buffer key sequences by it)."""
    recipe = _prompt_recipe(root)
    groups = recipe._new_groups(12, step=3)
    uids = [g.uid for g in groups]
    assert len(recipe.train_set) == 8 and len(set(uids)) == 12
    assert sum(u.startswith("s3:e1:rl-") for u in uids) == 4 and sum(u.startswith("s3:e0:rl-") for u in uids) == 8
    rebuilt = recipe._group(groups[-1].item_index, 3, uid=groups[-1].uid)   # as resume rebuilds it
    assert rebuilt.uid == groups[-1].uid and rebuilt.prompt_ids == groups[-1].prompt_ids


@pytest.mark.parametrize("knobs", [("trainer.wave_augment.speed_prob=1", "trainer.wave_augment.babble_prob=1"),
                                   ("trainer.wave_augment.conditions.phone=1",)], ids=["speed+babble", "phone line"])
def test_wave_augment_perturbs_each_group_once_and_a_rebuilt_group_the_same(root, knobs):
    """trainer.wave_augment: the prompt audio a group is encoded from is perturbed (speed
    and babble from other RL prompts, or a named condition), the same for the group when
    resume rebuilds it from its uid, different for another draw of the same utterance; off,
    the stored audio."""
    def same(a, b) -> bool:
        return torch.equal(a.features.features, b.features.features) and torch.equal(a.features.mask, b.features.mask)

    plain = _prompt_recipe(root)
    clean = plain._new_groups(4, step=0)
    recipe = _prompt_recipe(root, *knobs)
    groups = recipe._new_groups(4, step=0)
    assert [g.uid for g in groups] == [g.uid for g in clean]
    for g, c in zip(groups, clean):
        assert not same(g, c)
        assert same(recipe._group(g.item_index, 0, uid=g.uid), g)   # as resume rebuilds it
    assert not same(recipe._group(groups[0].item_index, 5), groups[0])   # drawn again in another step
    assert same(plain._group(clean[0].item_index, 0, uid=clean[0].uid), clean[0])


def _prompt_recipe(root, *overrides: str) -> RLRecipe:
    """An RLRecipe with only its prompt-drawing parts (no Ray, no workers)."""
    from asr_grpo.data import AsrDataset, resolve_manifests
    from asr_grpo.experience.prompts import PromptSampler
    from asr_grpo.models import load_processor

    cfg = compose_cfg(root, *overrides)
    recipe = RLRecipe(cfg)
    recipe.train_set = AsrDataset(resolve_manifests(cfg.data, cfg.paths.output_root).rl_prompts, cfg.data)
    recipe.sampler = PromptSampler(len(recipe.train_set), cfg.seed)
    recipe.processor = load_processor(cfg.model.path)
    return recipe
