"""Advantage estimators.

Sequence-level scores are ``[B]``; GRPO groups are ``B // n`` consecutive blocks of
``n`` samples of the same prompt. Token tensors are ``[B, T]`` with a 0/1 ``mask``.
Advantages are constants for the policy loss, so every estimator here runs without
autograd.

``algorithm.advantage_estimator`` names an entry of ``ADVANTAGE_ESTIMATORS``: a function
of an ``AdvantageInput`` registered with ``register_advantage_estimator``, which also
states what the estimator needs (samples per prompt, a critic), for the config
validation to check before a run starts.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

from asr_grpo.config.registry import Registry

from .kl import token_level_rewards
from .losses import masked_whiten


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


@dataclass(frozen=True)
class AdvantageInput:
    """What an estimator may read; sequences arrive grouped, ``group_size``
    consecutive samples of one prompt."""
    scores: torch.Tensor                      # [B] sequence rewards
    mask: torch.Tensor                        # [B, T] response tokens (0/1)
    group_size: int
    values: Optional[torch.Tensor] = None     # [B, T] critic values (None without a critic)
    kl: Optional[torch.Tensor] = None         # [B, T] KL to the reference (None without one)
    kl_coef: float = 0.0                      # the KL's weight in a per-token reward; 0: KL in the loss
    gamma: float = 1.0
    lam: float = 0.95


# -> (advantages [B, T], returns [B, T] for a critic to fit, or None)
EstimatorFn = Callable[[AdvantageInput], tuple[torch.Tensor, Optional[torch.Tensor]]]


@dataclass(frozen=True)
class AdvantageEstimator:
    fn: EstimatorFn
    min_group_size: int = 1      # samples of one prompt it compares (checked against the config)
    needs_critic: bool = False   # reads `values` (algorithm.use_critic=true)
    kl_in_reward: bool = False   # takes the KL into its per-token reward (algorithm.kl_in_reward)


ADVANTAGE_ESTIMATORS: Registry[AdvantageEstimator] = Registry("algorithm.advantage_estimator")


def register_advantage_estimator(name: str, *, min_group_size: int = 1, needs_critic: bool = False,
                                 kl_in_reward: bool = False) -> Callable[[EstimatorFn], EstimatorFn]:
    """Decorator: the function becomes `algorithm.advantage_estimator=<name>`."""
    def register(fn: EstimatorFn) -> EstimatorFn:
        estimator = AdvantageEstimator(fn, min_group_size, needs_critic, kl_in_reward)
        ADVANTAGE_ESTIMATORS.register(name)(estimator)
        return fn
    return register


def _outcome(sequence_fn: Callable[[torch.Tensor, int], torch.Tensor]) -> EstimatorFn:
    """An estimator from a sequence-level one (``[B]`` scores -> ``[B]``), on every token."""
    return lambda x: (broadcast_to_tokens(sequence_fn(x.scores, x.group_size), x.mask), None)


register_advantage_estimator("group_norm", min_group_size=2)(_outcome(group_norm_advantages))
register_advantage_estimator("rloo", min_group_size=2)(_outcome(rloo_advantages))
register_advantage_estimator("reinforce_baseline")(_outcome(reinforce_baseline_advantages))
# Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training"): GRPO's group-mean
# baseline without the division by the group's std, which is reinforce_baseline's math;
# its length-unbiased half is loss_agg=seq_mean_token_sum_norm (losses.aggregate_loss).
register_advantage_estimator("dr_grpo", min_group_size=2)(_outcome(reinforce_baseline_advantages))


@register_advantage_estimator("gae", needs_critic=True, kl_in_reward=True)
def gae_estimator(x: AdvantageInput) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO: GAE over the per-token reward (the score on the last token, minus
    ``kl_coef`` x KL on every token), advantages whitened over the batch."""
    kl = x.kl if x.kl is not None else torch.zeros_like(x.mask)
    rewards = token_level_rewards(x.scores, kl, x.mask, x.kl_coef)
    adv, ret = gae_advantages(rewards, x.values, x.mask, x.gamma, x.lam)
    return masked_whiten(adv, x.mask) * x.mask, ret
