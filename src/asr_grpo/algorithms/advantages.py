"""Advantage estimators.

Sequence-level scores are ``[B]``; GRPO groups are ``B // n`` consecutive blocks of
``n`` samples of the same prompt. Token tensors are ``[B, T]`` with a 0/1 ``mask``.
Advantages are constants for the policy loss, so every estimator here runs without
autograd.
"""
from __future__ import annotations

import torch


def _groups(scores: torch.Tensor, n: int, min_n: int = 1) -> torch.Tensor:
    """View ``[B]`` scores as ``[B // n, n]`` (one row per prompt group)."""
    if scores.dim() != 1:
        raise ValueError(f"scores must be 1-D [B], got shape {tuple(scores.shape)}")
    if n < min_n or scores.numel() % n:
        raise ValueError(f"need n >= {min_n} dividing B; got n={n}, B={scores.numel()}")
    return scores.view(-1, n)


@torch.no_grad()
def group_norm_advantages(scores: torch.Tensor, n: int, eps: float = 1e-6,
                          std_normalize: bool = True) -> torch.Tensor:
    """GRPO: ``A_i = (r_i - mean_g) / (std_g + eps)`` per group g (``[B]``).

    ``std_g`` is the *unbiased* (n-1) standard deviation, as ``torch.std`` in verl and
    OpenRLHF. A group whose scores are all equal carries no learning signal and gets
    exactly 0 (tested by max == min, so float rounding in the mean cannot leak
    ``~1e-17 / eps`` values); with ``n == 1`` every group is such a group.
    ``std_normalize=False`` gives Dr. GRPO's plain ``r_i - mean_g``.
    """
    g = _groups(scores, n)
    centered = g - g.mean(dim=1, keepdim=True)
    if std_normalize and n > 1:
        centered = centered / (g.std(dim=1, keepdim=True) + eps)
    flat = (g.amax(dim=1, keepdim=True) == g.amin(dim=1, keepdim=True))
    return centered.masked_fill(flat, 0.0).view(-1)


@torch.no_grad()
def rloo_advantages(scores: torch.Tensor, n: int) -> torch.Tensor:
    """RLOO: ``A_i = r_i - mean_{j != i} r_j = n/(n-1) * (r_i - mean_g)`` (``[B]``, n >= 2)."""
    g = _groups(scores, n, min_n=2)
    loo_mean = (g.sum(dim=1, keepdim=True) - g) / (n - 1)
    return (g - loo_mean).view(-1)


@torch.no_grad()
def reinforce_baseline_advantages(scores: torch.Tensor, n: int) -> torch.Tensor:
    """REINFORCE++-baseline: ``A_i = r_i - mean_g`` (no std division, ``[B]``).

    OpenRLHF additionally whitens the token-level advantages over the whole batch;
    that is left to the caller (``losses.masked_whiten`` on the ``[B, T]`` result) so
    each function here does one thing.
    """
    g = _groups(scores, n)
    return (g - g.mean(dim=1, keepdim=True)).view(-1)


def broadcast_to_tokens(seq_adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[B]`` -> ``[B, T]``: every real token gets its sequence's advantage, padding 0."""
    return seq_adv.unsqueeze(-1) * mask.to(seq_adv.dtype)


@torch.no_grad()
def gae_advantages(token_rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
                   gamma: float, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE over response tokens; returns ``(advantages, returns)``, both ``[B, T]``.

    ``delta_t = r_t + gamma * V_{t+1} - V_t``,  ``A_t = delta_t + gamma * lam * A_{t+1}``,
    ``R_t = A_t + V_t``, where ``t+1`` is the next *real* token and the value after the
    last real token is 0 (the episode ends at EOS). Padded positions are skipped by the
    recurrence (they carry the running state through), so the result does not depend
    on what ``values``/``token_rewards`` hold there; both outputs are 0 on padding.
    """
    m = mask.to(values.dtype)
    next_value = values.new_zeros(values.shape[0])
    running = values.new_zeros(values.shape[0])
    advantages = torch.zeros_like(values)
    for t in reversed(range(values.shape[1])):
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        step = delta + gamma * lam * running
        running = torch.where(m[:, t] > 0, step, running)
        next_value = torch.where(m[:, t] > 0, values[:, t], next_value)
        advantages[:, t] = running
    advantages = advantages * m
    return advantages, (advantages + values) * m


_OUTCOME_ESTIMATORS = {
    "group_norm": group_norm_advantages,
    "rloo": rloo_advantages,
    "reinforce_baseline": reinforce_baseline_advantages,
}


def compute_outcome_advantages(estimator: str, scores: torch.Tensor, n: int,
                               mask: torch.Tensor) -> torch.Tensor:
    """Critic-free advantage from sequence scores, broadcast to ``[B, T]``.

    ``estimator`` is ``AlgorithmConfig.advantage_estimator``; ``"gae"`` needs a critic
    and goes through ``gae_advantages`` instead.
    """
    try:
        fn = _OUTCOME_ESTIMATORS[estimator]
    except KeyError:
        raise ValueError(f"unknown outcome advantage estimator {estimator!r}; "
                         f"valid: {sorted(_OUTCOME_ESTIMATORS)}") from None
    return broadcast_to_tokens(fn(scores, n), mask)
