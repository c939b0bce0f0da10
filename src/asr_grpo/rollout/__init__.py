"""Rollout engines behind one chunked interface (decode N tokens, resume later): the
policy's own HF forward (default) or vLLM on GPU machines (`rollout=vllm`)."""
from asr_grpo.config.engines import ENGINES, engine_unavailable_reason
from asr_grpo.rollout.factory import EngineUnavailable, create_vllm_engine
from asr_grpo.rollout.hf_engine import HFChunkedEngine
from asr_grpo.rollout.pool import SequencePool
from asr_grpo.rollout.sampling import sample_tokens, token_seed, top_p_filter
from asr_grpo.rollout.types import ChunkedEngine, RolloutRequest, SamplingParams, SequenceResult, SequenceState
from asr_grpo.rollout.vllm_engine import VLLMChunkedEngine

__all__ = ["ChunkedEngine", "ENGINES", "EngineUnavailable", "HFChunkedEngine", "RolloutRequest", "SamplingParams",
           "SequencePool", "SequenceResult", "SequenceState", "VLLMChunkedEngine", "create_vllm_engine",
           "engine_unavailable_reason", "sample_tokens", "token_seed", "top_p_filter"]
