"""Per-token KL estimators (Schulman, "Approximating KL divergence") and KL-in-reward."""
from __future__ import annotations

import torch

# Log-ratios are clamped to +-MAX_LOG_RATIO before exp(): exp(20) ~ 4.9e8 is finite
# in fp32 and bf16, and a token that far off-policy gets no useful gradient anyway.
MAX_LOG_RATIO = 20.0

KL_ESTIMATORS = ("k1", "k2", "k3")


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str = "k3") -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from samples of pi; same shape as inputs.

    With ``x = logp - ref_logp``:
      k1 = x                     (unbiased, can be negative, high variance)
      k2 = 0.5 * x**2            (biased, >= 0)
      k3 = exp(-x) + x - 1       (unbiased, >= 0, low variance);
    for k3 the log-ratio is clamped to [-20, 20] so exp() cannot overflow (the
    gradient is zero on the few tokens beyond that).
    """
    log_ratio = logp - ref_logp
    if estimator == "k1":
        return log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio.square()
    if estimator == "k3":
        neg = (-log_ratio).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)  # log(pi_ref / pi)
        return torch.exp(neg) - neg - 1.0
    raise ValueError(f"unknown KL estimator {estimator!r}; valid: {list(KL_ESTIMATORS)}")


def token_level_rewards(scores: torch.Tensor, kl: torch.Tensor, mask: torch.Tensor,
                        kl_coef: float) -> torch.Tensor:
    """PPO reward with KL in the reward: ``r_t = -kl_coef * kl_t`` on real tokens, plus
    the sequence score ``scores[b]`` on the last real token of row b. ``[B, T]``.

    Rewards are constants, so ``kl`` is detached. The last real token is the highest
    masked index (works for any padding side); a row with no real token gets nothing.
    """
    m = mask.to(kl.dtype)
    rewards = -kl_coef * kl.detach() * m
    rows = torch.arange(m.shape[0], device=m.device)
    positions = torch.arange(m.shape[1], device=m.device, dtype=kl.dtype)
    last = (positions * m).argmax(dim=1)
    rewards[rows, last] += scores.to(kl.dtype) * m[rows, last]
    return rewards
