"""The OPPO scheduler on real Ray actors: intra-step streaming changes nothing about the
experience or the first update; overcommit trains every group exactly once with the
tokens it was carrying; a run resumed with a carried buffer continues exactly."""
from __future__ import annotations

import enum

import pytest
import ray
import torch
from helpers import compose_cfg, metric_history
from safetensors.torch import load_file

from asr_grpo.distributed.deepspeed_strategy import load_weights_only
from asr_grpo.experience.maker import split_even
from asr_grpo.models import step_checkpoints as ckpt
from asr_grpo.recipes.rl import RLRecipe, run_rl

pytestmark = [pytest.mark.long, pytest.mark.slow]
SINGLE_SAMPLE = ("algorithm.n_samples_per_prompt=1", "algorithm.advantage_estimator=reinforce_baseline")


def assert_same_update(root, got: dict, expected: dict, tol: float = 1e-3) -> None:
    """Weights reached by two runs that saw the same experience up to float rounding.
    Adam normalises each gradient, so rounding-level noise on near-zero gradients is not
    exactly zero in the update: compare the difference to the size of the update."""
    sft = load_file(f"{root}/checkpoints/sft-debug-fast/model.safetensors")
    assert set(got) == set(expected) == set(sft)
    diff = sum(float((got[k] - expected[k]).pow(2).sum()) for k in sft) ** 0.5
    update = sum(float((expected[k] - sft[k]).pow(2).sum()) for k in sft) ** 0.5
    assert update > 0   # training did something
    assert diff / update < tol, f"relative update difference {diff / update:.2e} (|update| {update:.2e})"


def first_step(root, mode: str, *overrides: str, name: str = ""):
    """One PPO step (reference, critic and LM reward model all in play) by hand, so the
    experience itself can be compared; returns (rollout, items, metrics, new weights)."""
    cfg = compose_cfg(root, f"overlap={mode}", "overlap.controller=fixed", "algorithm=ppo", "reward=asr_lm",
                      "overlap.chunk_size=3",
                      "algorithm.max_new_tokens=20", "trainer.lr_warmup_steps=0", "trainer.lr=1e-4",
                      f"trainer.output_dir={root}/first_{mode}{name}", *overrides)
    recipe = RLRecipe(cfg)
    try:
        recipe.setup()
        wanted = recipe.scheduler.groups_wanted(0)
        rollout = recipe.scheduler.rollout(0, [recipe._group(i, 0) for i in recipe.sampler.next(wanted)])
        items, metrics = recipe.maker.make(rollout.groups, rollout.results, rollout.streamed,
                                           version=recipe.weights_version)
        for g in (recipe.policy, recipe.critic):
            ray.get(g.call_split("train", split_even(items, g.world_size)))
        path = recipe.save(1, "none")
        return rollout, items, metrics, load_file(f"{path}/hf/model.safetensors")
    finally:
        recipe.cleanup()


@pytest.fixture(scope="module")
def serial_first_step(root):
    return first_step(root, "none")


def test_intra_streaming_gives_the_serial_experience_and_update(root, serial_first_step):
    serial, s_items, s_metrics, s_weights = serial_first_step
    streamed, t_items, t_metrics, t_weights = first_step(root, "intra")
    uids = [it.uid for it in s_items]
    # The streamed run really streamed: every sequence's scores came from the scorers' KV caches.
    assert serial.streamed == {}
    for name in ("ref", "values", "lm"):
        assert sorted(streamed.streamed[name].uids) == sorted(uids), name
        assert sorted(streamed.streamed[name].get()) == sorted(uids), name
    assert streamed.metrics["overlap/decode_rounds"] > 1
    assert [it.uid for it in t_items] == uids
    for a, b in zip(s_items, t_items):
        assert a.response_ids == b.response_ids
        torch.testing.assert_close(b.ref_logprobs, a.ref_logprobs, atol=2e-5, rtol=1e-5)
        torch.testing.assert_close(b.old_values, a.old_values, atol=2e-5, rtol=1e-5)
        torch.testing.assert_close(b.old_logprobs, a.old_logprobs, atol=1e-6, rtol=0)
        torch.testing.assert_close(b.advantages, a.advantages, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(b.returns, a.returns, atol=1e-4, rtol=1e-4)
    for key in ("reward/total", "reward/cer", "reward/smoothness", "reward/smoothness_rule"):
        assert t_metrics[key] == pytest.approx(s_metrics[key], abs=1e-5), key
    assert_same_update(root, t_weights, s_weights)


def test_reused_behaviour_logprobs_give_the_recomputed_experience_and_update(root, serial_first_step):
    """algorithm.recompute_old_logprobs=false: no second actor forward on a fresh rollout,
    and the experience and the update are those of the recomputing run."""
    _, r_items, r_metrics, r_weights = serial_first_step
    _, items, metrics, weights = first_step(root, "none", "algorithm.recompute_old_logprobs=false", name="_reuse")
    assert r_metrics["experience/old_logprobs_reused_frac"] == 0.0
    assert metrics["experience/old_logprobs_reused_frac"] == 1.0
    assert [it.uid for it in items] == [it.uid for it in r_items]
    for a, b in zip(r_items, items):
        assert a.response_ids == b.response_ids
        assert torch.equal(b.old_logprobs, b.behaviour_logprobs)          # reused as they are
        torch.testing.assert_close(b.old_logprobs, a.old_logprobs, atol=2e-5, rtol=1e-5)
        torch.testing.assert_close(b.advantages, a.advantages, atol=1e-4, rtol=1e-4)
    assert_same_update(root, weights, r_weights)


def test_overcommit_trains_every_group_once_with_its_carried_tokens(root):
    B, steps = 2, 5
    # One sample per prompt: a group finishes with its sequence, so lengths differ
    # between groups and stragglers get carried with partial tokens.
    cfg = compose_cfg(root, *SINGLE_SAMPLE, "overlap=inter", "overlap.controller=fixed", "overlap.delta_init=3",
                      "overlap.delta_max=3", "overlap.chunk_size=2", "algorithm.recompute_old_logprobs=false",
                      "algorithm.max_new_tokens=20", f"trainer.prompts_per_step={B}", f"trainer.steps={steps}",
                      "trainer.eval_every=0", "trainer.save_every=0", f"trainer.output_dir={root}/overcommit")
    trained_steps = []
    recipe = RLRecipe(cfg, step_callbacks=[trained_steps.append])
    try:
        recipe.setup()
        trained_tokens: dict[str, list[int]] = {}
        carried_partials = stale_items = 0
        staleness = []
        for step in range(steps):
            # Every unfinished sample waiting in the buffer, with the tokens it has so far.
            before = {s.uid: list(s.tokens) for e in recipe.scheduler.buffer for s in e.samples.values()}
            carried_partials += sum(1 for e in recipe.scheduler.buffer for s in e.samples.values()
                                    if s.tokens and not s.done)
            metrics = recipe.train_step(step)
            staleness.append(metrics["overlap/staleness_max"])
            rollout, items = trained_steps[-1].rollout, trained_steps[-1].items
            assert len(rollout.groups) == B   # exactly B groups trained on
            now = {s.uid: s for rs in rollout.results.values() for s in rs}
            now.update({s.uid: s for e in recipe.scheduler.buffer for s in e.samples.values()})
            for uid, toks in before.items():
                assert now[uid].tokens[:len(toks)] == toks, uid   # nothing lost, nothing rewritten
            for rs in rollout.results.values():
                for s in rs:
                    assert s.done and s.uid not in trained_tokens
                    trained_tokens[s.uid] = s.tokens
                    assert len(s.versions) == len(s.tokens) and s.versions == sorted(s.versions)
            # recompute_old_logprobs=false: only sequences the current weights sampled
            # throughout reuse their behaviour log-probs; carried ones are recomputed.
            for item in items:
                fresh = min(item.versions) == step
                stale_items += not fresh
                assert torch.equal(item.old_logprobs, item.behaviour_logprobs) == fresh, (step, item.uid)
            assert metrics["experience/old_logprobs_reused_frac"] == pytest.approx(
                sum(min(it.versions) == step for it in items) / len(items))
        trained = [g.uid for t in trained_steps for g in t.rollout.groups]
        entered = [uid for t in trained_steps for uid in t.rollout.admitted]
        assert len(trained) == len(set(trained)) == B * steps
        waiting = {e.group.uid for e in recipe.scheduler.buffer}
        assert set(entered) == set(trained) | waiting and not set(trained) & waiting
        assert len(entered) == len(set(entered))
        assert carried_partials > 0, "the workload never carried a partial sequence: test is vacuous"
        assert max(staleness) >= 1 and stale_items > 0
    finally:
        recipe.cleanup()


def test_oppo_resume_with_carried_buffer_equals_uninterrupted(root):
    # Prompts from the train split (num_rl=0): on these utterances the debug model's
    # sampled lengths spread enough that step 2's checkpoint holds partial sequences.
    # The trial controller with every step a trial: its choices do not depend on timing,
    # so the two runs must plan alike (the cost model's state round trip is unit-tested).
    common = [*SINGLE_SAMPLE, "data.corpus.num_rl=0", "overlap=oppo", "overlap.controller=trial",
              "overlap.delta_init=2", "overlap.chunk_size=2", "overlap.chunk_candidates=[2,3]",
              "overlap.chunk_trial_period=2", "overlap.chunk_trial_warmup=0", "overlap.chunk_trial_steps=1",
              "algorithm.max_new_tokens=20",
              "trainer.eval_every=0", "trainer.lr_warmup_steps=0", "trainer.lr=1e-4"]
    first = run_rl(compose_cfg(root, *common, "trainer.steps=2", "trainer.save_every=1",
                               f"trainer.output_dir={root}/oppo_a"))
    resumed = run_rl(compose_cfg(root, *common, "trainer.steps=4", "trainer.save_every=2", "trainer.resume=true",
                                 f"trainer.output_dir={root}/oppo_a"))
    assert resumed["mlflow_run_id"] == first["mlflow_run_id"]
    saved = ckpt.read_driver_state(root / "oppo_a" / "step_000002")["scheduler"]["buffer"]
    partial = [s for e in saved for s in e["samples"].values() if s["tokens"] and s["finish_reason"] is None]
    assert partial, "no partial sequence was carried across the checkpoint: test is vacuous"
    straight = run_rl(compose_cfg(root, *common, "trainer.steps=4", "trainer.save_every=4",
                                  f"trainer.output_dir={root}/oppo_b"))
    cfg = compose_cfg(root)
    for key in ("reward/total", "overlap/chunk", "overlap/delta", "overlap/carried_groups"):
        hist_a = dict(metric_history(cfg, first["mlflow_run_id"], key))
        hist_b = dict(metric_history(cfg, straight["mlflow_run_id"], key))
        assert sorted(hist_a) == [1, 2, 3, 4], key
        assert hist_a == pytest.approx(hist_b, abs=1e-6), (key, hist_a, hist_b)
    a = load_file(f"{root}/oppo_a/step_000004/hf/model.safetensors")
    b = load_file(f"{root}/oppo_b/step_000004/hf/model.safetensors")
    assert set(a) == set(b)
    for k in a:   # exact: the resumed run recomputes every score the same way
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=1e-6, msg=k)
    # Beyond the weights, everything a checkpoint holds is the uninterrupted run's: the
    # optimizer moments, LR schedule and step counters, the RNG streams, the prompt
    # sampler, the chunk and Δ controllers and the buffer with its partial sequences.
    for name in ("mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt"):
        assert_same_state(load_weights_only(f"{root}/oppo_a/step_000004/policy_ds/state/{name}"),
                          load_weights_only(f"{root}/oppo_b/step_000004/policy_ds/state/{name}"), name)
    driver_a, driver_b = (ckpt.read_driver_state(root / run / "step_000004") for run in ("oppo_a", "oppo_b"))
    assert driver_a.pop("mlflow_run_id") != driver_b.pop("mlflow_run_id")
    for state in (driver_a, driver_b):   # wall-clock step times (and the chunk picked from them) differ in any two runs
        ctrl = state["scheduler"]["planner"]["chunk_ctrl"]
        ctrl.update({key: [c for c, _ in ctrl[key]] for key in ("timings", "last_trial")}, chosen=None)
    # Tokens, uids, counters exactly; the behaviour log-probs to float rounding: the frozen
    # reference keeps carried sequences' caches across steps in the uninterrupted run and
    # re-prefills them after the resume, so the KL term (and the weights) differ by rounding.
    assert_same_state(driver_a, driver_b, "driver")
    assert driver_a["scheduler"]["buffer"] and driver_a["scheduler"]["planner"]["delta_ctrl"]


def assert_same_state(a, b, where: str) -> None:
    """Nested checkpoint state: tensors and floats equal to 1e-6, everything else exactly."""
    if isinstance(a, torch.Tensor):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6, msg=where)
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            assert_same_state(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_state(x, y, f"{where}[{i}]")
    elif hasattr(a, "__dict__") and not isinstance(a, enum.Enum):   # DeepSpeed's loss scaler, fragments
        assert_same_state(vars(a), vars(b), where)
    elif isinstance(a, float) and isinstance(b, float):
        assert a == pytest.approx(b, rel=1e-5, abs=1e-6), (where, a, b)
    else:
        assert a == b, (where, a, b)
