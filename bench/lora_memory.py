"""LoRA against full fine-tuning at a real size: peak memory and step time.

    python bench/lora_memory.py                              # 0.6B, SFT: full vs LoRA rank 8
    python bench/lora_memory.py --phases sft,grpo --rl-steps 3
    python bench/lora_memory.py --model qwen3_asr_1p7b --rank 16 --out bench/results/<machine>_lora_1p7b

`model=<size> model.init=random` builds the published shapes with fresh weights (no
download) on the `debug=fast` corpus, in a temporary folder. Each (phase, mode) runs in a
process of its own, so one's memory never counts for the other; the parent samples the
resident memory (RSS) of that process and all its descendants (for GRPO: Ray and every
role's actor) every 0.2 s and keeps the peak. `sft`: `SFTRecipe` steps, timed one by one
(the first, with its allocations, reported apart). `grpo`: `run_rl` colocated
(`overlap=none`, 2 prompts x 2 samples), the step's own `perf/time/*`; full fine-tuning
starts a reference role with its own copy of the base, LoRA computes the reference in the
policy. A mode that runs out of its time limit is recorded as such.

Writes `<out>/lora_memory.json`, labelled with the CPU (lscpu's model name), core count
and commit; paths are never written (`portable`).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

from portable import code_commit, cpu_name, portable

REPO = Path(__file__).resolve().parents[1]
MODES = {"full": 0}   # mode -> model.lora.rank (LoRA's rank comes from --rank)


def tree_rss(pid: int) -> int:
    """Resident bytes of a process and all its descendants (0 once it is gone)."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


def run_child(args: argparse.Namespace, phase: str, rank: int, root: str) -> dict:
    """One (phase, mode) in its own process, its process tree's RSS sampled until it ends."""
    cmd = [sys.executable, __file__, "--child", phase, "--child-rank", str(rank), "--root", root,
           "--model", args.model, "--steps", str(args.steps), "--rl-steps", str(args.rl_steps),
           "--batch", str(args.batch), "--phases", args.phases, "--dtype", args.dtype]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=REPO)
    peak, done = [0], threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], tree_rss(proc.pid))
            done.wait(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        out, _ = proc.communicate(timeout=args.timeout)
        error = None if proc.returncode == 0 else f"exit status {proc.returncode}"
    except subprocess.TimeoutExpired:
        for child in psutil.Process(proc.pid).children(recursive=True):
            child.kill()
        proc.kill()
        out, error = proc.communicate()[0], f"timed out after {args.timeout:.0f} s"
    done.set()
    sampler.join()
    # The last line a child printed: its result, or (out of time) the steps it had done.
    lines = [line for line in out.splitlines() if line.startswith("{")]
    result = json.loads(lines[-1]) if lines else {}
    if error is not None:
        result["error"] = error
    return {**result, "peak_rss_gb": round(peak[0] / 2**30, 2), "wall_s": round(time.monotonic() - t0, 1)}


# ---------------------------------------------------------------------- children --
def compose(config: str, overrides: list[str]):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from asr_grpo.config import register_configs
    from asr_grpo.config.store import CONF_DIR

    register_configs()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return hydra_compose(config, overrides=overrides)


def common(args, rank: int) -> list[str]:
    return [f"model={args.model}", "model.init=random", "debug=fast", f"paths.output_root={args.root}",
            f"model.lora.rank={rank}", f"model.dtype={args.dtype}", "logger.log_system_metrics=false"]


class StepClock:
    """Stands in for the MLflow run `SFTRecipe.train` logs to: the time of every step,
    printed as it comes, so a mode that runs out of time still reports its steps."""

    def __init__(self, known: dict):
        self.times, self.known = [time.monotonic()], known

    def log_metrics(self, metrics: dict, step: int) -> None:
        self.times.append(time.monotonic())
        print(json.dumps({**self.known, **self.summary()}), flush=True)

    def summary(self) -> dict:
        steps = [b - a for a, b in zip(self.times, self.times[1:])]
        later = steps[1:] or steps   # the first step allocates gradients and optimizer state
        return {"first_step_s": round(steps[0], 2), "median_step_s": round(statistics.median(later), 2),
                "step_s": [round(s, 2) for s in steps]}


def child_prepare(args, rank: int) -> dict:
    """The corpus and, for GRPO, the fresh weights, built once before any timed mode."""
    from asr_grpo.data import resolve_manifests
    from asr_grpo.recipes.start_checkpoint import build_fresh_weights

    cfg = compose("config", common(args, 0))
    resolve_manifests(cfg.data, cfg.paths.output_root)
    if "grpo" in args.phases:
        build_fresh_weights(cfg)
    return {}


def child_sft(args, rank: int) -> dict:
    import torch

    from asr_grpo.recipes.sft import SFTRecipe

    cfg = compose("sft", common(args, rank) + [
        f"sft.max_steps={args.steps}", "sft.ctc_warmup_steps=0", f"sft.batch_size={args.batch}",
        "sft.eval_every_steps=0", f"sft.output_dir={args.root}/sft-{rank}"])
    t0 = time.monotonic()
    recipe = SFTRecipe(cfg)
    recipe.setup()
    known = {"setup_s": round(time.monotonic() - t0, 1), "params_total": recipe.counts.total,
             "params_trainable": recipe.counts.trainable, "torch_threads": torch.get_num_threads()}
    clock = StepClock(known)
    recipe.train(clock)
    return {**known, **clock.summary()}


def child_grpo(args, rank: int) -> dict:
    from asr_grpo.recipes.rl import run_rl

    cfg = compose("config", common(args, rank) + [
        f"trainer.steps={args.rl_steps}", "trainer.eval_every=0", "trainer.save_every=0", "overlap=none",
        f"trainer.output_dir={args.root}/rl-{rank}"])
    keys = ("step", "rollout", "scoring", "training", "sync")
    per_step: list[dict] = []

    def report() -> dict:
        later = per_step[1:] or per_step
        return {"first_step_s": per_step[0]["step"], "median_step_s": statistics.median(s["step"] for s in later),
                "steps": per_step, "reference_role": rank == 0}

    def on_step(trained) -> None:   # printed as it comes: a mode out of time keeps its steps
        per_step.append({k: round(trained.metrics.get(f"perf/time/{k}", float("nan")), 2) for k in keys})
        print(json.dumps(report()), flush=True)

    summary = run_rl(cfg, step_callbacks=[on_step])
    return {**report(), "train_seconds": round(summary["train_seconds"], 1)}


# ---------------------------------------------------------------------- report --
def machine() -> dict:
    return {"cpu": cpu_name(), "cores": psutil.cpu_count(), "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
            "commit": code_commit()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen3_asr_0p6b")
    ap.add_argument("--rank", type=int, default=8, help="LoRA rank of the lora mode")
    ap.add_argument("--phases", default="sft", help="comma-separated: sft, grpo")
    ap.add_argument("--steps", type=int, default=4, help="SFT steps per mode")
    ap.add_argument("--rl-steps", type=int, default=3, help="GRPO steps per mode")
    ap.add_argument("--batch", type=int, default=2, help="SFT utterances per step")
    ap.add_argument("--dtype", default="float32",
                    help="model.dtype (SFT trains in it: its features are float32, so bfloat16 fails in the encoder)")
    ap.add_argument("--timeout", type=float, default=280.0, help="seconds per (phase, mode)")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "cpu_2core_lora"))
    ap.add_argument("--root", default="", help="output_root for corpus and weights (default: a temporary folder)")
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)
    ap.add_argument("--child-rank", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        jobs = {"prepare": child_prepare, "sft": child_sft, "grpo": child_grpo}
        print(json.dumps(jobs[args.child](args, args.child_rank)), flush=True)
        return
    modes = {**MODES, f"lora_r{args.rank}": args.rank}
    with tempfile.TemporaryDirectory() as tmp:
        root = args.root or tmp
        prepared = run_child(args, "prepare", 0, root)
        if "error" in prepared:
            sys.exit(f"preparing the corpus and weights failed: {prepared['error']}")
        results = {phase: {mode: run_child(args, phase, rank, root) for mode, rank in modes.items()}
                   for phase in args.phases.split(",")}
    result = {"machine": machine(), "model": args.model, "dtype": args.dtype, "lora_rank": args.rank,
              "sft_steps": args.steps,
              "sft_batch": args.batch, "rl_steps": args.rl_steps,
              "command": portable(" ".join([Path(sys.argv[0]).name, *sys.argv[1:]])), "results": results}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "lora_memory.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
