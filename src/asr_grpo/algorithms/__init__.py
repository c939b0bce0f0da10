"""Pure tensor math for GRPO/PPO: advantages, KL estimators and losses (no I/O, no models)."""
from .advantages import (
    ADVANTAGE_ESTIMATORS,
    AdvantageEstimator,
    AdvantageInput,
    broadcast_to_tokens,
    gae_advantages,
    gae_estimator,
    group_norm_advantages,
    register_advantage_estimator,
    reinforce_baseline_advantages,
    rloo_advantages,
)
from .downsample import downsample_groups, max_variance_subset
from .kl import KL_ESTIMATORS, MAX_LOG_RATIO, kl_penalty, token_level_rewards
from .losses import (
    LOSS_AGG_MODES,
    POLICY_LOSSES,
    PolicyLoss,
    aggregate_loss,
    entropy_from_logits,
    explained_variance,
    logprobs_from_logits,
    masked_mean,
    masked_var,
    masked_whiten,
    policy_loss,
    ppo_clip_loss,
    truncated_importance_weights,
    value_loss,
)

__all__ = [
    "ADVANTAGE_ESTIMATORS", "AdvantageEstimator", "AdvantageInput", "KL_ESTIMATORS", "LOSS_AGG_MODES",
    "MAX_LOG_RATIO", "POLICY_LOSSES", "PolicyLoss",
    "aggregate_loss", "broadcast_to_tokens", "downsample_groups",
    "entropy_from_logits", "explained_variance", "gae_advantages", "gae_estimator",
    "group_norm_advantages", "kl_penalty", "logprobs_from_logits", "masked_mean",
    "masked_var", "masked_whiten", "max_variance_subset", "policy_loss", "ppo_clip_loss",
    "register_advantage_estimator", "reinforce_baseline_advantages",
    "rloo_advantages", "token_level_rewards", "truncated_importance_weights",
    "value_loss",
]
