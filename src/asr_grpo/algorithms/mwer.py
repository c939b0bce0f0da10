"""MWER: minimum word (here: character) error rate training over each prompt's sampled
hypotheses (Prabhavalkar et al. 2018, "Minimum Word Error Rate Training for
Attention-based Sequence-to-Sequence Models"), the sequence objective speech
recognition used before RL.

A group's n samples stand in for the N-best list. Their probabilities under the current
policy, renormalised over the group, weigh each one's error against the group's mean:

    P_i = sum_t logp_it                      (the sequence's log-probability)
    p_i = exp(a P_i) / sum_{j in group} exp(a P_j)
    L   = mean over groups of  sum_i p_i (err_i - mean_j err_j)

``a`` = ``algorithm.mwer_logp_scale``, 1 in the textbook objective. Sampled hypotheses'
log-probabilities differ by several nats, so at 1 one hypothesis can take nearly all of
p, and with it the gradient ``a p_i (err_i - E_p[err])`` vanishes; a < 1 flattens p (the
posterior scaling of sequence-discriminative training).

The mean error is the baseline: it leaves the gradient ``p_i (err_i - E_p[err])``
unchanged (the p_i sum to 1) and keeps the loss near 0. ``err_i - mean_j err_j`` arrives
as minus the sample's advantage: the `dr_grpo` estimator (group mean, no std scaling)
over the score ``1 - err`` (``algorithm.score_component=cer``: the reward's CER
component, ``1 - min(CER, 1)``).

No ratio to the old policy: the objective is the expected error over the hypotheses the
group holds, exactly, whichever policy drew them, so it needs no importance correction
when the current weights have moved past the sampler's (later micro-batches, further
epochs, tokens an overcommitted step carried); the old log-probs only feed the logged
``approx_kl``, which shows how far they moved.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import torch

from .losses import PolicyLossNeeds, approx_kl, masked_mean, register_policy_loss

if TYPE_CHECKING:
    from asr_grpo.config.schema import AlgorithmConfig


def group_softmax(scores: torch.Tensor, groups: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Softmax of ``scores`` ([B]) within each group (``groups``: [B] integer ids, members
    in any order) over the ``valid`` rows; invalid rows get 0."""
    n_groups = int(groups.max()) + 1 if groups.numel() else 0
    masked = scores.masked_fill(~valid, float("-inf"))
    top = torch.full((n_groups,), float("-inf"), dtype=scores.dtype, device=scores.device)
    top = top.scatter_reduce(0, groups, masked.detach(), reduce="amax")   # a shift: no gradient needed
    shifted = torch.where(valid, masked - top[groups].clamp_min(torch.finfo(scores.dtype).min), 0.0)
    e = torch.where(valid, shifted.exp(), 0.0)
    total = torch.zeros(n_groups, dtype=scores.dtype, device=scores.device).index_add(0, groups, e)
    return e / total[groups].clamp_min(torch.finfo(scores.dtype).tiny)


def mwer_loss(logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, groups: torch.Tensor,
              logp_scale: float = 1.0) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``L`` above over the groups present (``groups``: each row's group id, [B]);
    ``advantages`` ([B, T]) hold ``mean_j err_j - err_i`` on every real token. Rows without
    tokens take no part. Metrics: ``mwer_p_max`` (the mean over groups of the largest
    p_i: 1/n is uniform, 1 is one hypothesis taking all) and ``seq_logp_mean``."""
    valid = mask.sum(-1) > 0
    seq_logp = (logp * mask.to(logp.dtype)).sum(-1)
    p = group_softmax(logp_scale * seq_logp, groups, valid)
    relative_error = -masked_mean(advantages, mask, dim=-1)
    present = torch.zeros(int(groups.max()) + 1 if groups.numel() else 0, dtype=torch.bool,
                          device=groups.device).index_fill(0, groups[valid], True)
    n_groups = present.sum().clamp_min(1)
    loss = (p * relative_error).sum() / n_groups
    with torch.no_grad():
        p_max = torch.zeros_like(present, dtype=p.dtype).scatter_reduce(0, groups, p, reduce="amax")
        metrics = {"mwer_p_max": p_max[present].sum() / n_groups,
                   "seq_logp_mean": masked_mean(seq_logp, valid)}
    return loss, metrics


@register_policy_loss("mwer", PolicyLossNeeds(sequence_advantages=True, estimators=("dr_grpo", "reinforce_baseline"),
                                              whole_groups=True, stale_is_weights=False))
def mwer_policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                     algo: AlgorithmConfig, importance_weights: Optional[torch.Tensor] = None,
                     groups: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``mwer_loss`` over the micro-batch's groups with ``algo.mwer_logp_scale``, and how far
    the weights moved from the sampler's (``approx_kl``, not used by the loss)."""
    if groups is None:
        raise ValueError("policy_loss=mwer needs each sample's group (`groups`)")
    if importance_weights is not None:
        raise ValueError("policy_loss=mwer takes no importance weights (algorithm.stale_is_correction=false)")
    loss, metrics = mwer_loss(logp, advantages, mask, groups, algo.mwer_logp_scale)
    metrics["approx_kl"] = approx_kl(logp, old_logp, mask)
    return loss, metrics
