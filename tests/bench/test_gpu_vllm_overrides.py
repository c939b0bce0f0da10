"""bench/gpu_vllm.py's runs compose: every override names a real key (a typo would only
show on the GPU day), the vLLM run checks the weight sync after every update at the
script's tolerance, and the HF baseline differs from it in the engine alone."""
from __future__ import annotations

import argparse

from helpers import load_bench_script


def load_gpu_vllm():
    return load_bench_script("gpu_vllm")   # it imports overlap_speedup beside it


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
