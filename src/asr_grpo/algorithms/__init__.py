"""Pure tensor math for GRPO/PPO/GSPO/MWER: advantages, KL estimators and losses (no I/O, no models)."""
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
from .gspo import gspo_loss, gspo_token_loss, sequence_log_ratio
from .kl import KL_ESTIMATORS, MAX_LOG_RATIO, kl_penalty, token_level_rewards
from .losses import (
    LOSS_AGG_MODES,
    POLICY_LOSSES,
    PolicyLoss,
    PolicyLossNeeds,
    aggregate,
    aggregate_loss,
    approx_kl,
    clipped_surrogate,
    entropy_from_logits,
    explained_variance,
    logprobs_from_logits,
    masked_mean,
    masked_var,
    masked_whiten,
    policy_loss,
    policy_loss_needs,
    ppo_clip_loss,
    register_policy_loss,
    truncated_importance_weights,
    value_loss,
)
from .mwer import group_softmax, mwer_loss

__all__ = [
    "ADVANTAGE_ESTIMATORS", "AdvantageEstimator", "AdvantageInput", "KL_ESTIMATORS", "LOSS_AGG_MODES",
    "MAX_LOG_RATIO", "POLICY_LOSSES", "PolicyLoss", "PolicyLossNeeds",
    "aggregate", "aggregate_loss", "approx_kl", "broadcast_to_tokens", "clipped_surrogate", "downsample_groups",
    "entropy_from_logits", "explained_variance", "gae_advantages", "gae_estimator",
    "group_norm_advantages", "group_softmax", "gspo_loss", "gspo_token_loss", "kl_penalty",
    "logprobs_from_logits", "masked_mean", "masked_var", "masked_whiten", "max_variance_subset",
    "mwer_loss", "policy_loss", "policy_loss_needs", "ppo_clip_loss",
    "register_advantage_estimator", "register_policy_loss", "reinforce_baseline_advantages",
    "sequence_log_ratio",
    "rloo_advantages", "token_level_rewards", "truncated_importance_weights",
    "value_loss",
]
