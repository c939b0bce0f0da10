"""Rollout engines behind one chunked interface (decode N tokens, resume later): the
policy's own HF forward (default) or vLLM on GPU machines (`rollout=vllm`)."""
from asr_grpo.rollout.factory import EngineUnavailable, create_vllm_engine, vllm_unavailable_reason
from asr_grpo.rollout.pool import SequencePool
from asr_grpo.rollout.types import (
    ChunkedEngine,
    RolloutRequest,
    SamplingParams,
    SequenceResult,
    SequenceState,
)

# The engines and the sampler run tensors: loaded when first asked for, so what needs only
# the pool and the types (the scheduler, the forecast) loads no model code and no torch.
_LAZY = {"HFChunkedEngine": "asr_grpo.rollout.hf_engine", "VLLMChunkedEngine": "asr_grpo.rollout.vllm_engine",
         **dict.fromkeys(("sample_tokens", "token_seed", "top_p_filter"), "asr_grpo.rollout.sampling")}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["ChunkedEngine", "EngineUnavailable", "HFChunkedEngine", "RolloutRequest", "SamplingParams",
           "SequencePool", "SequenceResult", "SequenceState", "VLLMChunkedEngine", "create_vllm_engine",
           "sample_tokens", "token_seed", "top_p_filter", "vllm_unavailable_reason"]
