"""Faults injected into a live run (real Ray actors, DeepSpeed, the LM reward model,
separate rollout worker, streaming scorers, overcommit at Δ_max): workers killed
mid-step are restarted and their in-flight work re-issued; a reward file that raises,
returns NaN or hangs fails the step before any update or, under the drop policy, loses
only the affected samples; no NaN reaches the optimizer; no KV cache or sequence
outlives its step; every port we open is on the loopback."""
from __future__ import annotations

import dataclasses
import math
import os
import re
import time

import pytest
import ray
import torch
from fault_injection import armed_checkpoint, finish, kill_when, listening_addresses, sigkill
from helpers import compose_cfg

from asr_grpo.distributed.faults import restart_options
from asr_grpo.distributed.net import is_loopback
from asr_grpo.distributed.role_group import RoleGroup
from asr_grpo.experience.types import NonFiniteError, SequenceRef
from asr_grpo.recipes.rl import RLRecipe
from asr_grpo.rewards import RewardFunctionError
from asr_grpo.workers.reward import RewardWorker

pytestmark = pytest.mark.slow
B, N, DELTA = 2, 2, 2


@pytest.fixture(scope="module")
def recipe(root, fault_reward):
    # Chunks of one token: many decode rounds, so "mid-step" is a wide window. Δ pinned
    # at its maximum: groups (and their partial sequences) are carried between steps.
    cfg = compose_cfg(root, "placement=separate", "overlap=oppo", "overlap.controller=trial", "overlap.chunk_size=1",
                      "overlap.chunk_candidates=[1]", "overlap.chunk_trial_period=0",
                      f"overlap.delta_init={DELTA}", f"overlap.delta_min={DELTA}", f"overlap.delta_max={DELTA}",
                      "reward=asr_lm", f"reward.reward_file={fault_reward.path}", f"trainer.prompts_per_step={B}",
                      f"algorithm.n_samples_per_prompt={N}", "trainer.eval_every=0", "trainer.save_every=0",
                      "trainer.lr_warmup_steps=0", f"trainer.output_dir={root}/faults_workers")
    TRAINED.clear()
    r = RLRecipe(cfg, step_callbacks=[TRAINED.append])
    try:
        r.setup()
        yield r
    finally:
        r.cleanup()


TRAINED: list = []   # the recipe's TrainedStep records, newest last


def step(recipe) -> dict:
    metrics = recipe.train_step(recipe.step)
    recipe.step += 1
    return metrics


def optimizer_steps(recipe) -> int:
    return ray.get(recipe.policy.handles[0].__ray_call__.remote(lambda self: self.train_engine.global_steps))


def after_rounds(recipe, rounds: int):
    """A condition true once the scheduler has decoded `rounds` more rounds (mid-rollout)."""
    start = recipe.scheduler.round
    return lambda: recipe.scheduler.round >= start + rounds


def decoding_ahead(recipe) -> None:
    """Step until the next step has to decode: with B finished groups already carried in
    the buffer, a step trains on those without a single decode round."""
    for _ in range(6):
        if sum(e.done for e in recipe.scheduler.buffer) < B:
            return
        step(recipe)
    pytest.fail("every step found B finished groups waiting: no decoding to interrupt")


def test_rollout_and_reward_workers_killed_mid_step_are_restarted(recipe, fault_reward):
    step(recipe)   # something carried into the step the faults hit
    decoding_ahead(recipe)
    carried = sum(1 for e in recipe.scheduler.buffer for s in e.samples.values() if s.tokens and not s.done)
    rollout_pid, reward_pid = recipe.rollout_group.pids()[0], recipe.reward.pids()[0]
    fault_reward.set("stall_once")   # the reward call stalls until it is killed
    rollout_kill = kill_when(after_rounds(recipe, 1), lambda: sigkill(rollout_pid))
    reward_kill = kill_when(lambda: (fault_reward.folder / "pid").is_file(),
                            lambda: sigkill(fault_reward.stalled_pid()))
    try:
        metrics = step(recipe)
    finally:
        fault_reward.set("ok")
    finish(rollout_kill), finish(reward_kill)

    # Rollout: restarted by Ray, restored by the driver (weights, then its sequences
    # with their tokens so far) in the same step, which trained on B finished groups.
    assert recipe.rollout_group.pids()[0] != rollout_pid
    assert metrics["faults/rollout_restores"] == 1 and metrics["faults/restarts/rollout"] == 1
    rollout = TRAINED[-1].rollout
    assert len(rollout.groups) == B
    assert all(s.done and len(s.versions) == len(s.tokens) for rs in rollout.results.values() for s in rs)
    assert carried > 0 or metrics["overlap/carried_groups"] > 0, "nothing was carried: overcommit not exercised"
    # Reward: Ray re-ran the killed call on the restarted worker.
    assert recipe.reward.pids()[0] != reward_pid and metrics["faults/restarts/reward"] == 1
    assert math.isfinite(metrics["reward/total"]) and metrics["reward/dropped"] == 0
    # The restarted rollout worker decodes with the trainer's weights.
    g = rollout.groups[0]
    probe = [SequenceRef("probe", g.prompt_ids, rollout.results[g.uid][0].tokens, g.features)]
    engine = ray.get(recipe.rollout_group.call_rank(0, "compute_logprobs", probe))[0]
    trainer = ray.get(recipe.policy.call_rank(0, "compute_logprobs", probe))[0]
    torch.testing.assert_close(engine, trainer, rtol=0, atol=1e-6)


def test_a_rollout_worker_lost_during_the_weight_push_is_restarted_and_pushed_again(recipe):
    step(recipe)
    pid, before = recipe.rollout_group.pids()[0], recipe.push_restores
    # Inside the worker: its next weight receive ends the process before a byte is taken,
    # so the trainer is mid-broadcast to a member that is gone (a lambda: pickled by value).
    ray.get(recipe.rollout_group.handles[0].__ray_call__.remote(
        lambda self: setattr(self.sync, "receive_into", lambda *a, **k: os._exit(1))))
    t0 = time.monotonic()
    metrics = step(recipe)   # the push after this step's update loses its member
    assert time.monotonic() - t0 < recipe.cfg.rollout.weight_sync_timeout_s + 60   # bounded, not the old 600 s
    assert recipe.rollout_group.pids()[0] != pid
    assert metrics["faults/weight_push_restores"] == before + 1
    # The restarted worker decodes with the weights the trainer has now, and the run goes on.
    metrics = step(recipe)
    g = TRAINED[-1].rollout.groups[0]
    probe = [SequenceRef("probe", g.prompt_ids, TRAINED[-1].rollout.results[g.uid][0].tokens, g.features)]
    engine = ray.get(recipe.rollout_group.call_rank(0, "compute_logprobs", probe))[0]
    trainer = ray.get(recipe.policy.call_rank(0, "compute_logprobs", probe))[0]
    torch.testing.assert_close(engine, trainer, rtol=0, atol=1e-6)


def test_streaming_scorers_killed_mid_step_rescore_what_they_lost(recipe):
    ref_pid, lm_pid = recipe.ref.pids()[0], recipe.reward_model.pids()[0]
    rescored = recipe.maker.rescored

    def kill():
        ray.kill(recipe.ref.handles[0], no_restart=False)   # Ray's own kill...
        sigkill(lm_pid)                                      # ...and a SIGKILL

    decoding_ahead(recipe)
    killer = kill_when(after_rounds(recipe, 1), kill)
    metrics = step(recipe)
    finish(killer)
    assert recipe.ref.pids()[0] != ref_pid and recipe.reward_model.pids()[0] != lm_pid
    assert metrics["faults/restarts/ref"] == 1 and metrics["faults/restarts/reward_model"] == 1
    assert metrics["faults/rescored_sequences"] > rescored
    # Whether streamed before the crash or re-scored after it, each reference log-prob
    # is what one-shot scoring of the finished sequence gives.
    items = TRAINED[-1].items
    refs = [SequenceRef(it.uid, it.prompt_ids, it.response_ids, it.features) for it in items]
    expected = ray.get(recipe.ref.call_rank(0, "compute_logprobs", refs))
    for it, want in zip(items, expected):
        torch.testing.assert_close(it.ref_logprobs, want, atol=2e-5, rtol=1e-5)
    assert math.isfinite(metrics["reward/smoothness"])


def test_nan_never_reaches_the_optimizer(recipe):
    step(recipe)
    before = optimizer_steps(recipe)
    item = TRAINED[-1].items[0]
    poisoned = dataclasses.replace(item, advantages=torch.full_like(item.advantages, math.nan))
    with pytest.raises(NonFiniteError, match=rf"advantages of samples \['{item.uid}'\]"):
        ray.get(recipe.policy.call_split("train", [[TRAINED[-1].items[1], poisoned]]))
    assert optimizer_steps(recipe) == before


def test_reward_file_error_fails_the_step_before_any_update(recipe, fault_reward):
    before = optimizer_steps(recipe)
    fault_reward.set("raise")
    try:
        with pytest.raises(RewardFunctionError) as err:
            step(recipe)
    finally:
        fault_reward.set("ok")
    message = str(err.value)
    assert fault_reward.path in message and "reward_func raised ValueError: injected failure" in message
    assert re.search(rf"\({B * N} samples: \[s\d+:e\d+:rl-\d+#\d, ", message)   # the samples, by uid
    assert optimizer_steps(recipe) == before


def test_drop_policy_loses_only_the_affected_samples(recipe, fault_reward):
    dropper = RoleGroup("reward", RewardWorker, recipe.plan, recipe.pg, **restart_options("reward"),
                        init_kwargs=dict(reward_file=fault_reward.path, weights=dict(recipe.cfg.reward.weights),
                                         timeout_s=3.0, on_bad_reward="drop"))
    dropper.wait_ready()
    recipe.maker.reward, strict = dropper, recipe.maker.reward
    try:
        fault_reward.set("nan_on_first")   # the first sample's reward is NaN: its group leaves
        before = optimizer_steps(recipe)
        metrics = step(recipe)
        assert metrics["reward/dropped"] == 1 and metrics["reward/dropped_groups"] == 1
        assert len(TRAINED[-1].items) == (B - 1) * N and math.isfinite(metrics["reward/total"])
        assert optimizer_steps(recipe) > before   # the rest trained, on finite numbers only

        fault_reward.set("raise_on_first")   # raises on one text: retried per sample, only it dropped
        metrics = step(recipe)
        poisoned = TRAINED[-1].rollout.groups[0].utterance["text"]
        hit = sum(g.utterance["text"] == poisoned for g in TRAINED[-1].rollout.groups)
        assert metrics["reward/dropped_groups"] == hit and len(TRAINED[-1].items) == (B - hit) * N

        fault_reward.set("hang")   # times out: the batch is dropped, the stuck worker restarted
        pid, before = dropper.pids()[0], optimizer_steps(recipe)
        metrics = step(recipe)
        assert metrics["reward/dropped_groups"] == B and TRAINED[-1].items == []
        assert metrics["faults/reward_worker_restarts"] >= 1 and dropper.pids()[0] != pid
        assert optimizer_steps(recipe) == before   # nothing to train on: no update
    finally:
        fault_reward.set("ok")
        recipe.maker.reward = strict
        dropper.kill()


def test_no_kv_cache_or_sequence_outlives_its_step(recipe):
    step(recipe)
    unfinished = {s.uid for e in recipe.scheduler.buffer for s in e.samples.values() if not s.done}
    unfinished |= {r.uid for e in recipe.scheduler.buffer for r in e.group.requests() if r.uid not in e.samples}
    live = ray.get(recipe.rollout_group.handles[0].__ray_call__.remote(
        lambda self: sorted(s.request.uid for s in self.engine.live())))
    assert set(live) == unfinished   # the engine holds exactly the carried sequences
    for g in (recipe.ref, recipe.reward_model):
        held = ray.get(g.handles[0].__ray_call__.remote(
            lambda self: sorted(set(self.scorer._prompts) | set(self.scorer._cohort_of))))
        assert set(held) <= unfinished, g.role   # caches of finished sequences are freed


def test_the_trainers_read_checkpoints_weights_only(recipe, tmp_path):
    marker = tmp_path / "ran"
    bomb = str(armed_checkpoint(tmp_path / "optim_states.pt", marker))
    with pytest.raises(Exception, match="Unsupported global"):   # DeepSpeed's own loader, as resume calls it
        ray.get(recipe.policy.handles[0].__ray_call__.remote(
            lambda self, path: self.train_engine.engine.checkpoint_engine.load(path, map_location="cpu"), bomb))
    assert not marker.exists()


def test_every_port_we_open_is_on_the_loopback(recipe):
    addresses = listening_addresses()
    assert addresses, "found no listening socket at all: the check is vacuous"
    exposed = {name: ips for name, ips in addresses.items() if not all(map(is_loopback, ips))}
    assert not exposed, exposed
