"""When overcommit pays: a decode round that costs the same at 1 and 64 live rows makes
the tail of a step (a few stragglers decoding alone) as dear as its bulk, so cutting it
pays; a round whose cost grows with its rows makes the tail cheap, and overcommit only
moves work around (and re-prefills what it carries)."""
from __future__ import annotations

import statistics

from omegaconf import OmegaConf

from asr_grpo.config.schema import OverlapConfig
from asr_grpo.forecast import DecodeCost, Forward, RoleCost, SimProfile, Workload, simulate
from asr_grpo.forecast.workload import Component, lognormal_mixture

B, N = 16, 4


def profile(decode: DecodeCost) -> SimProfile:
    # 64 rows cost 64 ms either way: flat = 64 ms at any rows; per-row = 1 ms a row.
    return SimProfile("test", 1, "gpu", decode, Forward(per_token_s=2e-5),
                      {"actor": RoleCost("gpu", Forward(per_token_s=1e-5), 2e-5), "ref": RoleCost("gpu", Forward(
                          per_token_s=1e-5))}, ["ref"], stream_hidden=0.5, sync_s=0.05)


FLAT = profile(DecodeCost(overhead_s=0.064))
PER_ROW = profile(DecodeCost(row_s=0.001))


def workload() -> Workload:
    # A long tail: median 60 tokens, log-sd 0.8 across prompts (p99 ~380), cap 512.
    return Workload(lognormal_mixture([Component(1.0, 60, 0.8)], 0.1), B, N, 512, prompt_text_tokens=40)


def speedup(prof: SimProfile, mode: str, **overlap) -> float:
    cfg = OmegaConf.structured(OverlapConfig(mode="oppo", **{"controller": "fixed", **overlap}))
    res = simulate(prof, workload(), cfg, ("none", mode), steps=30, warmup=6)
    return res["none"].summary()["step_s"] / res[mode].summary()["step_s"]


def test_overcommit_pays_when_a_round_costs_the_same_at_1_and_64_rows():
    assert FLAT.decode.round_s(1, 0) == FLAT.decode.round_s(64, 0)
    assert speedup(FLAT, "inter", delta_init=4) > 1.25


def test_overcommit_does_not_pay_when_rounds_scale_with_rows():
    assert PER_ROW.decode.round_s(64, 0) == 64 * PER_ROW.decode.round_s(1, 0)
    assert speedup(PER_ROW, "inter", delta_init=4) < 1.05


def test_the_cost_model_planner_overcommits_only_where_it_pays():
    """oppo's cost-model planner, fed the simulated timings, picks Δ > 0 on the flat
    profile and stays at Δ = 0 where rounds scale with rows."""
    cfg = OmegaConf.structured(OverlapConfig(mode="oppo", controller="cost_model", delta_init=4, delta_max=4,
                                             chunk_candidates=[16, 32]))
    deltas = {}
    for name, prof in (("flat", FLAT), ("per_row", PER_ROW)):
        res = simulate(prof, workload(), cfg, ("oppo",), steps=30, warmup=10)["oppo"]
        deltas[name] = statistics.median(s.delta for s in res.measured)
    assert deltas["flat"] > 0
    assert deltas["per_row"] == 0
