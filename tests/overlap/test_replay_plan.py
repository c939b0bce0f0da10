"""overlap.replay_plan: every RL run records each step's plan (chunk, Δ, the groups it
admitted) as its MLflow artifact plans.jsonl, and a run given that run's id plans from the
record instead of its own timings, so it repeats the original step for step."""
from __future__ import annotations

import random
import shutil
import time

import pytest
import ray
import torch
from helpers import compose_cfg
from omegaconf import OmegaConf
from safetensors.torch import load_file

from asr_grpo.config.schema import LoggerConfig, OverlapConfig
from asr_grpo.config.validate import ConfigError
from asr_grpo.experience.types import PromptGroup
from asr_grpo.models import step_checkpoints as ckpt
from asr_grpo.overlap import planners
from asr_grpo.overlap.cost_model import Choice, best_plan
from asr_grpo.overlap.local_group import LocalGroup, local_resolve
from asr_grpo.overlap.planners import (
    ReplayDiverged,
    ReplayPlanner,
    StepObservation,
    StepPlan,
    make_planner,
    plan_record,
)
from asr_grpo.overlap.scheduler import RolloutScheduler
from asr_grpo.overlap.step_times import StepTimes
from asr_grpo.rollout.host import EngineHost
from asr_grpo.rollout.pool import SequencePool
from asr_grpo.tracking import MlflowRun
from asr_grpo.tracking.plans import log_plans, read_plans

pytestmark = pytest.mark.long   # a real run of a minute or more: `make test-long`, CI's own leg

EOS, TOKEN, B, N = 0, 7, 2, 2
RECORD = {0: plan_record(0, StepPlan(None, 0), ["a", "b"]),
          1: plan_record(1, StepPlan(8, 2), ["c", "d", "e"])}


def overlap_cfg(**kw):
    return OmegaConf.structured(OverlapConfig(**{"mode": "oppo", **kw}))


# ---- the planner ------------------------------------------------------------------------
@pytest.mark.parametrize("mode,controller", [("oppo", "cost_model"), ("oppo", "trial"), ("inter", "fixed"),
                                             ("none", "cost_model")])
def test_replay_plan_replays_the_record_whatever_the_controller(mode, controller):
    planner = make_planner(overlap_cfg(mode=mode, controller=controller, replay_plan="run1"), B, 0.0, RECORD)
    assert isinstance(planner, ReplayPlanner)
    assert [planner.plan(s) for s in (0, 1)] == [StepPlan(None, 0), StepPlan(8, 2)]
    assert planner.observe(StepObservation(1, StepPlan(8, 2), 1.0, 0, 0, 0, admitted=["c", "d", "e"])) == {}
    assert planner.state_dict() == {}   # a resumed replay plans by step number


def test_a_step_the_record_lacks_is_one_line_naming_the_run():
    planner = make_planner(overlap_cfg(replay_plan="run1"), B, 0.0, RECORD)
    with pytest.raises(ConfigError, match=r"overlap.replay_plan=run1: .* no plan for step 2 .*steps 0\.\.1"):
        planner.plan(2)


def test_admissions_that_differ_from_the_record_fail_naming_the_step():
    planner = make_planner(overlap_cfg(replay_plan="run1"), B, 0.0, RECORD)
    with pytest.raises(ReplayDiverged, match=r"replay_plan=run1: step 1 admitted 2 prompt groups .* admitted 3"):
        planner.observe(StepObservation(1, StepPlan(8, 2), 1.0, 0, 0, 0, admitted=["c", "d"]))


def test_replay_without_the_record_handed_over_says_so():
    with pytest.raises(ValueError, match="replay_plan=run1: the caller must hand over"):
        make_planner(overlap_cfg(replay_plan="run1"), B)


# ---- the scheduler, no Ray: a timing-dependent plan replayed ---------------------------------
class ScriptedEngine(SequencePool):
    """Sample s of prompt p ends after 2 + (3p + 5s) % 11 tokens: groups finish apart."""

    def __init__(self):
        super().__init__(32, {EOS})

    def _advance(self, quota) -> int:
        live = [s for s in self._live if not s.done]
        for s in live:
            group, sample = s.request.uid.split("#")
            length = 2 + (3 * int(group[2:]) + 5 * int(sample)) % 11
            self._append(s, EOS if len(s.tokens) + 1 >= length else TOKEN, -1.0, quota)
        return len(live)


class ScriptedHost(EngineHost):
    def __init__(self):
        self.engine = ScriptedEngine()


class Scorer:
    def begin_step(self, keep, weights_changed):
        return list(keep)

    def stream(self, register, feed, finish):
        return {}


class ClockPlanner(planners.FixedPlanner):
    """Plans drawn from the wall clock: what a planner fitted to measured times amounts
    to, seen from the seed."""

    def plan(self, step: int) -> StepPlan:
        rng = random.Random(time.perf_counter_ns())
        return StepPlan(rng.choice([None, 2, 5]), rng.randint(0, 3))


def scripted_run(cfg, steps: int, recorded=None, planner=None):
    sched = RolloutScheduler(cfg, B, LocalGroup([ScriptedHost()]), {"ref": LocalGroup([Scorer()])},
                             resolve=local_resolve, recorded_plans=recorded)
    sched.planner = planner or sched.planner
    count = iter(range(1000))
    trained, record = [], {}
    for step in range(steps):
        wanted = sched.groups_wanted(step)
        out = sched.rollout(step, [PromptGroup(f"p-{next(count)}", {"language": "en"}, [1], None, N, step)
                                   for _ in range(wanted)])
        sched.end_step(step, StepTimes(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, float("nan")))
        record[step] = plan_record(step, out.plan, out.admitted)
        trained.append([(s.uid, tuple(s.tokens)) for g in out.groups for s in out.results[g.uid]])
    return trained, record


def test_a_replayed_schedule_trains_what_the_recorded_one_did():
    trained, record = scripted_run(overlap_cfg(controller="fixed"), 8, planner=ClockPlanner(None, 0))
    assert len({(r["chunk"], r["delta"]) for r in record.values()}) > 1   # the plans really varied
    again, rerecord = scripted_run(overlap_cfg(replay_plan="run1"), 8, recorded=record)
    assert again == trained and rerecord == record
    # A record that does not fit the run (here: another Δ at step 2, so other admissions) stops it there.
    # Δ grows by more than the largest carry (3): a smaller bend can leave the buffer over-full
    # either way, so that both admit nothing and nothing diverges.
    bent = {**record, 2: {**record[2], "delta": record[2]["delta"] + 4}}
    with pytest.raises(ReplayDiverged, match="step 2 admitted"):
        scripted_run(overlap_cfg(replay_plan="run1"), 8, recorded=bent)


# ---- the record in MLflow --------------------------------------------------------------------
@pytest.fixture
def logger(tmp_path):
    return LoggerConfig(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db", log_system_metrics=False)


def test_the_record_round_trips_through_mlflow_rewritten_every_step(logger):
    with MlflowRun(logger, "rec") as tracker:
        log_plans({0: RECORD[0]})
        log_plans(RECORD)   # the whole record again: the artifact is replaced, not appended
    assert read_plans(logger, tracker.run_id) == RECORD


def test_an_unknown_run_id_is_one_line_naming_it(logger):
    with pytest.raises(ConfigError, match=r"^overlap.replay_plan=0123abc: no MLflow run of that id at sqlite"):
        read_plans(logger, "0123abc")


def test_a_run_without_plans_is_one_line_naming_it(logger):
    with MlflowRun(logger, "sft-like") as tracker:
        pass
    no_plans = rf"replay_plan={tracker.run_id}: run 'sft-like' \(FINISHED\) recorded no plans"
    with pytest.raises(ConfigError, match=no_plans):
        read_plans(logger, tracker.run_id)


def test_a_bad_replay_run_fails_before_ray_starts(tmp_path):
    from asr_grpo.recipes.rl import RLRecipe

    cfg = compose_cfg(tmp_path, "overlap=oppo", "overlap.replay_plan=nosuchrun")
    with pytest.raises(ConfigError, match="overlap.replay_plan=nosuchrun: no MLflow run"):
        RLRecipe(cfg).setup()
    assert not ray.is_initialized()


# ---- the real loop ---------------------------------------------------------------------------
def clock_drawn_plan(costs, groups, B, chunks, deltas, *args, **kwargs):
    """The cost model's table, but a non-serial plan drawn from the wall clock: where the
    model itself plans serial (2 CPU cores) the replay must still repeat overlapped steps,
    chosen by nothing the seed controls."""
    choice, table = best_plan(costs, groups, B, chunks, deltas, *args, **kwargs)
    rng = random.Random(time.perf_counter_ns())
    chunk, delta = rng.choice([(c, d) for c in chunks for d in deltas if (c, d) != (None, 0)])
    return Choice(chunk, delta, choice.predicted), table


def trained_run(root, name: str, *overrides: str):
    """One run of the real loop: per step the trained samples' tokens and rewards, the
    experience, the metrics, and the final weights; and its MLflow run id."""
    from asr_grpo.recipes.rl import RLRecipe
    from asr_grpo.workers.reward import RewardWorker

    steps = []
    cfg = compose_cfg(root, "overlap=oppo", "overlap.controller=cost_model", "overlap.cost_model_warmup=1",
                      "overlap.chunk_candidates=[2,5]", "overlap.delta_max=3", "data.corpus.num_rl=0",
                      "algorithm.max_new_tokens=20", "trainer.steps=5", "trainer.save_every=2",
                      "trainer.eval_every=0", "trainer.lr_warmup_steps=0", "trainer.lr=1e-4",
                      f"trainer.output_dir={root}/{name}", *overrides)
    scorer = RewardWorker(cfg.reward.reward_file, dict(cfg.reward.weights))

    def keep(t):
        # Per-sample rewards: the run's reward function again, in this process, on what it trained.
        seqs = [s for g in t.rollout.groups for s in t.rollout.results[g.uid]]
        rewards = scorer.score(recipe.maker.reward_batch(t.rollout.groups, seqs))["total"]
        steps.append({"samples": [(s.uid, s.tokens, s.versions) for s in seqs], "rewards": rewards,
                      "items": [(i.uid, i.response_ids, i.advantages, i.old_logprobs, i.ref_logprobs)
                                for i in t.items],
                      "metrics": {k: v for k, v in t.metrics.items() if k.startswith(COMPARED) or k in PLAN_KEYS}})

    recipe = RLRecipe(cfg, step_callbacks=[keep])
    try:
        recipe.setup()
        summary = recipe.train()
    finally:
        recipe.cleanup()
    weights = load_file(f"{root}/{name}/step_000005/hf/model.safetensors")
    return steps, weights, summary["mlflow_run_id"]


# Metrics fixed by the experience and the update (not timings, not the planner's own fit).
COMPARED = ("reward/", "policy/", "kl/", "charts/", "experience/", "overlap/carried", "overlap/decode_rounds",
            "overlap/rows_decoded", "overlap/staleness", "overlap/streamed_frac")
PLAN_KEYS = ("overlap/chunk", "overlap/delta")


@pytest.mark.slow
def test_a_replayed_run_equals_its_original_step_for_step(root, monkeypatch):
    monkeypatch.setattr(planners, "best_plan", clock_drawn_plan)
    original, w_original, run_id = trained_run(root, "replay_original")
    record = read_plans(compose_cfg(root).logger, run_id)
    assert sorted(record) == [0, 1, 2, 3, 4]
    assert any(r["chunk"] is not None or r["delta"] for r in record.values()), "only serial steps: vacuous"
    assert any(r["delta"] for r in record.values()) and any(r["chunk"] for r in record.values())

    replayed, w_replayed, replay_id = trained_run(root, "replay_again", f"overlap.replay_plan={run_id}")
    assert read_plans(compose_cfg(root).logger, replay_id) == record
    assert len(replayed) == len(original) == 5
    for step, (a, b) in enumerate(zip(original, replayed)):
        assert a["samples"] == b["samples"], step     # every token, and the policy version that drew it
        assert a["rewards"] == b["rewards"], step     # per sample, exactly
        assert [x[:2] for x in a["items"]] == [x[:2] for x in b["items"]], step
        for x, y in zip(a["items"], b["items"]):
            for t, u in zip(x[2:], y[2:]):
                assert (t is None and u is None) or torch.equal(t, u), (step, x[0])
        assert a["metrics"] == b["metrics"], step
    assert w_original.keys() == w_replayed.keys()
    changed = [k for k in w_original if not torch.equal(w_original[k], w_replayed[k])]
    assert not changed, f"weights differ in {len(changed)} tensors, e.g. {changed[:3]}"
    sft = load_file(f"{root}/checkpoints/sft-debug-fast/model.safetensors")
    assert any(not torch.equal(sft[k], w_original[k]) for k in sft)   # training did something

    # Resumed from its step-2 checkpoint (as if it died after step 4), the run continues its
    # MLflow run's record: steps 0-1 from the checkpoint, steps 2-4 (planned again by the
    # clock) replacing the lines the first process wrote.
    shutil.copytree(root / "replay_original" / "step_000002", root / "replay_resumed" / "step_000002")
    (root / "replay_resumed" / ckpt.LATEST).write_text("step_000002\n")
    *_, resumed_id = trained_run(root, "replay_resumed", "trainer.resume=true")
    assert resumed_id == run_id
    again = read_plans(compose_cfg(root).logger, run_id)
    ran = ckpt.read_driver_state(root / "replay_resumed" / "step_000005")["plans"]
    assert again == {int(s): rec for s, rec in ran.items()} and sorted(again) == [0, 1, 2, 3, 4]
    assert [again[s] for s in (0, 1)] == [record[s] for s in (0, 1)]
