"""The speech LLM: Qwen3-ASR built from config or loaded from an HF folder."""
from asr_grpo.models.builder import (
    ParameterCounts,
    audio_encoder,
    build_model,
    build_processor,
    load_model,
    load_processor,
    parameter_counts,
    set_audio_encoder_frozen,
    suppressed_token_ids,
    tiny_config,
)
from asr_grpo.models.checkpoint import checkpoint_metadata, is_complete_checkpoint, save_hf_checkpoint
from asr_grpo.models.prompting import (
    IGNORE_INDEX,
    decode_responses,
    encode_requests,
    encode_supervised,
    transcription_prompts,
)
from asr_grpo.models.tokenizer import SPECIAL_TOKENS, train_tokenizer

__all__ = [
    "IGNORE_INDEX", "ParameterCounts", "SPECIAL_TOKENS", "audio_encoder", "build_model", "build_processor",
    "checkpoint_metadata", "decode_responses", "encode_requests", "encode_supervised",
    "is_complete_checkpoint", "load_model", "load_processor", "parameter_counts", "save_hf_checkpoint",
    "set_audio_encoder_frozen", "suppressed_token_ids", "tiny_config", "train_tokenizer", "transcription_prompts",
]
