import math

import pytest
import torch

from asr_grpo.algorithms import (
    ADVANTAGE_ESTIMATORS,
    AdvantageInput,
    broadcast_to_tokens,
    gae_advantages,
    group_norm_advantages,
    reinforce_baseline_advantages,
    rloo_advantages,
)


def close(actual, expected, atol=1e-6):
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype),
                               atol=atol, rtol=0)


def test_group_norm_unbiased_std_and_zero_variance_group():
    # group 1: mean 2, unbiased std 1; group 2: constant -> exactly 0 (no NaN).
    adv = group_norm_advantages(torch.tensor([1.0, 2.0, 3.0, 5.0, 5.0, 5.0]), n=3, eps=1e-6)
    close(adv, [-1 / (1 + 1e-6), 0.0, 1 / (1 + 1e-6), 0.0, 0.0, 0.0])
    assert torch.equal(adv[3:], torch.zeros(3))
    # mean 0.5, unbiased std sqrt(1/3) -> +-0.5*sqrt(3).
    close(group_norm_advantages(torch.tensor([0.0, 1.0, 0.0, 1.0]), n=4, eps=0.0),
          [-0.5 * math.sqrt(3), 0.5 * math.sqrt(3)] * 2)


def test_group_norm_constant_group_with_inexact_mean_is_exact_zero():
    # 0.1 * 3 / 3 != 0.1 in floats: the mean must not leak a tiny residual / eps.
    adv = group_norm_advantages(torch.full((3,), 0.1, dtype=torch.float64), n=3)
    assert torch.equal(adv, torch.zeros(3, dtype=torch.float64))


def test_group_norm_without_std_and_single_sample_groups():
    close(group_norm_advantages(torch.tensor([1.0, 2.0, 3.0, 5.0, 5.0, 5.0]), 3,
                                std_normalize=False), [-1, 0, 1, 0, 0, 0])
    assert torch.equal(group_norm_advantages(torch.tensor([1.0, 4.0]), 1), torch.zeros(2))


def test_rloo_and_reinforce_baseline():
    scores = torch.tensor([1.0, 2.0, 3.0, 6.0, 0.0, 0.0])
    # r_i - mean of the other two: 1-2.5, 2-2, 3-1.5 | 6-0, 0-3, 0-3
    close(rloo_advantages(scores, 3), [-1.5, 0.0, 1.5, 6.0, -3.0, -3.0])
    # r_i - group mean (2 and 2)
    close(reinforce_baseline_advantages(scores, 3), [-1.0, 0.0, 1.0, 4.0, -2.0, -2.0])


def test_bad_group_sizes():
    with pytest.raises(ValueError):
        group_norm_advantages(torch.zeros(5), 2)
    with pytest.raises(ValueError):
        rloo_advantages(torch.zeros(4), 1)


def test_broadcast_and_dispatch():
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0]])
    close(broadcast_to_tokens(torch.tensor([2.0, -1.0, 0.5, 3.0]), mask),
          [[2, 2, 0], [-1, 0, 0], [0.5, 0.5, 0.5], [3, 3, 0]])
    scores = torch.tensor([1.0, 3.0, 2.0, 2.0])

    def estimate(name):
        adv, returns = ADVANTAGE_ESTIMATORS.get(name).fn(AdvantageInput(scores, mask, group_size=2))
        assert returns is None   # outcome estimators fit no critic
        return adv

    close(estimate("rloo"), [[-2, -2, 0], [2, 0, 0], [0, 0, 0], [0, 0, 0]])
    close(estimate("reinforce_baseline"), [[-1, -1, 0], [1, 0, 0], [0, 0, 0], [0, 0, 0]])
    assert estimate("group_norm").shape == (4, 3)
    with pytest.raises(ValueError, match="algorithm.advantage_estimator=ppo: "
                                         "expected one of group_norm, rloo, reinforce_baseline, dr_grpo, gae"):
        ADVANTAGE_ESTIMATORS.get("ppo")


def test_what_each_estimator_needs_is_registered_with_it():
    needs = {name: (e.min_group_size, e.needs_critic, e.kl_in_reward)
             for name, e in ADVANTAGE_ESTIMATORS.items()}
    assert needs == {"group_norm": (2, False, False), "rloo": (2, False, False),
                     "reinforce_baseline": (1, False, False), "dr_grpo": (2, False, False),
                     "gae": (1, True, True)}


def test_dr_grpo_is_the_group_mean_baseline_without_std_scaling():
    """Against a plain loop over random groups of ragged sequences, one group all equal."""
    g = torch.Generator().manual_seed(0)
    n, n_groups, width = 4, 3, 5
    scores = torch.rand(n * n_groups, generator=g, dtype=torch.float64)
    scores[n:2 * n] = 0.7
    lengths = torch.randint(1, width + 1, (n * n_groups,), generator=g)
    mask = (torch.arange(width)[None, :] < lengths[:, None]).long()
    adv, returns = ADVANTAGE_ESTIMATORS.get("dr_grpo").fn(AdvantageInput(scores, mask, group_size=n))
    assert returns is None
    expected = torch.zeros(n * n_groups, width, dtype=torch.float64)
    for start in range(0, n * n_groups, n):
        members = scores[start:start + n].tolist()
        for i, r in enumerate(members):
            expected[start + i, :int(lengths[start + i])] = r - sum(members) / n
    close(adv, expected, atol=1e-12)
    assert not adv[n:2 * n].any()   # the all-equal group teaches nothing


def test_gae_estimator_puts_the_kl_in_the_reward_and_whitens():
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    values = torch.tensor([[0.2, 0.1, 0.0], [0.3, 0.4, 7.0]])
    kl = torch.tensor([[0.5, 0.0, 1.0], [0.0, 2.0, 9.0]])
    x = AdvantageInput(torch.tensor([1.0, 0.0]), mask, 1, values=values, kl=kl, kl_coef=0.1,
                       gamma=1.0, lam=1.0)
    adv, ret = ADVANTAGE_ESTIMATORS.get("gae").fn(x)
    # gamma = lam = 1: the return is the reward to go, r_t = -0.1 kl_t plus the score at the end.
    close(ret, [[1.0 - 0.15, 1.0 - 0.1, 1.0 - 0.1], [-0.2, -0.2, 0.0]])
    raw = (ret - values) * mask
    mean = raw.sum() / mask.sum()
    std = (((raw - mean) * mask).square().sum() / (mask.sum() - 1)).sqrt()
    close(adv, (raw - mean) / std * mask, atol=1e-5)


def _gae_reference(rewards, values, lengths, gamma, lam):
    B, T = len(rewards), len(rewards[0])
    adv = [[0.0] * T for _ in range(B)]
    for b in range(B):
        running = 0.0
        for t in reversed(range(lengths[b])):
            next_v = values[b][t + 1] if t + 1 < lengths[b] else 0.0
            delta = rewards[b][t] + gamma * next_v - values[b][t]
            running = delta + gamma * lam * running
            adv[b][t] = running
    ret = [[adv[b][t] + (values[b][t] if t < lengths[b] else 0.0) for t in range(T)]
           for b in range(B)]
    return adv, ret


def test_gae_matches_python_loop_on_ragged_mask():
    g = torch.Generator().manual_seed(0)
    lengths = [7, 3, 1, 5]
    rewards = torch.randn(4, 7, generator=g, dtype=torch.float64)
    values = torch.randn(4, 7, generator=g, dtype=torch.float64)  # padding holds garbage
    mask = (torch.arange(7) < torch.tensor(lengths)[:, None]).long()
    adv, ret = gae_advantages(rewards, values, mask, gamma=0.9, lam=0.8)
    exp_adv, exp_ret = _gae_reference(rewards.tolist(), values.tolist(), lengths, 0.9, 0.8)
    close(adv, exp_adv, atol=1e-12)
    close(ret, exp_ret, atol=1e-12)


def test_gae_gamma_lam_one_by_hand():
    # A_t = sum_{k>=t} r_k - V_t ; R_t = sum_{k>=t} r_k.
    rewards = torch.tensor([[0.0, 0.0, 1.0, 9.0]])
    values = torch.tensor([[0.5, 0.2, 0.1, 9.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 1, 0]])
    adv, ret = gae_advantages(rewards, values, mask, gamma=1.0, lam=1.0)
    close(adv, [[0.5, 0.8, 0.9, 0.0]])
    close(ret, [[1.0, 1.0, 1.0, 0.0]])
    assert not adv.requires_grad
