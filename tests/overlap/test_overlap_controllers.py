"""OPPO's chunk-size and Δ controllers: scripted timings/rewards against hand-worked decisions."""
from __future__ import annotations

import itertools
import json
import math

import pytest
from omegaconf import OmegaConf

from asr_grpo.config.schema import OverlapConfig
from asr_grpo.overlap.controllers import ChunkSizeController, DeltaController


def drive(ctrl: ChunkSizeController, steps, timing):
    """Run `steps`, timing each with `timing(step, chunk)`; returns the sizes used."""
    used = []
    for step in steps:
        chunk = ctrl.chunk_for_step(step)
        used.append(chunk)
        ctrl.observe(step, chunk, timing(step, chunk))
    return used


def table(seconds: dict[int, float]):
    return lambda step, chunk: seconds[chunk]


# ---------------------------------------------------------------- chunk size

def test_fastest_candidate_is_chosen_and_held_until_next_round():
    ctrl = ChunkSizeController(chunk_size=16, candidates=[8, 16, 32], trial_period=10)
    used = drive(ctrl, range(20), table({8: 3.0, 16: 2.0, 32: 1.5}))
    assert used == [8, 16, 32] + [32] * 7 + [8, 16, 32] + [32] * 7
    assert ctrl.chosen == 32
    assert ctrl.last_trial == {8: 3.0, 16: 2.0, 32: 1.5}
    assert [ctrl.in_trial(s) for s in range(12)] == [True] * 3 + [False] * 7 + [True] * 2


def test_retrial_picks_new_winner_when_timings_change():
    ctrl = ChunkSizeController(chunk_size=16, candidates=[8, 16, 32], trial_period=5)

    def timing(step, chunk):   # 16 is fastest first, then 8 from step 5 on
        return {8: 4.0, 16: 1.0, 32: 2.0}[chunk] if step < 5 else {8: 0.5, 16: 1.0, 32: 2.0}[chunk]

    used = drive(ctrl, range(10), timing)
    assert used == [8, 16, 32, 16, 16, 8, 16, 32, 8, 8]
    assert ctrl.chosen == 8


def test_before_first_round_completes_chunk_size_is_used():
    ctrl = ChunkSizeController(chunk_size=12, candidates=[8, 16, 32], trial_period=10)
    assert ctrl.chosen == 12
    assert [ctrl.chunk_for_step(s) for s in range(5)] == [8, 16, 32, 12, 12]
    ctrl.observe(0, 8, 1.0)
    ctrl.observe(1, 16, 0.5)
    assert ctrl.chunk_for_step(3) == 12   # round still open: 32 not timed yet
    ctrl.observe(2, 32, 2.0)
    assert ctrl.chunk_for_step(3) == 16


def test_chunk_for_step_is_pure():
    ctrl = ChunkSizeController(chunk_size=16, candidates=[8, 16], trial_period=4)
    first = [ctrl.chunk_for_step(s) for s in range(12)]
    assert first == [ctrl.chunk_for_step(s) for s in range(12)]
    assert ctrl.chosen == 16


def test_period_zero_never_trials():
    ctrl = ChunkSizeController(chunk_size=24, candidates=[8, 16, 32], trial_period=0)
    used = drive(ctrl, range(30), table({8: 0.1, 16: 0.2, 32: 0.3, 24: 9.0}))
    assert used == [24] * 30
    assert not any(ctrl.in_trial(s) for s in range(30))
    assert ctrl.period == 0


def test_single_candidate_is_used_without_trials():
    ctrl = ChunkSizeController(chunk_size=16, candidates=[32], trial_period=5)
    assert drive(ctrl, range(12), table({32: 1.0})) == [32] * 12
    assert not any(ctrl.in_trial(s) for s in range(12))


def test_period_shorter_than_round_lets_rounds_finish():
    # 4 candidates, P=3: rounds start at multiples of 6 (= 3 * ceil(4/3)) and run whole.
    ctrl = ChunkSizeController(chunk_size=16, candidates=[8, 16, 32, 64], trial_period=3)
    assert ctrl.period == 6
    used = drive(ctrl, range(12), table({8: 4.0, 16: 3.0, 32: 1.0, 64: 2.0}))
    assert used == [8, 16, 32, 64, 32, 32] * 2
    assert [ctrl.in_trial(s) for s in range(7)] == [True] * 4 + [False] * 2 + [True]


def test_period_equal_to_round_is_all_trials():
    ctrl = ChunkSizeController(chunk_size=16, candidates=[8, 16], trial_period=2)
    assert drive(ctrl, range(6), table({8: 1.0, 16: 2.0})) == [8, 16] * 3
    assert ctrl.chosen == 8


def test_non_trial_observations_are_ignored():
    ctrl = ChunkSizeController(chunk_size=16, candidates=[8, 16, 32], trial_period=10)
    drive(ctrl, range(3), table({8: 3.0, 16: 1.0, 32: 2.0}))
    ctrl.observe(5, 8, 0.001)          # a blazing non-trial step must not sway the choice
    ctrl.observe(6, 32, 0.001)
    assert ctrl.chosen == 16
    assert ctrl.last_trial == {8: 3.0, 16: 1.0, 32: 2.0}


def test_lost_trial_measurement_closes_round_with_what_it_has():
    ctrl = ChunkSizeController(chunk_size=16, candidates=[8, 16, 32], trial_period=10)
    ctrl.observe(0, 8, 2.0)
    ctrl.observe(1, 16, 3.0)           # step 2's timing never arrives
    assert ctrl.chosen == 16
    ctrl.observe(3, 16, 1.0)           # a later step closes the round
    assert ctrl.chosen == 8
    assert ctrl.last_trial == {8: 2.0, 16: 3.0}
    ctrl.observe(2, 32, 0.1)           # ... and its late report is dropped
    assert ctrl.chosen == 8


def test_late_report_after_resume_is_still_dropped():
    ctrl = ChunkSizeController(chunk_size=16, candidates=[8, 16, 32], trial_period=10)
    ctrl.observe(0, 8, 2.0)
    ctrl.observe(1, 16, 3.0)
    ctrl.observe(3, 16, 1.0)           # closes round 0 without step 2
    resumed = ChunkSizeController(chunk_size=16, candidates=[8, 16, 32], trial_period=10)
    resumed.load_state_dict(json.loads(json.dumps(ctrl.state_dict())))
    resumed.observe(2, 32, 0.1)
    resumed.observe(4, 16, 1.0)
    assert resumed.chosen == 8
    assert resumed.last_trial == {8: 2.0, 16: 3.0}


def test_non_finite_timing_is_skipped():
    ctrl = ChunkSizeController(chunk_size=16, candidates=[8, 16], trial_period=10)
    ctrl.observe(0, 8, math.nan)
    ctrl.observe(1, 16, 5.0)
    ctrl.observe(2, 16, 5.0)
    assert ctrl.chosen == 16
    assert ctrl.last_trial == {16: 5.0}


def test_ties_go_to_the_earlier_candidate():
    ctrl = ChunkSizeController(chunk_size=16, candidates=[32, 8, 16], trial_period=10)
    drive(ctrl, range(3), table({8: 1.0, 16: 1.0, 32: 1.0}))
    assert ctrl.chosen == 32


def test_wrong_chunk_on_trial_step_raises():
    ctrl = ChunkSizeController(chunk_size=16, candidates=[8, 16, 32], trial_period=10)
    with pytest.raises(ValueError, match="trial step for chunk size 16"):
        ctrl.observe(1, 8, 1.0)


@pytest.mark.parametrize("cut", [1, 2, 3, 7, 11, 15])
def test_chunk_state_round_trip_continues_exactly(cut):
    def timing(step, chunk):   # winner changes from round to round
        return {8: 1.0 + (step >= 6) * 3, 16: 2.0, 32: 3.0 - (step >= 12) * 2.5}[chunk]

    whole = ChunkSizeController(chunk_size=16, candidates=[8, 16, 32], trial_period=6)
    expected = drive(whole, range(24), timing)

    first = ChunkSizeController(chunk_size=16, candidates=[8, 16, 32], trial_period=6)
    head = drive(first, range(cut), timing)
    resumed = ChunkSizeController(chunk_size=16, candidates=[8, 16, 32], trial_period=6)
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
    assert head + drive(resumed, range(cut, 24), timing) == expected
    assert expected == [8, 16, 32, 8, 8, 8] + [8, 16, 32, 16, 16, 16] + [8, 16, 32, 32, 32, 32] * 2
    assert resumed.state_dict() == whole.state_dict()


def test_chunk_state_with_changed_schedule_keeps_choice_drops_open_round():
    old = ChunkSizeController(chunk_size=16, candidates=[8, 16, 32], trial_period=10)
    drive(old, range(3), table({8: 3.0, 16: 1.0, 32: 2.0}))
    old.observe(10, 8, 0.5)            # round 1 half done
    new = ChunkSizeController(chunk_size=16, candidates=[8, 16], trial_period=10)
    new.load_state_dict(old.state_dict())
    assert new.chosen == 16
    new.observe(11, 16, 0.7)           # would close with 8 had the half round survived
    assert new.chosen == 16
    # Step 11 is the new round's last trial step: the round closed on 16's timing alone.
    assert new.state_dict()["timings"] == [] and new.last_trial == {16: 0.7}


def test_chunk_from_config_and_dictconfig():
    cfg = OverlapConfig(chunk_size=4, chunk_candidates=[2, 4], chunk_trial_period=7)
    for c in (cfg, OmegaConf.structured(cfg)):
        ctrl = ChunkSizeController.from_config(c)
        assert (ctrl.chunk_size, ctrl.candidates, ctrl.trial_period) == (4, [2, 4], 7)
        assert type(ctrl.candidates) is list


@pytest.mark.parametrize("kwargs,match", [
    ({"chunk_size": 16, "candidates": [], "trial_period": 5}, "empty"),
    ({"chunk_size": 16, "candidates": [8, -1], "trial_period": 5}, ">= 0"),
    ({"chunk_size": 16, "candidates": [8], "trial_period": 5, "steps_per_candidate": 0}, "chunk_trial_steps"),
    ({"chunk_size": 16, "candidates": [8, 8], "trial_period": 5}, "duplicates"),
    ({"chunk_size": 0, "candidates": [8], "trial_period": 5}, "chunk_size=0"),
    ({"chunk_size": 16, "candidates": [8], "trial_period": -1}, "trial_period=-1"),
    ({"chunk_size": 16, "candidates": [8.5], "trial_period": 5}, "integer"),
])
def test_chunk_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ChunkSizeController(**kwargs)


def test_warmup_steps_are_never_trials_and_the_median_decides():
    ctrl = ChunkSizeController(chunk_size=16, candidates=[0, 8], trial_period=10, warmup_steps=2,
                               steps_per_candidate=3)
    # step 2..4 try "no streaming" (0), 5..7 try 8; one outlier step must not decide.
    seconds = {2: 2.0, 3: 2.1, 4: 9.0, 5: 1.0, 6: 5.0, 7: 5.5}
    used = drive(ctrl, range(12), lambda step, chunk: seconds.get(step, 3.0))
    assert used == [16, 16, 0, 0, 0, 8, 8, 8, 0, 0, 0, 0]
    assert ctrl.last_trial == {0: 2.1, 8: 5.0} and ctrl.chosen == 0
    assert not ctrl.in_trial(0) and not ctrl.in_trial(1) and ctrl.in_trial(12)


# ---------------------------------------------------------------- Δ

def feed(ctrl: DeltaController, rewards):
    return [ctrl.observe(r) for r in rewards]


def test_rising_rewards_grow_delta_by_inc_to_max():
    ctrl = DeltaController(delta_init=0, delta_min=0, delta_max=4, delta_inc=1, delta_dec=1, window=3)
    # The window needs w+1 = 4 rewards before Δ moves.
    assert feed(ctrl, [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7]) == [0, 0, 0, 1, 2, 3, 4, 4]
    big = DeltaController(delta_init=1, delta_max=6, delta_inc=2, window=3)
    assert feed(big, [0, 1, 2, 3, 4, 5, 6]) == [1, 1, 1, 3, 5, 6, 6]


def test_flat_rewards_decay_delta_to_min():
    ctrl = DeltaController(delta_init=4, delta_min=0, delta_max=4, delta_dec=1, window=2)
    assert feed(ctrl, [0.5] * 8) == [4, 4, 3, 2, 1, 0, 0, 0]
    floor = DeltaController(delta_init=5, delta_min=2, delta_max=6, delta_dec=2, window=1)
    assert feed(floor, [1.0, 1.0, 1.0, 1.0]) == [5, 3, 2, 2]


def test_window_compares_against_reward_w_steps_back():
    # The slope only sees R_t - R_{t-w}: an early rise has left the window.
    up = DeltaController(delta_init=2, delta_max=4, window=2)
    assert feed(up, [0, 1, 2, 3, 2.5]) == [2, 2, 3, 4, 4]
    assert up.slope == pytest.approx(0.25)
    down = DeltaController(delta_init=2, delta_max=4, window=2)
    assert feed(down, [0, 1, 2, 3, 1.5]) == [2, 2, 3, 4, 3]
    assert down.slope == pytest.approx(-0.25)


def test_slope_is_mean_of_differences():
    ctrl = DeltaController(window=4)
    rewards = [1.0, 3.0, 2.0, 5.0]
    feed(ctrl, rewards)
    assert ctrl.slope is None
    ctrl.observe(9.0)
    assert ctrl.slope == pytest.approx(2.0)
    ctrl.observe(4.0)
    window = [3.0, 2.0, 5.0, 9.0, 4.0]
    assert ctrl.slope == pytest.approx(sum(b - a for a, b in itertools.pairwise(window)) / 4)
    assert ctrl.slope == pytest.approx(0.25)


def test_proportional_rule_steps_by_quarter_of_delta():
    ctrl = DeltaController(delta_init=8, delta_min=0, delta_max=20, delta_inc=100, delta_dec=100,
                           window=1, rule="proportional")
    # Up: +max(1, Δ//4): 8 -> 10 -> 12 -> 15 -> 18 -> 20 (capped).
    assert feed(ctrl, [0, 1, 2, 3, 4, 5]) == [8, 10, 12, 15, 18, 20]
    # Down: 20 -> 15 -> 12 -> 9 -> 7 -> 6 -> 5 -> 4.
    assert feed(ctrl, [4, 3, 2, 1, 0, -1, -2]) == [15, 12, 9, 7, 6, 5, 4]
    low = DeltaController(delta_init=0, delta_max=3, window=1, rule="proportional")
    assert feed(low, [0, 1, 2, 3, 4]) == [0, 1, 2, 3, 3]   # floor(0/4) = 0 still moves by 1


def test_non_finite_rewards_are_ignored():
    ctrl = DeltaController(delta_init=0, delta_max=4, window=2)
    assert feed(ctrl, [0.0, math.nan, 1.0, math.inf, -math.inf, 2.0]) == [0, 0, 0, 0, 0, 1]
    assert ctrl.slope == pytest.approx(1.0)
    assert ctrl.state_dict()["rewards"] == [0.0, 1.0, 2.0]


@pytest.mark.parametrize("cut", [0, 2, 4, 7, 11])
@pytest.mark.parametrize("rule", ["additive", "proportional"])
def test_delta_state_round_trip_continues_exactly(cut, rule):
    rewards = [0.1, 0.3, 0.2, 0.5, 0.6, 0.6, 0.55, 0.4, 0.7, 0.9, 1.0, 0.95, 0.8, 0.8, 0.85]
    kw = {"delta_init": 3, "delta_min": 1, "delta_max": 12, "delta_inc": 2, "delta_dec": 1,
          "window": 3, "rule": rule}
    whole = DeltaController(**kw)
    expected = feed(whole, rewards)
    assert len(set(expected)) > 2       # the script must actually move Δ both ways

    first = DeltaController(**kw)
    head = feed(first, rewards[:cut])
    resumed = DeltaController(**kw)
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
    assert resumed.slope == first.slope
    assert head + feed(resumed, rewards[cut:]) == expected
    assert resumed.state_dict() == whole.state_dict()


def test_delta_expected_additive_trajectory():
    rewards = [0.1, 0.3, 0.2, 0.5, 0.6, 0.6, 0.55, 0.4, 0.7, 0.9, 1.0, 0.95, 0.8, 0.8, 0.85]
    ctrl = DeltaController(delta_init=3, delta_min=1, delta_max=12, delta_inc=2, delta_dec=1, window=3)
    # R_t - R_{t-3} from step 3 on: + + + + - + + + + - - -
    assert feed(ctrl, rewards) == [3, 3, 3, 5, 7, 9, 11, 10, 12, 12, 12, 12, 11, 10, 9]


def test_delta_load_clamps_to_new_bounds():
    old = DeltaController(delta_init=6, delta_max=8, window=4)
    feed(old, [1, 2, 3, 4, 5, 6])
    new = DeltaController(delta_init=0, delta_max=3, window=2)
    new.load_state_dict(old.state_dict())
    assert new.delta == 3
    assert new.state_dict()["rewards"] == [4.0, 5.0, 6.0]


def test_delta_from_config_and_dictconfig():
    cfg = OverlapConfig(delta_init=2, delta_min=1, delta_max=5, delta_inc=2, delta_dec=3,
                        delta_window=4, delta_rule="proportional")
    for c in (cfg, OmegaConf.structured(cfg)):
        ctrl = DeltaController.from_config(c)
        assert (ctrl.delta, ctrl.delta_min, ctrl.delta_max, ctrl.delta_inc, ctrl.delta_dec,
                ctrl.window, ctrl.rule) == (2, 1, 5, 2, 3, 4, "proportional")
    assert DeltaController.from_config(OverlapConfig()).delta == 0


@pytest.mark.parametrize("kwargs,match", [
    ({"delta_min": 3, "delta_max": 2, "delta_init": 2}, "delta_min=3 > delta_max=2"),
    ({"delta_init": 5, "delta_max": 4}, "delta_init=5"),
    ({"delta_init": 0, "delta_min": 1}, "delta_init=0"),
    ({"delta_min": -1}, "delta_min=-1"),
    ({"window": 0}, "delta_window=0"),
    ({"rule": "exponential"}, "delta_rule='exponential'"),
    ({"delta_inc": -1}, "delta_inc=-1"),
])
def test_delta_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DeltaController(**kwargs)
