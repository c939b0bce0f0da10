"""Pure tensor math for GRPO/PPO: advantages, KL estimators and losses (no I/O, no models)."""
from .advantages import (
    broadcast_to_tokens,
    compute_outcome_advantages,
    gae_advantages,
    group_norm_advantages,
    reinforce_baseline_advantages,
    rloo_advantages,
)
from .downsample import downsample_groups, max_variance_subset, trained_per_group
from .kl import KL_ESTIMATORS, MAX_LOG_RATIO, kl_penalty, token_level_rewards
from .losses import (
    LOSS_AGG_MODES,
    aggregate_loss,
    entropy_from_logits,
    explained_variance,
    logprobs_from_logits,
    masked_mean,
    masked_var,
    masked_whiten,
    policy_loss,
    truncated_importance_weights,
    value_loss,
)

__all__ = [
    "KL_ESTIMATORS", "LOSS_AGG_MODES", "MAX_LOG_RATIO",
    "aggregate_loss", "broadcast_to_tokens", "compute_outcome_advantages", "downsample_groups",
    "entropy_from_logits", "explained_variance", "gae_advantages",
    "group_norm_advantages", "kl_penalty", "logprobs_from_logits", "masked_mean",
    "masked_var", "masked_whiten", "max_variance_subset", "policy_loss", "reinforce_baseline_advantages",
    "rloo_advantages", "token_level_rewards", "trained_per_group", "truncated_importance_weights",
    "value_loss",
]
