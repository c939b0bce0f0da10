"""bench/gpu_vllm.py's runs compose: every override names a real key (a typo would only
show on the GPU day), the vLLM run checks the weight sync after every update at the
script's tolerance, and the HF baseline differs from it in the engine alone."""
from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def load_gpu_vllm():
    sys.path.insert(0, str(BENCH))   # the script imports overlap_speedup beside it
    spec = importlib.util.spec_from_file_location("gpu_vllm", BENCH / "gpu_vllm.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_both_runs_compose_and_differ_only_in_the_engine(tmp_path):
    gpu_vllm = load_gpu_vllm()
    from overlap_speedup import compose_run

    args = argparse.Namespace(root=str(tmp_path), separate=False, steps=3, max_new_tokens=128, lr=1e-3, tol=2e-3,
                              override=[])
    vllm, hf = compose_run(gpu_vllm.overrides(args, "vllm")), compose_run(gpu_vllm.overrides(args, "hf"))
    assert vllm.rollout.engine == "vllm" and hf.rollout.engine == "hf"
    assert vllm.rollout.sync_check_every == 1 and vllm.rollout.sync_check_tol == 2e-3
    assert vllm.overlap.mode == hf.overlap.mode == "oppo"
    assert vllm.placement.actor_gpus + vllm.placement.ref_gpus + vllm.placement.rollout_gpus <= 1.0
    separate = compose_run(gpu_vllm.overrides(argparse.Namespace(**{**vars(args), "separate": True}), "vllm"))
    assert separate.placement.colocate is False and separate.placement.gpus_per_node == 3
