"""The rollout scheduler without Ray: the real scheduler, the real round-by-round decode
loop and group quota of the engines, over hosts whose engine emits scripted lengths
(a stand-in for the model only). Long tails are chosen by hand, so what overcommit
must carry and which groups must train are known."""
from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf
from scripted_rollout import B, N, ScriptedHost, prompts

from asr_grpo.config.schema import OverlapConfig
from asr_grpo.overlap import planners
from asr_grpo.overlap.local_group import LocalGroup, local_resolve
from asr_grpo.overlap.scheduler import RolloutScheduler
from asr_grpo.overlap.step_times import StepTimes


class DeferredScores:
    """A streaming scorer call's result that is not ready yet (what a Ray ref is)."""

    def __init__(self, finish: list[str]):
        self.finish = finish


class RecordingScorer:
    def __init__(self):
        self.calls = []

    def begin_step(self, keep, weights_changed):
        return list(keep)

    def stream(self, register, feed, finish):
        self.calls.append((len(register), dict(feed), list(finish)))
        return DeferredScores(finish)


def scheduler(mode: str, hosts: int = 1, scorers=None, resolve=local_resolve, **overlap) -> RolloutScheduler:
    # Forced chunk and Δ unless a test asks for a planner: what the mechanics do is known.
    cfg = OmegaConf.structured(OverlapConfig(mode=mode, **{"controller": "fixed", **overlap}))
    return RolloutScheduler(cfg, B, LocalGroup([ScriptedHost() for _ in range(hosts)]), scorers, resolve=resolve)


def run(sched: RolloutScheduler, steps: int):
    new_groups = prompts()
    return [sched.rollout(step, new_groups(sched.groups_wanted(step), step)) for step in range(steps)]


@pytest.mark.parametrize("hosts", [1, 2])
def test_overcommit_carries_unfinished_groups_and_decodes_fewer_rounds(hosts):
    serial = run(scheduler("none", hosts), 8)
    over = run(scheduler("inter", hosts, delta_init=2), 8)
    rounds = lambda out: sum(r.metrics["overlap/decode_rounds"] for r in out) / len(out)  # noqa: E731
    assert rounds(over) < 0.75 * rounds(serial)
    assert sum(r.metrics["overlap/carried_unfinished_groups"] for r in over) > 0
    for r in over:
        assert len(r.groups) == B
        assert all(s.done for rs in r.results.values() for s in rs)
    # Serial: every group of the step trains, the tail decides the rounds.
    assert all(r.metrics["overlap/decode_rounds"] == 40 for r in serial)


def test_the_first_B_groups_to_finish_train_now():
    sched = scheduler("inter", delta_init=2)
    first = run(sched, 1)[0]
    # Prompts 0..5 entered; prompt 3 holds the 40-token sample, so it is carried.
    assert sorted(g.uid for g in first.groups) == ["p-0", "p-1", "p-2", "p-4"]
    assert [e.group.uid for e in sched.buffer] == ["p-3", "p-5"]
    assert not sched.buffer[0].done


@pytest.mark.parametrize("delta", [0, 1, 3])
def test_delta_sets_how_many_groups_are_admitted(delta):
    sched = scheduler("inter", delta_init=delta)
    run(sched, 1)
    assert sched.counts["groups_entered"] == B + delta
    assert len(sched.buffer) == delta


def test_a_host_that_drops_a_carried_sequence_fails_clearly():
    sched = scheduler("inter", delta_init=2)
    new_groups = prompts()
    sched.rollout(0, new_groups(sched.groups_wanted(0)))
    host = sched.hosts.members[0]
    lost = [s.request.uid for s in host.engine.live()]
    assert lost, "nothing carried: the test would be vacuous"
    host.engine.drain()   # the host forgets its live sequences
    sched.B = len(sched.buffer) + 1   # the step needs the carried groups
    sched.groups_wanted(1)
    with pytest.raises(RuntimeError, match="hold none of the .* unfinished sequences"):
        sched.rollout(1, [])


def test_streaming_never_waits_on_a_scorer_inside_the_rollout():
    resolved = []

    def resolve(x):
        if isinstance(x, DeferredScores):
            resolved.append(x)
            return {u: torch.zeros(1) for u in x.finish}
        return x

    scorer = RecordingScorer()
    sched = scheduler("intra", scorers={"ref": LocalGroup([scorer])}, resolve=resolve, chunk_size=2)
    out = run(sched, 1)[0]
    assert len(scorer.calls) > 3                 # chunks streamed while decoding went on
    assert resolved == []                        # ... and none was awaited during the rollout
    out.streamed["ref"].get()                    # the experience maker waits, afterwards
    assert len(resolved) == len(scorer.calls)
    # Every sequence streamed in chunks of 2 reached the scorer whole before finishing.
    fed = {}
    for _, feed, _ in scorer.calls:
        fed.update(feed)
    assert {u: len(t) for u, t in fed.items()} == {s.uid: len(s.tokens) for rs in out.results.values() for s in rs}


def test_chunk_does_not_change_which_groups_train():
    """Completion is checked every round, apart from the chunk: any chunk trains the
    same groups with the same tokens."""
    trained = []
    for chunk in (1, 3, 16):
        sched = scheduler("oppo", scorers={"ref": LocalGroup([RecordingScorer()])}, controller="trial",
                          chunk_size=chunk, chunk_candidates=[chunk], delta_init=2)
        out = run(sched, 4)
        trained.append([[(s.uid, tuple(s.tokens)) for g in r.groups for s in r.results[g.uid]] for r in out])
    assert trained[0] == trained[1] == trained[2]


class TimedHost(ScriptedHost):
    """Reports decode rounds costing 2.5 ms + 0.5 ms per live row."""

    def take_decode_stats(self) -> dict:
        return {"rounds": {1: [4, 4 * 0.003], 9: [2, 2 * 0.007]}, "prefill_tokens": 120, "prefill_seconds": 0.01}


def test_every_step_logs_its_decode_round_costs_whatever_the_mode():
    # A serial run logs a + b·rows from its own rounds: the forecast fits profile=run from it.
    sched = RolloutScheduler(OmegaConf.structured(OverlapConfig(mode="none")), B, LocalGroup([TimedHost()]),
                             resolve=local_resolve)
    run(sched, 1)
    metrics = sched.end_step(0, StepTimes(1.0, 0.0, 0.0, 0.0, 0.0, 0.0, float("nan")))
    assert metrics["perf/decode/round_fixed_ms"] == pytest.approx(2.5)
    assert metrics["perf/decode/round_per_row_ms"] == pytest.approx(0.5)
    assert metrics["perf/decode/prefill_tokens"] == 120


# ---- the step's API: groups handed in, times handed over ---------------------------------
def test_a_step_admits_the_groups_it_asked_for_and_no_more():
    sched = scheduler("inter", delta_init=2)
    new_groups = prompts()
    with pytest.raises(RuntimeError, match="ask groups_wanted"):
        sched.rollout(0, [])
    wanted = sched.groups_wanted(0)
    assert wanted == B + 2 and sched.groups_wanted(0) == wanted   # asking twice plans once
    with pytest.raises(ValueError, match="admits 6 new prompt groups, not 7"):
        sched.rollout(0, new_groups(wanted + 1))
    out = sched.rollout(0, new_groups(wanted))
    assert out.admitted == [f"p-{i}" for i in range(7, 13)]
    # The carried groups count: the next step asks only for what refills B + Δ.
    assert sched.groups_wanted(1) == B + 2 - len(sched.buffer) < wanted


class RecordingPlanner(planners.FixedPlanner):
    def __init__(self):
        super().__init__(None, 0)
        self.seen: list[planners.StepObservation] = []

    def observe(self, obs):
        self.seen.append(obs)
        return {}


def test_the_planner_observes_every_measured_time_of_the_step():
    """Each field of the record reaches the planner's observation as it was measured:
    none is left at a default (what reading them back by metric name risked)."""
    sched = scheduler("none")
    sched.planner = planner = RecordingPlanner()
    run(sched, 1)
    times = StepTimes(step_s=9.0, rollout_s=4.0, scoring_s=3.0, training_s=1.5, sync_s=0.5,
                      reward_wait_s=0.25, mean_reward=0.75)
    sched.end_step(0, times)
    (obs,) = planner.seen
    observed = {"step_s": obs.step_s, "rollout_s": obs.rollout_s, "scoring_s": obs.scoring_s,
                "training_s": obs.training_s, "reward_wait_s": obs.reward_wait_s,
                "mean_reward": obs.mean_reward}
    assert observed == {k: v for k, v in vars(times).items() if k != "sync_s"}
    assert obs.samples == B * N and obs.decoded and len(obs.trained_lengths) == B


# ---- worker deaths: the caller says what one looks like -----------------------------------
class Died(Exception):
    """What `ray.get` raises for a dead actor, here."""


class DyingHost(ScriptedHost):
    """Its second decode call dies: the process goes, and the sequences with it."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def decode(self, *args):
        self.calls += 1
        if self.calls == 2:
            self.engine.drain()
            return Died("host 0 died")
        return super().decode(*args)


def raise_deaths(result):
    if isinstance(result, Died):
        raise result
    return result


def test_a_host_that_dies_is_restored_and_the_step_trains_what_it_would_have():
    cfg = OmegaConf.structured(OverlapConfig(mode="intra", controller="fixed", chunk_size=2))
    restored = []
    sched = RolloutScheduler(cfg, B, LocalGroup([DyingHost()]), {"ref": LocalGroup([RecordingScorer()])},
                             resolve=raise_deaths, is_death=lambda e: isinstance(e, Died),
                             restore_host=restored.append)
    out = run(sched, 1)[0]
    assert restored == [0] and sched.host_restarts == 1
    healthy = run(scheduler("intra", scorers={"ref": LocalGroup([RecordingScorer()])}, chunk_size=2), 1)[0]
    tokens = lambda r: {s.uid: s.tokens for rs in r.results.values() for s in rs}  # noqa: E731
    assert tokens(out) == tokens(healthy)


def test_without_is_death_a_worker_error_is_the_callers_to_see():
    cfg = OmegaConf.structured(OverlapConfig(mode="intra", controller="fixed", chunk_size=2))
    sched = RolloutScheduler(cfg, B, LocalGroup([DyingHost()]), {"ref": LocalGroup([RecordingScorer()])},
                             resolve=raise_deaths, restore_host=lambda rank: None)
    with pytest.raises(Died, match="host 0 died"):
        run(sched, 1)
