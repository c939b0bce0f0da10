"""The overlap cost model: buffer simulation by hand, fits from synthetic timings, and the
planner's choices in the two regimes (decode rounds that scale with rows: stay serial;
rounds that cost the same at 1 and 64 rows: overcommit and stream)."""
from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from asr_grpo.config.schema import OverlapConfig
from asr_grpo.overlap.cost_model import (
    CostFitter,
    CostProfile,
    best_plan,
    predict,
    remote_wait,
    service_drain,
    simulate_buffer,
)
from asr_grpo.overlap.planners import CostModelPlanner, StepObservation, StepPlan, make_planner

# Long-tailed groups of 4 samples: most finish in 4-8 tokens, one in six runs to 60.
TAILED = [(4, 5, 6, 8)] * 5 + [(5, 6, 7, 60)]


def test_serial_shape_by_hand():
    shape = simulate_buffer([(3, 5)], B=2, delta=0, wait_all=True)
    assert shape.rounds == 5                 # the longest sample
    assert shape.row_rounds == 2 * (3 + 5)   # every token of both groups
    assert shape.trained_tokens == 16 and shape.carried_tokens == 0 and shape.carried_groups == 0


def test_overcommit_shape_by_hand():
    # B=1, Δ=1 with groups alternating short (2 tokens) and long (6): each step trains
    # the group that finishes first and carries the other with its tokens.
    shape = simulate_buffer([(2,), (6,)], B=1, delta=1, steps=60, seed=3)
    serial = simulate_buffer([(2,), (6,)], B=1, delta=0, steps=60, seed=3)
    assert shape.rounds < serial.rounds
    assert shape.carried_tokens > 0 and shape.carried_groups > 0
    # Every decoded token is kept: over a long run, tokens decoded = tokens trained.
    assert shape.row_rounds == pytest.approx(shape.trained_tokens, rel=0.15)


def test_overcommit_cuts_decode_rounds_on_a_long_tail():
    serial = simulate_buffer(TAILED, B=4, delta=0)
    over = simulate_buffer(TAILED, B=4, delta=2)
    assert over.rounds < 0.7 * serial.rounds
    assert over.carried_groups > 0


def test_prediction_adds_up():
    costs = CostProfile(round_fixed_s=0.01, round_per_row_s=0.001, prefill_per_token_s=0.0,
                        score_per_token_s=0.002, train_per_sample_s=0.1, step_fixed_s=0.5)
    shape = simulate_buffer([(3, 5)], B=2, delta=0, wait_all=True)
    p = predict(costs, shape, samples=4, chunk=None, mean_length=4)
    assert p.decode_s == pytest.approx(5 * 0.01 + 16 * 0.001)
    assert p.scoring_s == pytest.approx(16 * 0.002)
    assert p.step_s == pytest.approx(p.decode_s + p.scoring_s + 0.4 + 0.5)


def cpu_like() -> CostProfile:
    # Measured on 2 CPU cores: a round costs 1.3 ms at 1 row, 10.8 ms at 64; the scorers
    # share the actor's cores, so streaming hides nothing and costs its calls.
    return CostProfile(round_fixed_s=0.00115, round_per_row_s=0.00015, prefill_per_token_s=0.0002,
                       score_per_token_s=0.0004, stream_hidden=0.0, stream_call_s=0.003,
                       train_per_sample_s=0.025, step_fixed_s=0.3)


def gpu_like() -> CostProfile:
    # Memory-bound decode: a round costs the same at 1 and 64 rows; scorers on their own GPU.
    return CostProfile(round_fixed_s=0.03, round_per_row_s=0.0, prefill_per_token_s=0.00001,
                       score_per_token_s=0.001, stream_hidden=1.0, stream_call_s=0.001,
                       train_per_sample_s=0.01, step_fixed_s=0.2)


def test_where_overlap_cannot_pay_the_plan_is_serial():
    choice, table = best_plan(cpu_like(), TAILED, B=8, chunks=[None, 8, 16, 32], deltas=range(5))
    assert (choice.chunk, choice.delta) == (None, 0)
    assert table["8/0"] > table["0/0"]   # streaming only adds its calls here


def test_where_rounds_cost_the_same_at_any_width_it_overcommits_and_streams():
    choice, table = best_plan(gpu_like(), TAILED, B=8, chunks=[None, 8, 16, 32], deltas=range(5))
    assert choice.delta > 0 and choice.chunk is not None
    assert choice.predicted.step_s < 0.9 * table["0/0"]


def test_fitter_recovers_round_costs_and_phases():
    fitter = CostFitter(decay=1.0)
    a, b = 0.002, 0.0005
    for _ in range(3):
        fitter.observe_decode({"rounds": {r: [10, 10 * (a + b * r)] for r in (1, 8, 32, 64)},
                               "prefill_tokens": 1000, "prefill_seconds": 0.2})
        fitter.observe_step(streamed=False, decode_s=1.0, scoring_s=0.6, training_s=1.6, fixed_s=0.3,
                            samples=64, trained_tokens=1200)
    fitter.observe_lengths([[10, 12], [14, 9]])
    costs = fitter.profile()
    assert costs.round_fixed_s == pytest.approx(a, rel=1e-6)
    assert costs.round_per_row_s == pytest.approx(b, rel=1e-6)
    assert costs.prefill_per_token_s == pytest.approx(0.0002)
    assert costs.score_per_token_s == pytest.approx(0.6 / 1200)
    assert costs.train_per_sample_s == pytest.approx(1.6 / 64)
    assert fitter.ready


def observation(step: int, plan: StepPlan, costs: CostProfile, groups) -> StepObservation:
    """A step as the recipe would report it, timed by `costs` on the groups it trains."""
    trained = [list(g) for g in groups[:8]]
    tokens = sum(map(sum, trained))
    shape = simulate_buffer(groups, B=8, delta=plan.delta)
    shape.trained_tokens = tokens
    p = predict(costs, shape, 32, plan.chunk, tokens / 32)
    rounds = {1: [5, 5 * costs.round_s(1)], 32: [20, 20 * costs.round_s(32)]}
    decode = sum(s for _, s in rounds.values())
    return StepObservation(step=step, plan=plan, step_s=decode + p.scoring_s + p.training_s + p.fixed_s,
                           rollout_s=decode, scoring_s=p.scoring_s, training_s=p.training_s,
                           decode_stats={"rounds": rounds, "prefill_tokens": 1000,
                                         "prefill_seconds": 1000 * costs.prefill_per_token_s},
                           trained_lengths=trained, samples=32, mean_reward=0.5)


@pytest.mark.parametrize("costs,overlaps", [(cpu_like(), False), (gpu_like(), True)])
def test_planner_warms_up_serial_then_follows_the_costs(costs, overlaps):
    cfg = OmegaConf.structured(OverlapConfig(mode="oppo", delta_init=4, delta_max=4, cost_model_warmup=3))
    planner = make_planner(cfg, prompts_per_step=8, stream_hidden_prior=costs.stream_hidden)
    assert isinstance(planner, CostModelPlanner)
    plans = []
    for step in range(6):
        plan = planner.plan(step)
        plans.append(plan)
        planner.observe(observation(step, plan, costs, TAILED * 3))
    assert all((p.chunk, p.delta) == (None, 0) for p in plans[:3])
    assert all((p.delta > 0 and p.chunk is not None) == overlaps for p in plans[3:])
    assert plans[-1].predicted_s is not None
    # Its whole state round-trips: a resumed planner plans the same.
    again = make_planner(cfg, prompts_per_step=8, stream_hidden_prior=costs.stream_hidden)
    again.load_state_dict(planner.state_dict())
    assert again.plan(6) == planner.plan(6)


@pytest.mark.parametrize("mode,streams,overcommits", [("intra", True, False), ("inter", False, True)])
def test_each_mode_plans_only_what_it_allows(mode, streams, overcommits):
    # Where overlap pays (GPU-like costs), intra's planner streams without overcommit and
    # inter's overcommits without streaming; on CPU-like costs both stay serial.
    for costs, pays in ((gpu_like(), True), (cpu_like(), False)):
        cfg = OmegaConf.structured(OverlapConfig(mode=mode, delta_init=4, delta_max=4, cost_model_warmup=3))
        planner = make_planner(cfg, prompts_per_step=8, stream_hidden_prior=costs.stream_hidden)
        plans = []
        for step in range(6):
            plans.append(planner.plan(step))
            planner.observe(observation(step, plans[-1], costs, TAILED * 3))
        late = plans[3:]
        assert all((p.chunk is not None) == (streams and pays) for p in late), (mode, pays, late)
        assert all((p.delta > 0) == (overcommits and pays) for p in late), (mode, pays, late)


@pytest.mark.parametrize("mode,plan", [("none", (None, 0)), ("intra", (12, 0)), ("inter", (None, 3)),
                                       ("oppo", (12, 3))])
def test_fixed_controller_forces_the_configured_chunk_and_delta(mode, plan):
    cfg = OmegaConf.structured(OverlapConfig(mode=mode, controller="fixed", chunk_size=12, delta_init=3))
    planner = make_planner(cfg, prompts_per_step=8)
    assert [(p.chunk, p.delta) for p in map(planner.plan, range(4))] == [plan] * 4


def test_carried_groups_rebuild_their_prompts_every_step_they_wait():
    # Long-form audio: the long group's prompt is long too. Carried, it is re-prefilled
    # (prompt and partial responses) every step it waits: with its prompt counted,
    # overcommit no longer pays on costs where it did with responses alone.
    costs = CostProfile(round_fixed_s=0.004, round_per_row_s=0.0002, prefill_per_token_s=0.0001,
                        score_per_token_s=0.0004, train_per_sample_s=0.02, step_fixed_s=0.1)
    prompts = [50] * 5 + [900]
    bare = simulate_buffer(TAILED, B=8, delta=2)
    with_prompts = simulate_buffer(TAILED, B=8, delta=2, prompts=prompts)
    assert with_prompts.rounds == bare.rounds and with_prompts.row_rounds == bare.row_rounds
    assert with_prompts.carried_tokens > bare.carried_tokens + 900   # at least one long prompt per step
    assert best_plan(costs, TAILED, B=8, chunks=[None], deltas=range(5))[0].delta > 0
    assert best_plan(costs, TAILED, B=8, chunks=[None], deltas=range(5), prompts=prompts)[0].delta == 0
    serial = simulate_buffer(TAILED, B=8, delta=0, wait_all=True, prompts=prompts)
    assert serial.carried_tokens == 0   # nothing waits between serial steps


# ---- a reward served by another machine ------------------------------------------------

def test_service_drain_by_hand():
    # Two slots, 1 s a sequence, 0.2 s round trip: four at once finish in two waves.
    assert service_drain([0, 0, 0, 0], 1.0, slots=2, latency_s=0.2) == pytest.approx(2.2)
    # A sequence that arrives after the slots are free starts at once.
    assert service_drain([0, 5], 1.0) == pytest.approx(6.0)
    assert service_drain([], 1.0) == 0.0


def test_remote_wait_serial_is_every_sequence_after_the_decode():
    costs = CostProfile(round_fixed_s=0.01, remote_per_seq_s=0.05)
    shape = simulate_buffer([(3, 5)], B=2, delta=0, wait_all=True)
    assert remote_wait(costs, shape, None) == pytest.approx(4 * 0.05)
    # Chunk 3: the two 3-token samples go after round 3, while rounds 4-5 decode.
    assert remote_wait(costs, shape, 3) == pytest.approx(max(0.0, 0.03 + 4 * 0.05 - 0.05))
    assert remote_wait(CostProfile(round_fixed_s=0.01), shape, 3) == 0.0   # no service: nothing


def test_planner_streams_to_hide_a_slow_service_and_stays_serial_without_one():
    costs = cpu_like()
    costs.round_fixed_s, costs.round_per_row_s = 0.015, 0.0015   # a decode ~ half the step, as in the recipe
    plain, _ = best_plan(costs, TAILED, B=8, chunks=[8, 16, 32], deltas=[0])
    assert plain.chunk is None
    costs.remote_per_seq_s = 0.03    # ~1 s of service for 32 sequences: as long as the decode
    slow, table = best_plan(costs, TAILED, B=8, chunks=[8, 16, 32], deltas=[0])
    assert slow.chunk is not None
    assert table[f"{slow.chunk}/0"] < 0.9 * table["0/0"]
    # Where the decode is a sliver of the step there is little to hide it under: serial.
    short = cpu_like()
    short.remote_per_seq_s = 0.01
    assert best_plan(short, TAILED, B=8, chunks=[8, 16, 32], deltas=[0])[0].chunk is None


def test_fitter_learns_the_service_apart_from_local_scoring():
    fitter = CostFitter(decay=0.0)
    fitter.observe_step(streamed=False, decode_s=1.0, scoring_s=1.5, training_s=1.0, fixed_s=0.2, samples=100,
                        trained_tokens=1000, remote_wait_s=1.2, remote_sequences=100)
    profile = fitter.profile()
    assert profile.remote_per_seq_s == pytest.approx(0.012)
    assert profile.score_per_token_s == pytest.approx(0.3 / 1000)



def test_a_fed_service_wait_is_measured_and_the_same_for_every_plan():
    """Fed (each sequence sent as it finishes, whatever the chunk), the wait left after
    the decode is what the steps measured; it fits no per-sequence rate (those steps
    did not send everything after the decode) and decides no plan."""
    fitter = CostFitter(decay=0.0)
    fitter.observe_step(streamed=False, decode_s=1.0, scoring_s=1.5, training_s=1.0, fixed_s=0.2, samples=100,
                        trained_tokens=1000, remote_wait_s=0.4, remote_sequences=100, fed=True)
    profile = fitter.profile()
    assert profile.remote_fed_wait_s == pytest.approx(0.4)
    assert profile.remote_per_seq_s == 0.0
    assert profile.score_per_token_s == pytest.approx(1.1 / 1000)   # the wait kept apart
    shape = simulate_buffer(TAILED, B=8, delta=0)
    for chunk in (None, 8, 32):
        fed = predict(profile, shape, 32, chunk, 10.0, fed=True)
        assert fed.scoring_s == pytest.approx(predict(profile, shape, 32, chunk, 10.0).scoring_s + 0.4)
