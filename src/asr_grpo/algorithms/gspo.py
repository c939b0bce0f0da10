"""GSPO: Group Sequence Policy Optimization (Zheng et al. 2025, arXiv 2507.18071), the
objective Qwen3-ASR's RL stage trains with.

PPO's token ratio weighs each token by one sample of a noisy per-token quantity; GSPO
takes the importance ratio of the whole sequence instead, length-normalised so that
sequences of any length live on one scale:

    s_i = (pi(y_i) / pi_old(y_i)) ^ (1 / |y_i|) = exp( mean_t (logp_t - old_logp_t) )

and clips it at the sequence level with its own, much smaller range
(``algorithm.gspo_eps_clip_low`` / ``gspo_eps_clip_high``; the paper's 3e-4 / 4e-4):

    gspo:        L = mean_i max(-A_i s_i, -A_i clip(s_i, 1 - eps_low, 1 + eps_high))

with A_i the sequence's advantage. The token variant keeps per-token advantages:
``s_it = sg[s_i] * pi(y_it) / sg[pi(y_it)]`` has the value s_i at every token and the
gradient ``s_i * grad log pi(y_it)``, clipped per token as above and aggregated by
``algorithm.loss_agg``; with one advantage for all of a sequence's tokens and
``seq_mean_token_mean`` it is ``gspo`` exactly.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import torch

from .kl import MAX_LOG_RATIO
from .losses import PolicyLossNeeds, approx_kl, clipped_surrogate, masked_mean, register_policy_loss

if TYPE_CHECKING:
    from asr_grpo.config.schema import AlgorithmConfig


def sequence_log_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``log s_i = mean over the sequence's real tokens of (logp - old_logp)`` (``[B]``;
    0 for a row without tokens), clamped like the token ratios so exp() stays finite."""
    return masked_mean(logp - old_logp, mask, dim=-1).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)


def gspo_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
              eps_clip_low: float, eps_clip_high: float, dual_clip: Optional[float] = None,
              importance_weights: Optional[torch.Tensor] = None,
              ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GSPO's sequence-level clipped loss, a mean over the sequences with real tokens.

    A sequence's advantage is the mean of its tokens' (equal for the outcome estimators);
    stale tokens' ``importance_weights`` enter as their geometric mean over the sequence,
    the same length normalisation as the ratio. Metrics (``clipped_surrogate``'s) count
    sequences, ``approx_kl`` tokens.
    """
    rows = (mask.sum(-1) > 0).unsqueeze(-1)
    ratio = torch.exp(sequence_log_ratio(logp, old_logp, mask)).unsqueeze(-1)
    seq_adv = masked_mean(advantages, mask, dim=-1).unsqueeze(-1)
    seq_weights = None
    if importance_weights is not None:
        log_w = importance_weights.detach().clamp_min(torch.finfo(importance_weights.dtype).tiny).log()
        seq_weights = torch.exp(masked_mean(log_w, mask, dim=-1)).unsqueeze(-1)
    loss, metrics = clipped_surrogate(ratio, seq_adv, rows, eps_clip_low, eps_clip_high, dual_clip,
                                      "token_mean", seq_weights)
    metrics["approx_kl"] = approx_kl(logp, old_logp, mask)
    return loss, metrics


def gspo_token_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                    eps_clip_low: float, eps_clip_high: float, dual_clip: Optional[float] = None,
                    loss_agg: str = "seq_mean_token_mean", importance_weights: Optional[torch.Tensor] = None,
                    norm_tokens: Optional[int] = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GSPO-token: the sequence ratio's value with each token's own gradient path, per-token
    advantages, clipped per token and aggregated by ``loss_agg``."""
    log_s = sequence_log_ratio(logp, old_logp, mask).detach().unsqueeze(-1)
    ratio = torch.exp(log_s + logp - logp.detach())
    loss, metrics = clipped_surrogate(ratio, advantages, mask, eps_clip_low, eps_clip_high, dual_clip,
                                      loss_agg, importance_weights, norm_tokens)
    metrics["approx_kl"] = approx_kl(logp, old_logp, mask)
    return loss, metrics


@register_policy_loss("gspo", PolicyLossNeeds(sequence_advantages=True))
def gspo_policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                     algo: AlgorithmConfig, importance_weights: Optional[torch.Tensor] = None,
                     ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``gspo_loss`` with ``algo``'s GSPO clip range and dual clip (``loss_agg`` does not
    apply: the loss is a mean over sequences)."""
    return gspo_loss(logp, old_logp, advantages, mask, algo.gspo_eps_clip_low, algo.gspo_eps_clip_high,
                     algo.dual_clip, importance_weights)


@register_policy_loss("gspo_token")
def gspo_token_policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                           mask: torch.Tensor, algo: AlgorithmConfig,
                           importance_weights: Optional[torch.Tensor] = None,
                           ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``gspo_token_loss`` with ``algo``'s GSPO clip range, dual clip and aggregation."""
    return gspo_token_loss(logp, old_logp, advantages, mask, algo.gspo_eps_clip_low, algo.gspo_eps_clip_high,
                           algo.dual_clip, algo.loss_agg, importance_weights, algo.max_new_tokens)
