"""Whether a prompt group's rewards spread. A group whose samples all got the same reward
gives every sample a zero advantage under a group baseline: it teaches nothing. The
share of such groups is logged (`reward/flat_groups`), and DAPO's dynamic sampling
(`algorithm.dynamic_sampling`) drops them before training."""
from __future__ import annotations

import itertools
from typing import Sequence

import torch

# Rewards this close count as equal: float rounding in a weighted sum of components must
# not make a flat group look informative.
FLAT_TOL = 1e-6


def group_members(groups: Sequence[str]) -> list[tuple[str, list[int]]]:
    """(group, its sample indices) for samples listed group by group (each group's consecutive)."""
    return [(g, list(idx)) for g, idx in itertools.groupby(range(len(groups)), key=groups.__getitem__)]


def is_flat(rewards: torch.Tensor, tol: float = FLAT_TOL) -> bool:
    """No two rewards differ by more than `tol` (a group of one sample never spreads)."""
    return rewards.numel() < 2 or float(rewards.max() - rewards.min()) <= tol


def flat_groups(rewards: torch.Tensor, groups: Sequence[str], tol: float = FLAT_TOL) -> set[str]:
    """The groups among samples listed group by group whose rewards do not spread."""
    return {g for g, idx in group_members(groups) if is_flat(rewards[idx], tol)}
