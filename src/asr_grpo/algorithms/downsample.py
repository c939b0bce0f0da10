"""Which sampled rollouts of a prompt group train: max-variance down-sampling.

Decoding n samples of a prompt is cheap next to training on them (on the default CPU
run rollout takes ~0.7 s of a 3.5 s step); sampling many and training on the m whose
rewards spread most keeps the best and worst transcripts, where the advantage signal is
(Xu et al. 2025, "Not All Rollouts are Useful: Down-Sampling Rollouts in LLM RL").
"""
from __future__ import annotations

import itertools

import torch


@torch.no_grad()
def max_variance_subset(rewards: torch.Tensor, m: int) -> list[int]:
    """The m indices of `rewards` ([n]) whose values have the largest variance, in
    ascending index order. Some maximiser is always the i highest plus the m - i lowest
    rewards for one i, so only those m + 1 candidates are compared; ties go to the most
    balanced split (i nearest m / 2), equal rewards ranked by index (a stable sort)."""
    n = rewards.numel()
    if not 1 <= m <= n:
        raise ValueError(f"cannot keep {m} of {n} samples")
    values = rewards.double()
    order = torch.argsort(values, stable=True).tolist()
    best, best_key = None, None
    for top in range(m + 1):
        picked = order[:m - top] + order[n - top:]
        var = float(values[picked].var(unbiased=False))
        key = (var, -abs(2 * top - m))
        if best_key is None or key > best_key:
            best, best_key = picked, key
    return sorted(best)


def downsample_groups(rewards: torch.Tensor, groups: list[str], m: int,
                      whole: set[str] = frozenset()) -> list[int]:
    """Indices to keep from samples listed group by group (`groups[i]` is sample i's
    group, each group's samples consecutive): the max-variance m of each group, all
    samples of a group in `whole` (a group the caller drops whole later) and of a group
    with at most m samples."""
    keep: list[int] = []
    for group, members in itertools.groupby(range(len(groups)), key=groups.__getitem__):
        idx = list(members)
        if group in whole or len(idx) <= m:
            keep.extend(idx)
        else:
            keep.extend(idx[i] for i in max_variance_subset(rewards[idx], m))
    return keep
