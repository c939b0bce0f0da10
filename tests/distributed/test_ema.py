"""WeightEma on a plain module: the average it keeps, the swap in and back, its state.
(On DeepSpeed engines of every ZeRO stage: test_deepspeed_strategy.py.)"""
from __future__ import annotations

import pytest
import torch

from asr_grpo.distributed.ema import WeightEma, warmed_decay


def frozen_head_model() -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    model[0].requires_grad_(False)   # like the frozen audio encoder
    return model


def nudge(model: torch.nn.Module, amount: float) -> None:
    with torch.no_grad():
        for p in model.parameters():
            p.add_(amount)


def test_the_average_follows_the_warmed_up_decay_over_trained_weights_only():
    model = frozen_head_model()
    ema = WeightEma(model, decay=0.6)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    decays = []
    for t in range(12):
        nudge(model, 0.1 * (t + 1))
        decays.append(ema.update())
    # min(0.6, (1 + t) / (10 + t)): 0.1, 2/11, ... until it reaches 0.6 at t = 12.5
    assert decays == pytest.approx([min(0.6, (1 + t) / (10 + t)) for t in range(12)])
    assert decays[0] == warmed_decay(0.6, 0) == pytest.approx(0.1)
    assert sorted(ema.shadow) == ["1.bias", "1.weight"]
    # The same weights, averaged by hand: every parameter moved by the same cumulative nudges.
    expected, total = torch.zeros(()), 0.0
    for t, d in enumerate(decays):
        total += 0.1 * (t + 1)
        expected = d * expected + (1 - d) * total
    for name in ema.shadow:
        torch.testing.assert_close(ema.shadow[name], start[name] + expected)


def test_without_warm_up_every_update_uses_the_decay_from_the_first():
    model = frozen_head_model()
    start = {k: v.clone() for k, v in model.state_dict().items()}
    ema = WeightEma(model, decay=0.6, warmup=False)
    decays = []
    for _ in range(3):
        nudge(model, 1.0)
        decays.append(ema.update())
    assert decays == [0.6, 0.6, 0.6]
    # The starting weights keep 0.6 ** 3 of the average; the nudged weights (+1, +2, +3) the rest.
    expected = 0.4 * (0.6 ** 2 * 1 + 0.6 * 2 + 3)
    for name in ema.shadow:
        torch.testing.assert_close(ema.shadow[name], start[name] + expected)


def test_applied_swaps_the_average_in_and_puts_the_weights_back_even_on_error():
    model = frozen_head_model()
    ema = WeightEma(model, decay=0.9)
    nudge(model, 1.0)
    ema.update()
    trained = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(RuntimeError, match="inside"):
        with ema.applied():
            torch.testing.assert_close(model[1].weight, ema.shadow["1.weight"])
            assert torch.equal(model[0].weight, trained["0.weight"])   # frozen: its own weights
            raise RuntimeError("inside")
    for name, value in model.state_dict().items():
        assert torch.equal(value, trained[name]), name


def test_state_round_trip_continues_the_same_average():
    a, b = frozen_head_model(), frozen_head_model()
    ema_a = WeightEma(a, decay=0.8)
    for _t in range(3):
        nudge(a, 0.5)
        ema_a.update()
    ema_b = WeightEma(b, decay=0.8)
    ema_b.load_state_dict(ema_a.state_dict())
    b.load_state_dict(a.state_dict())
    nudge(a, 0.5)
    nudge(b, 0.5)
    assert ema_a.update() == ema_b.update()   # the warm-up count came along
    for name in ema_a.shadow:
        assert torch.equal(ema_a.shadow[name], ema_b.shadow[name])


def test_bad_decay_and_mismatched_state_are_refused():
    with pytest.raises(ValueError, match="decay must be in"):
        WeightEma(frozen_head_model(), decay=1.0)
    other = torch.nn.Linear(3, 2)
    with pytest.raises(ValueError, match="does not match the model"):
        WeightEma(frozen_head_model(), 0.5).load_state_dict(WeightEma(other, 0.5).state_dict())
