"""The speech LLM: Qwen3-ASR built from config or loaded from an HF folder."""
from asr_grpo.models.builder import (
    ParameterCounts,
    architecture_config,
    audio_encoder,
    build_model,
    build_processor,
    fresh_model,
    load_model,
    load_processor,
    parameter_counts,
    set_audio_encoder_frozen,
    suppressed_token_ids,
)
from asr_grpo.models.checkpoint import (
    checkpoint_metadata,
    checkpoint_problem,
    is_complete_checkpoint,
    save_hf_checkpoint,
)
from asr_grpo.models.prompting import (
    IGNORE_INDEX,
    decode_responses,
    encode_requests,
    encode_supervised,
    transcription_prompts,
)
from asr_grpo.models.tokenizer import SPECIAL_TOKENS, train_tokenizer

__all__ = [
    "architecture_config", "audio_encoder", "build_model", "build_processor", "checkpoint_metadata",
    "checkpoint_problem", "decode_responses", "encode_requests", "encode_supervised", "fresh_model",
    "IGNORE_INDEX", "is_complete_checkpoint", "load_model", "load_processor", "parameter_counts",
    "ParameterCounts", "save_hf_checkpoint", "set_audio_encoder_frozen", "SPECIAL_TOKENS",
    "suppressed_token_ids", "train_tokenizer", "transcription_prompts",
]
