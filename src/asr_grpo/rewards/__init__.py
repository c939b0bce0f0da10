"""Rewards: text -> score functions, their weighted combination, and the reward-file
contract (loading a user's `reward_func` file, calling it safely). The Ray reward
worker that runs a reward file lives in `asr_grpo.workers.reward`.

Knows nothing of models. `text` is also the project's evaluation metric code.
"""
from asr_grpo.rewards.combine import RewardResult, combine, score_samples
from asr_grpo.rewards.components import (
    DEFAULT_WEIGHTS,
    REWARD_COMPONENTS,
    RewardSample,
    cer_score,
    keyword_recall,
    language_consistency,
    smoothness,
)
from asr_grpo.rewards.loader import (
    BUILTIN_REWARD_FILE,
    RewardCallFailed,
    RewardFunctionError,
    RewardTimeout,
    call_reward_function,
    load_reward_function,
    sanitize,
)
from asr_grpo.rewards.text import (
    LANGUAGE_CODES,
    LANGUAGE_NAMES,
    char_error_rate,
    error_rates_by_language,
    normalize_text,
    split_asr_output,
    utterance_cer,
    word_error_rate,
)

__all__ = [
    "BUILTIN_REWARD_FILE", "DEFAULT_WEIGHTS", "LANGUAGE_CODES", "LANGUAGE_NAMES", "REWARD_COMPONENTS",
    "RewardCallFailed", "RewardFunctionError", "RewardResult", "RewardTimeout", "RewardSample",
    "call_reward_function", "cer_score", "char_error_rate", "combine",
    "error_rates_by_language", "keyword_recall", "language_consistency",
    "load_reward_function", "normalize_text", "sanitize",
    "score_samples", "smoothness", "split_asr_output", "utterance_cer",
    "word_error_rate",
]
