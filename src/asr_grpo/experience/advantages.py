"""Driver-side advantage estimation over a step's finished sequences with the estimator
`algorithm.advantage_estimator` names (GRPO outcome estimators, or PPO GAE with the
critic), KL to the reference in the reward or not."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from asr_grpo.algorithms import ADVANTAGE_ESTIMATORS, AdvantageInput, kl_penalty, masked_mean
from asr_grpo.config.schema import AlgorithmConfig
from asr_grpo.experience.tensors import length_mask, pad_ragged, unpad


@dataclass
class Advantages:
    advantages: list[torch.Tensor]
    returns: list[torch.Tensor] | None
    metrics: dict[str, float]


def estimate_advantages(algo: AlgorithmConfig, scores: torch.Tensor, lengths: Sequence[int],
                        old_logprobs: Sequence[torch.Tensor], ref_logprobs: Sequence[torch.Tensor] | None,
                        values: Sequence[torch.Tensor] | None, group_size: int) -> Advantages:
    """Sequences arrive grouped: `group_size` consecutive samples per prompt."""
    mask = length_mask(lengths)
    width = mask.shape[1]
    metrics: dict[str, float] = {}
    kl = None
    if ref_logprobs is not None:
        kl = kl_penalty(pad_ragged(old_logprobs, width), pad_ragged(ref_logprobs, width), algo.kl_estimator) * mask
        metrics["kl/policy_ref"] = float(masked_mean(kl, mask))
    estimator = ADVANTAGE_ESTIMATORS.get(algo.advantage_estimator)
    if estimator.needs_critic and values is None:
        raise ValueError(f"algorithm.advantage_estimator={algo.advantage_estimator} needs the critic "
                         "(algorithm.use_critic=true)")
    coef = algo.kl_coef if (algo.kl_in_reward and kl is not None) else 0.0
    adv, ret = estimator.fn(AdvantageInput(
        scores, mask, group_size, values=pad_ragged(values, width) if values is not None else None, kl=kl,
        kl_coef=coef, gamma=algo.gamma, lam=algo.lam))
    if ret is None:
        return Advantages(unpad(adv, lengths), None, metrics)
    metrics["charts/returns_mean"] = float(masked_mean(ret, mask))
    return Advantages(unpad(adv, lengths), unpad(ret, lengths), metrics)
