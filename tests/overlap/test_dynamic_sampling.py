"""DAPO's dynamic sampling in the rollout scheduler, without Ray: the real scheduler and
decode loop over scripted hosts (tests/scripted_rollout.py), and a reward made up per
group so that the groups whose rewards are all equal are known in advance. In every
overlap mode: no such group trains or is carried, each one dropped is replaced by exactly
one more admission within the bound, and the counters say so."""
from __future__ import annotations

import random
import time

import pytest
import torch
from omegaconf import OmegaConf
from scripted_rollout import B, N, ScriptedHost, prompts

from asr_grpo.algorithms.group_spread import flat_groups
from asr_grpo.config.schema import OverlapConfig
from asr_grpo.overlap import planners
from asr_grpo.overlap.dynamic_sampling import DynamicSampling
from asr_grpo.overlap.local_group import LocalGroup
from asr_grpo.overlap.scheduler import RolloutScheduler
from asr_grpo.overlap.step_times import StepTimes

MODES = {"none": {}, "intra": {"chunk_size": 2}, "inter": {"delta_init": 2}, "oppo": {"chunk_size": 2, "delta_init": 2}}


def flat_prompt(uid: str) -> bool:
    """Prompts 0, 3, 6, ... get the same reward on every sample (3 is one of the long ones)."""
    return int(uid.rsplit("-", 1)[1]) % 3 == 0


def reward(sample_uid: str) -> float:
    group, sample = sample_uid.split("#")
    return 1.0 if flat_prompt(group) else float(sample) / N


class RewardJudge:
    """The experience maker's part, made up: rewards per sample, the real flat test."""

    def __init__(self):
        self.judged: list[str] = []   # every group asked about, in order
        self.flat: list[str] = []     # those it named

    def __call__(self, groups, results) -> set[str]:
        seqs = [s for g in groups for s in results[g.uid]]
        assert all(s.done for s in seqs), "judged a group before it finished"
        self.judged += [g.uid for g in groups]
        flat = flat_groups(torch.tensor([reward(s.uid) for s in seqs]), [s.group for s in seqs])
        self.flat += sorted(flat)
        return flat


class FrozenScorer:
    """A streaming scorer whose calls return at once a score for each finished sequence."""

    def begin_step(self, keep, weights_changed):
        return list(keep)

    def stream(self, register, feed, finish):
        return {u: torch.zeros(1) for u in finish}


def scheduler(mode: str, bound: int = 100, group_multiple: int = 1, hosts: int = 1, recorded=None):
    cfg = OmegaConf.structured(OverlapConfig(mode=mode, controller="fixed", replay_plan="run1" if recorded else "",
                                             **MODES[mode]))
    judge, new_groups = RewardJudge(), prompts()
    sampling = DynamicSampling(judge, new_groups, bound, group_multiple=group_multiple)
    scorers = {"ref": LocalGroup([FrozenScorer()])} if mode in ("intra", "oppo") else None
    sched = RolloutScheduler(cfg, B, LocalGroup([ScriptedHost() for _ in range(hosts)]), scorers,
                             resolve=lambda x: x, frozen_scorers=("ref",), dynamic_sampling=sampling,
                             recorded_plans=recorded)
    return sched, judge, new_groups


def run(sched, new_groups, steps: int):
    out = []
    for step in range(steps):
        wanted = sched.groups_wanted(step)
        rollout = sched.rollout(step, new_groups(wanted, step))
        out.append((wanted, rollout))
    return out


@pytest.mark.parametrize("mode", list(MODES))
def test_no_flat_group_trains_and_each_dropped_one_is_one_more_admission(mode):
    sched, judge, new_groups = scheduler(mode)
    steps = run(sched, new_groups, 6)
    trained = [g.uid for _, r in steps for g in r.groups]
    dropped = [u for u in judge.flat]
    assert dropped, "no group was flat: the test would be vacuous"
    assert not any(flat_prompt(u) for u in trained)
    assert not any(flat_prompt(e.group.uid) for e in sched.buffer if e.done)   # never carried
    assert sorted(judge.judged) == sorted(set(judge.judged))                   # each group asked once
    for wanted, r in steps:
        m = r.metrics
        assert len(r.groups) == B and m["dynamic_sampling/trained_groups"] == B
        assert m["dynamic_sampling/bound_hit"] == 0
        # the step's admissions: what refilled the buffer, plus one per dropped group
        assert m["dynamic_sampling/extra_groups"] == m["dynamic_sampling/dropped_groups"]
        assert len(r.admitted) == wanted + m["dynamic_sampling/dropped_groups"]
        assert all(all(s.done for s in r.results[g.uid]) for g in r.groups)
    per_step = sum(r.metrics["dynamic_sampling/dropped_groups"] for _, r in steps)
    assert per_step == len(dropped) == sched.counts["groups_dropped"]
    admitted = [u for _, r in steps for u in r.admitted]
    assert sched.counts["groups_entered"] == len(admitted) == len(set(admitted))
    # Every admitted group trained, was dropped, or waits in the buffer: exactly one of them.
    waiting = [e.group.uid for e in sched.buffer]
    assert sorted(trained + dropped + waiting) == sorted(admitted)
    assert set(dropped) == {u for u in admitted if flat_prompt(u)} - set(waiting)


@pytest.mark.parametrize("mode", list(MODES))
def test_the_bound_caps_the_extra_draws_and_the_step_trains_the_groups_that_spread(mode):
    sched, judge, new_groups = scheduler(mode, bound=1)
    steps = run(sched, new_groups, 6)
    assert any(r.metrics["dynamic_sampling/bound_hit"] for _, r in steps), "bound never reached: vacuous"
    for wanted, r in steps:
        m = r.metrics
        dropped, extra = m["dynamic_sampling/dropped_groups"], m["dynamic_sampling/extra_groups"]
        assert extra == min(dropped, 1)
        assert m["dynamic_sampling/bound_hit"] == float(dropped > 1)
        assert len(r.admitted) == wanted + extra
        assert not any(flat_prompt(g.uid) for g in r.groups)
        assert m["dynamic_sampling/trained_groups"] == len(r.groups) <= B
        if mode in ("none", "intra"):   # no overcommit buffer to fall back on: one group short per unreplaced drop
            assert len(r.groups) == B - (dropped - extra)


def test_a_bound_of_zero_only_filters_and_a_step_of_flat_groups_trains_nothing():
    sched, judge, new_groups = scheduler("none", bound=0)
    (wanted, first), = run(sched, new_groups, 1)
    assert sorted(g.uid for g in first.groups) == ["p-1", "p-2"]    # p-0 and p-3 dropped, not replaced
    assert first.metrics["dynamic_sampling/dropped_groups"] == 2
    assert first.metrics["dynamic_sampling/extra_groups"] == 0
    assert first.metrics["dynamic_sampling/bound_hit"] == 1
    assert len(first.admitted) == wanted == B
    sched.dynamic.judge = lambda groups, results: {g.uid for g in groups}   # every group flat
    sched.groups_wanted(1)
    empty = sched.rollout(1, new_groups(B, 1))
    assert empty.groups == [] and empty.results == {}
    assert empty.metrics["dynamic_sampling/trained_groups"] == 0 and sched.buffer == []


def test_a_short_batch_keeps_a_multiple_of_the_ranks_and_the_rest_trains_next_step():
    sched, judge, new_groups = scheduler("none", bound=0, group_multiple=2)
    run(sched, new_groups, 1)   # p-1, p-2 spread: an even batch
    sched.dynamic.judge = lambda groups, results: {g.uid for g in groups if g.uid != "p-4"}
    sched.groups_wanted(1)
    short = sched.rollout(1, new_groups(B, 1))   # p-4..p-7: only p-4 spreads
    assert short.groups == [] and short.metrics["dynamic_sampling/trimmed_groups"] == 1
    assert [e.group.uid for e in sched.buffer] == ["p-4"] and sched.buffer[0].done
    sched.dynamic.judge = lambda groups, results: set()
    assert sched.groups_wanted(2) == B - 1
    nxt = sched.rollout(2, new_groups(B - 1, 2))
    assert [g.uid for g in nxt.groups][0] == "p-4" and len(nxt.groups) == B   # judged once, trained now


@pytest.mark.parametrize("mode", ["intra", "oppo"])
def test_streamed_scores_of_dropped_groups_reach_no_one(mode):
    sched, judge, new_groups = scheduler(mode)
    for step in range(6):   # the experience maker takes each step's scores before the next step
        r = sched.rollout(step, new_groups(sched.groups_wanted(step), step))
        scores = r.streamed["ref"].get()
        assert set(scores) == {s.uid for rs in r.results.values() for s in rs}
    dropped = {f"{g}#{i}" for g in judge.flat for i in range(N)}
    ledger = sched.streams
    assert not dropped & set(ledger._stash["ref"])             # never kept for a later step
    assert not dropped & ledger._streamed_done["ref"]


def test_several_hosts_share_the_replacements():
    sched, judge, new_groups = scheduler("oppo", hosts=2)
    steps = run(sched, new_groups, 5)
    assert judge.flat and all(len(r.groups) == B for _, r in steps)
    assert not any(flat_prompt(g.uid) for _, r in steps for g in r.groups)


def test_the_judged_flag_survives_a_checkpoint():
    sched, judge, new_groups = scheduler("inter")
    run(sched, new_groups, 2)
    state = sched.state_dict()
    assert state["counts"]["groups_dropped"] == len(judge.flat)
    again, judge2, _ = scheduler("inter")
    by_uid = {e.group.uid: e.group for e in sched.buffer}
    again.load_state_dict(state, lambda saved: by_uid[saved["uid"]])
    assert [e.judged for e in again.buffer] == [e.judged for e in sched.buffer]
    assert again.counts == sched.counts


class ClockPlanner(planners.FixedPlanner):
    """Δ and chunk drawn from the wall clock: only the run's plan record can repeat them."""

    def plan(self, step: int) -> planners.StepPlan:
        rng = random.Random(time.perf_counter_ns())
        return planners.StepPlan(rng.choice([None, 2, 5]), rng.randint(0, 3))


def test_a_replayed_run_admits_the_same_replacements_and_trains_the_same_groups():
    def go(sched, new_groups, planner=None):
        sched.planner = planner or sched.planner
        record, trained = {}, []
        for step in range(6):
            out = sched.rollout(step, new_groups(sched.groups_wanted(step), step))
            sched.end_step(step, StepTimes(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, float("nan")))   # the replay checks here
            record[step] = planners.plan_record(step, out.plan, out.admitted)
            trained.append([g.uid for g in out.groups])
        return record, trained

    sched, judge, new_groups = scheduler("oppo")
    record, trained = go(sched, new_groups, ClockPlanner(None, 0))
    assert judge.flat and len({r["delta"] for r in record.values()}) > 1   # drops, and plans that varied
    again, judge_again, groups_again = scheduler("oppo", recorded=record)
    assert go(again, groups_again) == (record, trained)
    assert judge_again.flat == judge.flat
