"""Micro-batch losses of the policy and the critic: pack the items, run the model, apply
the pure losses from `algorithms` (the policy's is the one `algorithm.policy_loss` names).
Shared by every worker that trains. The losses are computed on the model's device (the
experience fields go there), from the response positions' logits only."""
from __future__ import annotations

from typing import Sequence

import torch

from asr_grpo.algorithms import (
    POLICY_LOSSES,
    aggregate,
    entropy_from_logits,
    explained_variance,
    kl_penalty,
    logprobs_from_logits,
    masked_mean,
    policy_loss_needs,
    truncated_importance_weights,
    value_loss,
)
from asr_grpo.config.schema import AlgorithmConfig
from asr_grpo.experience.tensors import pad_ragged
from asr_grpo.experience.types import ExperienceItem
from asr_grpo.models.critic import response_values
from asr_grpo.models.sequences import SequenceBatch, pack_sequences, response_logits


def pack_items(items: Sequence[ExperienceItem], pad_id: int) -> SequenceBatch:
    return pack_sequences([it.prompt_ids for it in items], [it.response_ids for it in items],
                          [it.features for it in items], pad_id)


def _field(items: Sequence[ExperienceItem], name: str, width: int, device: torch.device) -> torch.Tensor:
    return pad_ragged([getattr(it, name) for it in items], width).to(device)


def group_index(items: Sequence[ExperienceItem], device: torch.device) -> torch.Tensor:
    """``[B]`` ids 0, 1, ... of the items' prompt groups, in order of first appearance."""
    ids: dict[str, int] = {}
    return torch.tensor([ids.setdefault(it.group, len(ids)) for it in items], dtype=torch.long, device=device)


def actor_loss(model, items: Sequence[ExperienceItem], algo: AlgorithmConfig,
               pad_id: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    batch = pack_items(items, pad_id)
    T = batch.response_ids.shape[1]
    logits = response_logits(model, batch).float()   # bf16 logits: scale in fp32, as the sampler does
    dev = logits.device
    mask = batch.response_mask.to(dev)
    if algo.temperature not in (0.0, 1.0):
        logits = logits / algo.temperature
    logp = logprobs_from_logits(logits, batch.response_ids.to(dev))
    old = _field(items, "old_logprobs", T, dev)
    weights = None
    if algo.stale_is_correction:
        # Tokens decoded by an older policy (carried over by overcommit): truncated IS.
        weights = truncated_importance_weights(old, _field(items, "behaviour_logprobs", T, dev),
                                               algo.stale_is_clip)
    loss_fn = POLICY_LOSSES.get(algo.policy_loss)
    advantages = _field(items, "advantages", T, dev)
    # A loss over each group's samples together (MWER's softmax) is told which rows share one.
    groups = {"groups": group_index(items, dev)} if policy_loss_needs(loss_fn).whole_groups else {}
    loss, metrics = loss_fn(logp, old, advantages, mask, algo, importance_weights=weights, **groups)
    metrics = {f"policy/{k}": v for k, v in metrics.items()}
    metrics["loss/policy"] = loss.detach()
    if not algo.kl_in_reward and algo.kl_coef > 0:
        kl = kl_penalty(logp, _field(items, "ref_logprobs", T, dev), algo.kl_estimator)
        kl_loss = aggregate(kl, mask, algo)
        loss = loss + algo.kl_coef * kl_loss
        metrics["kl/loss"] = kl_loss.detach()
    token_entropy = entropy_from_logits(logits.detach() if algo.entropy_coef == 0 else logits)
    if algo.entropy_coef:
        loss = loss - algo.entropy_coef * aggregate(token_entropy, mask, algo)
    # Logged per token whatever loss_agg is (a token sum over max_new_tokens is no entropy),
    # so runs of different objectives compare.
    metrics["policy/entropy"] = masked_mean(token_entropy.detach(), mask)
    metrics["loss/actor_total"] = loss.detach()
    return loss, metrics


def critic_loss(model, items: Sequence[ExperienceItem], algo: AlgorithmConfig, pad_id: int
                ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    batch = pack_items(items, pad_id)
    T = batch.response_ids.shape[1]
    values = response_values(model, batch)
    dev = values.device
    mask, returns = batch.response_mask.to(dev), _field(items, "returns", T, dev)
    loss, metrics = value_loss(values, _field(items, "old_values", T, dev), returns, mask, algo.value_clip,
                               algo.loss_agg, algo.max_new_tokens)
    metrics = {f"critic/{k}": v for k, v in metrics.items()}
    metrics["critic/explained_variance"] = explained_variance(values.detach(), returns, mask)
    metrics["loss/value"] = loss.detach()
    return loss, metrics
