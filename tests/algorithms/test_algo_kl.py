import math

import pytest
import torch

from asr_grpo.algorithms import kl_penalty, token_level_rewards

L2 = math.log(2.0)


@pytest.mark.parametrize("estimator,forward,backward", [
    ("k1", L2, -L2),
    ("k2", 0.5 * L2 ** 2, 0.5 * L2 ** 2),
    ("k3", 0.5 + L2 - 1.0, 2.0 - L2 - 1.0),  # exp(-x) + x - 1 with x = +-log 2
])
def test_kl_estimators_by_hand(estimator, forward, backward):
    p = torch.log(torch.tensor([0.5, 0.25, 0.3]))
    q = torch.log(torch.tensor([0.25, 0.5, 0.3]))
    torch.testing.assert_close(kl_penalty(p, q, estimator),
                               torch.tensor([forward, backward, 0.0]))


def test_k3_nonnegative_and_finite_for_extreme_ratios():
    g = torch.Generator().manual_seed(0)
    logp, ref = torch.randn(64, generator=g) * 3, torch.randn(64, generator=g) * 3
    assert (kl_penalty(logp, ref, "k3") >= 0).all()
    assert torch.isfinite(kl_penalty(torch.tensor([0.0]), torch.tensor([200.0]), "k3")).all()
    with pytest.raises(ValueError, match="k3"):
        kl_penalty(logp, ref, "k4")


def test_token_level_rewards_score_on_last_real_token():
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])
    kl = torch.ones(3, 4, requires_grad=True)
    rewards = token_level_rewards(torch.tensor([2.0, 3.0, 5.0]), kl, mask, kl_coef=0.1)
    torch.testing.assert_close(rewards, torch.tensor([[-0.1, -0.1, 1.9, 0.0],
                                                      [2.9, 0.0, 0.0, 0.0],
                                                      [0.0, 0.0, 0.0, 0.0]]))
    assert not rewards.requires_grad
