"""The forecast decides as a run does: the same scheduler over the same lengths trains the
same groups, with the same tokens, in the same steps, as the scheduler over plain
round-by-round hosts (tests/overlap/test_scheduler.py's ScriptedHost pattern). And the
simulated engine's jump-ahead decode equals the pool's round-by-round loop."""
from __future__ import annotations

import zlib

import pytest
from omegaconf import OmegaConf

from asr_grpo.config.schema import OverlapConfig
from asr_grpo.forecast import DecodeCost, Forward, RoleCost, SimProfile, Simulation, Workload
from asr_grpo.forecast.clock import Lane
from asr_grpo.forecast.hosts import SimEngine
from asr_grpo.overlap.local_group import LocalGroup, local_resolve
from asr_grpo.overlap.scheduler import RolloutScheduler
from asr_grpo.overlap.step_times import StepTimes
from asr_grpo.rollout.host import EngineHost
from asr_grpo.rollout.pool import SequencePool

EOS, TOKEN = 0, 7
B, N, MAX = 4, 3, 48


def length(uid: str) -> int:
    """Every fifth prompt has one straggler (sample 1: 45 tokens), the rest 2-12; some hit the cap."""
    group, sample = uid.split("#")
    index = int(group.rsplit("-", 1)[1])
    if index % 5 == 2 and sample == "1":
        return 45 if index % 10 else 60
    return 2 + zlib.crc32(uid.encode()) % 11


class ScriptedEngine(SequencePool):
    def __init__(self):
        super().__init__(MAX, {EOS})

    def _advance(self, quota) -> int:
        live = [s for s in self._live if not s.done]
        for s in live:
            self._append(s, EOS if len(s.tokens) + 1 >= length(s.request.uid) else TOKEN, -1.0, quota)
        return len(live)


class ScriptedHost(EngineHost):
    def __init__(self):
        self.engine = ScriptedEngine()


class Scorer:
    def begin_step(self, keep, weights_changed):
        return list(keep)

    def stream(self, register, feed, finish):
        return {u: 0.0 for u in finish}


def config(mode: str, **kw):
    return OmegaConf.structured(OverlapConfig(mode=mode, controller="trial", chunk_candidates=[kw.get("chunk_size", 5)],
                                              **kw))


def real_run(mode: str, hosts: int, steps: int, **kw) -> list[list[tuple]]:
    """The scheduler over round-by-round hosts, weights bumped after each step as the sync does."""
    sched = RolloutScheduler(config(mode, **kw), B, LocalGroup([ScriptedHost() for _ in range(hosts)]),
                             {"ref": LocalGroup([Scorer()])}, frozen_scorers=("ref",), resolve=local_resolve)
    count = iter(range(10_000))
    from asr_grpo.experience.types import PromptGroup

    out = []
    for step in range(steps):
        wanted = sched.groups_wanted(step)
        ro = sched.rollout(step, [PromptGroup(f"p-{i}", {"language": "en"}, [], None, N, step, i)
                                  for i in (next(count) for _ in range(wanted))])
        out.append([(g.uid, tuple((r.uid, len(r.tokens), r.finish_reason) for r in ro.results[g.uid]))
                    for g in ro.groups])
        sched.end_step(step, StepTimes(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, mean_reward=0.5 + 0.01 * step))
        for h in sched.hosts.members:
            h.set_policy_version(step + 1)
    return out


def forecast_run(mode: str, hosts: int, steps: int, **kw) -> list[list[tuple]]:
    profile = SimProfile("test", hosts, "gpu", DecodeCost(overhead_s=0.01, row_s=0.001), Forward(per_token_s=1e-4),
                         {"actor": RoleCost("gpu", Forward(per_token_s=1e-4), 1e-4),
                          "ref": RoleCost("gpu", Forward(per_token_s=1e-4))}, ["ref"], stream_hidden=0.5)
    workload = Workload(None, B, N, MAX, prompt_text_tokens=8,
                        scripted=lambda g: [length(f"{g}#{k}") for k in range(N)])
    sim = Simulation(profile, workload, config(mode, **kw), mode)
    out = []
    for step in range(steps):
        rec = sim.step(step)
        out.append([(g, tuple(rec.samples_of[g])) for g in rec.trained])
    return out


@pytest.mark.parametrize("hosts", [1, 2])
@pytest.mark.parametrize("mode,kw", [("none", {}), ("intra", {"chunk_size": 5}), ("inter", {"delta_init": 2}),
                                     ("inter", {"delta_init": 3, "stop_check_every": 4}),
                                     ("oppo", {"chunk_size": 5, "delta_init": 2, "delta_max": 4})])
def test_the_forecast_trains_what_the_scheduler_trains_over_real_hosts(mode, kw, hosts):
    real, sim = real_run(mode, hosts, 10, **kw), forecast_run(mode, hosts, 10, **kw)
    assert sim == real
    assert sum(1 for step in real for _, seqs in step for _, n, _ in seqs if n >= 45) > 0   # stragglers trained
    if mode in ("inter", "oppo"):   # non-vacuous: overcommit changed what trained when
        assert real != real_run("none", hosts, 10)


@pytest.mark.parametrize("budget,quota,every", [(None, None, 1), (5, None, 1), (None, 2, 1), (7, 3, 2), (None, 4, 3)])
def test_jump_ahead_decode_equals_the_round_by_round_loop(budget, quota, every):
    def engine():
        wl = Workload(None, 6, N, MAX, prompt_text_tokens=8, scripted=lambda g: [length(f"{g}#{k}") for k in range(N)])
        e = SimEngine(wl, DecodeCost(overhead_s=0.01, mem_s=0.002, kv_s=1e-5, flop_s=3e-4), Forward(per_token_s=1e-4),
                      Lane("engine"))
        from asr_grpo.experience.types import PromptGroup

        e.add_requests([r for i in range(6) for r in PromptGroup(f"p-{i}", {}, [], None, N, 0, i).requests()])
        return e

    fast, slow = engine(), engine()
    for _ in range(4):
        a = fast.decode(budget, quota, every)
        b = SequencePool.decode(slow, budget, quota, every)   # the pool's loop over SimEngine._advance
        assert [(s.request.uid, s.tokens, s.finish_reason, s.versions) for s in a] == \
            [(s.request.uid, s.tokens, s.finish_reason, s.versions) for s in b]
        assert fast.t == pytest.approx(slow.t)
    sa, sb = fast.take_stats(), slow.take_stats()
    assert sa["prefill_tokens"] == sb["prefill_tokens"]
    assert {r: c for r, (c, _) in sa["rounds"].items()} == {r: c for r, (c, _) in sb["rounds"].items()}
    for r in sa["rounds"]:
        assert sa["rounds"][r][1] == pytest.approx(sb["rounds"][r][1])
