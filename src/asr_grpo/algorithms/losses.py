"""Masked reductions, PPO policy/value losses and logit utilities.

All ``[B, T]`` inputs share a 0/1 ``mask``; metrics are detached 0-d tensors (call
``.item()`` when logging, so the training step does not sync the device for them).
``algorithm.policy_loss`` names an entry of ``POLICY_LOSSES`` (a ``PolicyLoss``); the
sequence-level losses register theirs from `gspo.py` and `mwer.py`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional, Protocol

import torch

from asr_grpo.config.registry import Registry

from .kl import MAX_LOG_RATIO, kl_penalty

if TYPE_CHECKING:
    from asr_grpo.config.schema import AlgorithmConfig

LOSS_AGG_MODES = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm")


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: Optional[int] = None) -> torch.Tensor:
    """``sum(x * mask) / sum(mask)`` over ``dim`` (all elements if None); 0 where the
    mask is empty instead of NaN."""
    m = mask.to(x.dtype)
    if dim is None:
        return (x * m).sum() / m.sum().clamp_min(1.0)
    return (x * m).sum(dim) / m.sum(dim).clamp_min(1.0)


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of the masked elements of ``x`` (scalar)."""
    var = masked_mean((x - masked_mean(x, mask)).square(), mask)
    if unbiased:
        count = mask.to(x.dtype).sum()
        var = var * count / (count - 1).clamp_min(1.0)
    return var


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True,
                  eps: float = 1e-8) -> torch.Tensor:
    """``(x - mean) / sqrt(var + eps)`` over the masked elements (batch-global), 0 on
    padding; ``shift_mean=False`` keeps the original mean (only rescales)."""
    mean = masked_mean(x, mask)
    out = (x - mean) * torch.rsqrt(masked_var(x, mask) + eps)
    if not shift_mean:
        out = out + mean
    return out * mask.to(x.dtype)


def aggregate_loss(loss_mat: torch.Tensor, mask: torch.Tensor,
                   mode: str = "token_mean", norm_tokens: Optional[int] = None) -> torch.Tensor:
    """Reduce a per-token loss ``[B, T]`` to a scalar.

    token_mean:              sum_bt(l * m) / sum_bt(m)        (every token weighs the same)
    seq_mean_token_mean:     mean_b[ sum_t(l * m) / sum_t(m) ] (every sequence weighs the same)
    seq_mean_token_sum:      mean_b[ sum_t(l * m) ]            (no length division)
    seq_mean_token_sum_norm: mean_b[ sum_t(l * m) ] / norm_tokens (Dr. GRPO: a constant,
                             ``algorithm.max_new_tokens``, so no sequence's tokens weigh
                             more for being in a short one)
    The mean over sequences skips rows without any real token.
    """
    if mode == "token_mean":
        return masked_mean(loss_mat, mask)
    if mode == "seq_mean_token_mean":
        per_seq = masked_mean(loss_mat, mask, dim=-1)
    elif mode in ("seq_mean_token_sum", "seq_mean_token_sum_norm"):
        per_seq = (loss_mat * mask.to(loss_mat.dtype)).sum(-1)
    else:
        raise ValueError(f"unknown loss_agg {mode!r}; valid: {list(LOSS_AGG_MODES)}")
    loss = masked_mean(per_seq, mask.sum(-1) > 0)
    if mode == "seq_mean_token_sum_norm":
        if norm_tokens is None or norm_tokens < 1:
            raise ValueError(f"loss_agg {mode} needs a constant norm_tokens >= 1, got {norm_tokens}")
        loss = loss / norm_tokens
    return loss


def aggregate(loss_mat: torch.Tensor, mask: torch.Tensor, algo: AlgorithmConfig) -> torch.Tensor:
    """``aggregate_loss`` as ``algo`` sets it (``loss_agg``, its constant ``max_new_tokens``)."""
    return aggregate_loss(loss_mat, mask, algo.loss_agg, algo.max_new_tokens)


def clipped_surrogate(ratio: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                      eps_clip_low: float, eps_clip_high: float, dual_clip: Optional[float] = None,
                      loss_agg: str = "token_mean", importance_weights: Optional[torch.Tensor] = None,
                      norm_tokens: Optional[int] = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO's clipped surrogate of any importance ratio, per element of ``[B, T]`` (a token's
    ratio for PPO, a sequence's for GSPO with ``T == 1``), aggregated by ``loss_agg``:

    ``l = max(-A * rho, -A * clip(rho, 1 - eps_clip_low, 1 + eps_clip_high))``;
    with dual clip (Ye et al. 2020) and ``A < 0``: ``l = min(l, -dual_clip * A)``, which
    bounds the loss of a negative-advantage element whose ratio has blown up.
    ``importance_weights`` multiply ``l`` and are detached. Clipped elements get zero
    gradient. Metrics: ``clip_frac`` (elements where the clipped term is strictly the
    larger one), ``dual_clip_frac``, ``ratio_mean`` and ``ratio_max`` over real elements.
    """
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
    surr = -advantages * ratio
    surr_clipped = -advantages * ratio.clamp(1.0 - eps_clip_low, 1.0 + eps_clip_high)
    loss_mat = torch.maximum(surr, surr_clipped)
    clipped = surr_clipped > surr

    dual_active = torch.zeros_like(clipped)
    if dual_clip is not None:
        bound = -advantages * dual_clip
        dual_active = (advantages < 0) & (loss_mat > bound)
        loss_mat = torch.where(dual_active, bound, loss_mat)
    if importance_weights is not None:
        loss_mat = loss_mat * importance_weights.detach()

    loss = aggregate_loss(loss_mat, mask, loss_agg, norm_tokens)
    with torch.no_grad():
        metrics = {
            "clip_frac": masked_mean(clipped.float(), mask),
            "dual_clip_frac": masked_mean(dual_active.float(), mask),
            "ratio_mean": masked_mean(ratio, mask),
            "ratio_max": ratio.masked_fill(~mask.bool(), float("-inf")).max(),
        }
    return loss, metrics


@torch.no_grad()
def approx_kl(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Masked mean of the k3 estimator of KL(pi_old || pi), ``(rho - 1) - log rho`` per
    token (>= 0, unlike the k1 mean of ``old_logp - logp``)."""
    # kl_penalty(a, b, "k3") estimates KL(a-sampler || b): here old || current.
    return masked_mean(kl_penalty(old_logp, logp, "k3"), mask)


def policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                mask: torch.Tensor, eps_clip_low: float, eps_clip_high: float,
                dual_clip: Optional[float] = None, loss_agg: str = "token_mean",
                importance_weights: Optional[torch.Tensor] = None, norm_tokens: Optional[int] = None,
                ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clipped surrogate with asymmetric clipping (DAPO "clip-higher") on the token
    ratio ``rho = exp(logp - old_logp)`` (``clipped_surrogate``). ``importance_weights``
    (e.g. truncated IS for stale tokens) multiply the per-token loss.

    Metrics: those of ``clipped_surrogate`` over tokens and ``approx_kl``.
    """
    ratio = torch.exp((logp - old_logp).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO))
    loss, metrics = clipped_surrogate(ratio, advantages, mask, eps_clip_low, eps_clip_high, dual_clip,
                                      loss_agg, importance_weights, norm_tokens)
    metrics["approx_kl"] = approx_kl(logp, old_logp, mask)
    return loss, metrics


class PolicyLoss(Protocol):
    """What `algorithm.policy_loss=<name>` registers: the policy's loss over a micro-batch
    of response tokens (``[B, T]``: current and old log-probs, advantages, mask) with the
    knobs of ``algo``, and its metrics (logged as ``policy/<name>``). ``importance_weights``
    (stale tokens' truncated IS, or None) multiply the per-token loss."""

    def __call__(self, logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                 mask: torch.Tensor, algo: AlgorithmConfig, importance_weights: Optional[torch.Tensor] = None,
                 ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]: ...


POLICY_LOSSES: Registry[PolicyLoss] = Registry("algorithm.policy_loss")


@dataclass(frozen=True)
class PolicyLossNeeds:
    """What a policy loss needs of the rest of the config (checked by `config/validate.py`
    before a run starts). A loss registered without them needs nothing."""
    sequence_advantages: bool = False      # one advantage per sequence: no critic, no per-token (GAE) ones
    estimators: tuple[str, ...] = ()       # only these advantage estimators (empty: any)
    whole_groups: bool = False             # takes `groups` ([B] group index); a micro-batch holds whole groups
    stale_is_weights: bool = True          # applies algorithm.stale_is_correction's weights


def register_policy_loss(name: str, needs: Optional[PolicyLossNeeds] = None,
                         ) -> Callable[[PolicyLoss], PolicyLoss]:
    """Decorator: the function becomes `algorithm.policy_loss=<name>`, with what it needs."""
    def register(fn: PolicyLoss) -> PolicyLoss:
        fn.needs = needs or PolicyLossNeeds()
        return POLICY_LOSSES.register(name)(fn)
    return register


def policy_loss_needs(loss: PolicyLoss) -> PolicyLossNeeds:
    return getattr(loss, "needs", PolicyLossNeeds())


@register_policy_loss("ppo_clip")
def ppo_clip_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                  algo: AlgorithmConfig, importance_weights: Optional[torch.Tensor] = None,
                  ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``policy_loss`` with the clip range, dual clip and aggregation of ``algo``."""
    return policy_loss(logp, old_logp, advantages, mask, algo.eps_clip_low, algo.eps_clip_high,
                       algo.dual_clip, algo.loss_agg, importance_weights=importance_weights,
                       norm_tokens=algo.max_new_tokens)


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor,
               mask: torch.Tensor, value_clip: Optional[float] = None,
               loss_agg: str = "token_mean", norm_tokens: Optional[int] = None,
               ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Critic loss ``0.5 * max((V - R)^2, (V_clip - R)^2)`` with
    ``V_clip = old_V + clip(V - old_V, -c, c)``; plain ``0.5 * (V - R)^2`` when
    ``value_clip`` is None. Metric ``value_clip_frac``: tokens where the clipped
    error is strictly larger (their gradient is zero)."""
    loss_mat = (values - returns).square()
    clipped = torch.zeros_like(loss_mat, dtype=torch.bool)
    if value_clip is not None:
        if value_clip <= 0:
            raise ValueError(f"value_clip must be > 0 or None, got {value_clip}")
        v_clip = old_values + (values - old_values).clamp(-value_clip, value_clip)
        loss_clipped = (v_clip - returns).square()
        clipped = loss_clipped > loss_mat
        loss_mat = torch.maximum(loss_mat, loss_clipped)
    loss = 0.5 * aggregate_loss(loss_mat, mask, loss_agg, norm_tokens)
    return loss, {"value_clip_frac": masked_mean(clipped.float(), mask).detach()}


@torch.no_grad()
def explained_variance(values: torch.Tensor, returns: torch.Tensor,
                       mask: torch.Tensor) -> torch.Tensor:
    """``1 - Var[R - V] / Var[R]`` over real tokens (1: perfect critic, 0: no better
    than a constant, < 0: worse). Returns 0.0 when ``Var[R] == 0``, where the ratio is
    undefined, rather than NaN/inf that would poison logged averages."""
    var_r = masked_var(returns, mask)
    ev = 1.0 - masked_var(returns - values, mask) / var_r.clamp_min(torch.finfo(var_r.dtype).tiny)
    return torch.where(var_r > 0, ev, torch.zeros_like(ev))


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Per-position entropy ``H = -sum_v p_v log p_v`` (``[B, T, V] -> [B, T]``).

    ``log p = z - logsumexp(z)`` via ``log_softmax``, which subtracts the max first;
    the textbook ``logsumexp(z) - sum p z`` cancels catastrophically for large logits.
    """
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)


def logprobs_from_logits(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """``log p(token) = z_token - logsumexp(z)`` (``[B, T, V]``, ``[B, T]`` -> ``[B, T]``).

    Gathering before normalising avoids materialising a second ``[B, T, V]``
    log-softmax tensor. Computed in fp32 so ratios of bf16 models stay accurate.
    """
    logits = logits.float()
    picked = logits.gather(-1, tokens.long().unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


@torch.no_grad()
def truncated_importance_weights(logp_current_old: torch.Tensor, logp_behaviour: torch.Tensor,
                                 clip: float) -> torch.Tensor:
    """Truncated IS weights ``min(exp(a - b), clip)`` for tokens sampled by a stale
    behaviour policy b (a: the policy the PPO ratio is taken against). Constants.
    Computed as ``exp(min(a - b, log clip))`` so exp() never overflows."""
    if clip <= 0:
        raise ValueError(f"clip must be > 0, got {clip}")
    return torch.exp((logp_current_old - logp_behaviour).clamp(max=math.log(clip)))
