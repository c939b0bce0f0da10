"""Typed config schemas and their Hydra registration."""
from asr_grpo.config.schema import (
    AlgorithmConfig,
    CorpusConfig,
    DataConfig,
    LoggerConfig,
    ModelConfig,
    OverlapConfig,
    PathsConfig,
    PlacementConfig,
    RewardConfig,
    RolloutConfig,
    RunConfig,
    SFTConfig,
    TrainerConfig,
)
from asr_grpo.config.store import register_configs

__all__ = [
    "AlgorithmConfig", "CorpusConfig", "DataConfig", "LoggerConfig", "ModelConfig", "OverlapConfig",
    "PathsConfig", "PlacementConfig", "RewardConfig", "RolloutConfig", "RunConfig", "SFTConfig",
    "TrainerConfig", "register_configs",
]
