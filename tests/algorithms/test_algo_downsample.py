"""Max-variance down-sampling: the subset it keeps is the variance maximiser a brute
force finds, group by group, and groups a caller keeps whole stay whole."""
from __future__ import annotations

import itertools

import pytest
import torch

from asr_grpo.algorithms import downsample_groups, max_variance_subset


def brute_force_max_variance(rewards: torch.Tensor, m: int) -> float:
    return max(float(rewards.double()[list(c)].var(unbiased=False))
               for c in itertools.combinations(range(len(rewards)), m))


@pytest.mark.parametrize("n,m", [(4, 2), (6, 3), (8, 4), (8, 5), (7, 1), (5, 5)])
def test_kept_subset_has_the_largest_variance_of_all_subsets(n, m):
    gen = torch.Generator().manual_seed(n * 10 + m)
    for _ in range(20):
        rewards = torch.rand(n, generator=gen).round(decimals=1)   # ties are common
        picked = max_variance_subset(rewards, m)
        assert picked == sorted(set(picked)) and len(picked) == m
        var = float(rewards.double()[picked].var(unbiased=False))
        assert var == pytest.approx(brute_force_max_variance(rewards, m), abs=1e-12)


def test_keeps_the_extremes_and_splits_ties_evenly():
    assert max_variance_subset(torch.tensor([0.5, 0.9, 0.1, 0.6, 0.2, 1.0]), 2) == [2, 5]
    # All equal: no subset is better; two from each end of the (stable) ranking.
    assert max_variance_subset(torch.full((6,), 0.7), 4) == [0, 1, 4, 5]
    with pytest.raises(ValueError, match="cannot keep 5 of 4"):
        max_variance_subset(torch.zeros(4), 5)


def test_groups_are_down_sampled_one_by_one_and_whole_groups_stay():
    rewards = torch.tensor([0.1, 0.5, 0.9, 0.4,    0.3, 0.3, 0.8, 0.0,    0.2, 0.6])
    groups = ["a"] * 4 + ["b"] * 4 + ["c"] * 2
    assert downsample_groups(rewards, groups, 2) == [0, 2, 6, 7, 8, 9]   # c has only 2
    assert downsample_groups(rewards, groups, 2, whole={"b"}) == [0, 2, 4, 5, 6, 7, 8, 9]


@pytest.mark.parametrize(("n", "m", "trained"), [(32, 8, 8), (4, 8, 4), (8, None, 8), (2, 2, 2)])
def test_at_most_train_samples_per_prompt_of_a_group_train(n, m, trained):
    """The recipe's 8 of 32 leaves a quick run that samples fewer (debug=fast: 2) training all of them."""
    from asr_grpo.config.schema import AlgorithmConfig
    from asr_grpo.experience.maker import samples_trained_per_prompt

    algo = AlgorithmConfig(n_samples_per_prompt=n, train_samples_per_prompt=m)
    assert samples_trained_per_prompt(algo) == trained
