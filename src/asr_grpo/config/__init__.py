"""Typed config schemas and their Hydra registration."""
from asr_grpo.config.model_shapes import register_model_shape_resolver
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

# Before any config loads: conf/forecast_model reads shapes from conf/model through it.
register_model_shape_resolver()

__all__ = [
    "AlgorithmConfig", "CorpusConfig", "DataConfig", "LoggerConfig", "ModelConfig", "OverlapConfig",
    "PathsConfig", "PlacementConfig", "RewardConfig", "RolloutConfig", "RunConfig", "SFTConfig",
    "TrainerConfig", "register_configs",
]
