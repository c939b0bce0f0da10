"""Rollout engines behind one chunked interface (decode N tokens, resume later)."""
from asr_grpo.rollout.hf_engine import HFChunkedEngine
from asr_grpo.rollout.sampling import sample_tokens, token_seed, top_p_filter
from asr_grpo.rollout.types import ChunkedEngine, RolloutRequest, SamplingParams, SequenceResult, SequenceState

__all__ = ["ChunkedEngine", "HFChunkedEngine", "RolloutRequest", "SamplingParams", "SequenceResult", "SequenceState",
           "sample_tokens", "token_seed", "top_p_filter"]
