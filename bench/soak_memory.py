"""Soak benchmark: many RL steps with overcommit pinned at Δ_max, memory measured after
every step, to show that nothing leaks (KV caches of the rollout engine and the
streaming scorers, carried sequences, driver-side buffers).

    python bench/soak_memory.py                 # the embedded default (corpus + SFT under outputs/)
    python bench/soak_memory.py --fast          # debug=fast in a temporary folder (minutes)
    python bench/soak_memory.py --steps 80 --delta-max 8

Per step, in the driver and in every actor process, after a garbage collection and
`malloc_trim` (so memory the allocator merely keeps cached does not count): the resident
memory (RSS), the Python objects alive and the tensors alive (count and bytes); and
what the processes hold: sequences live in the rollout engine and its KV batches,
sequences registered in and KV cohorts held by each streaming scorer, groups and
partial sequences in the scheduler's buffer. Slope = least-squares change per step over
the steps after warm-up (the first quarter). Writes `<out>/soak_memory.{json,md}`.
"""
from __future__ import annotations

import argparse
import ctypes
import gc
import json
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import psutil

from portable import portable

REPO = Path(__file__).resolve().parents[1]
# PPO with the LM reward model: every streaming scorer (reference, critic, text LM) in play.
WORKLOAD = ["algorithm=ppo", "reward=asr_lm", "overlap=oppo", "trainer.eval_every=0", "trainer.save_every=0"]


def held_by_host(actor) -> dict:
    """Inside a rollout host: what its engine holds."""
    engine = actor.engine
    running = getattr(engine, "_running", None) or []
    return {"live_sequences": len(engine.live()), "kv_batches": len(running),
            "kv_rows": sum(len(run.rows) for run in running)}


def held_by_scorer(actor) -> dict:
    """Inside a streaming scorer role: sequences registered, and the KV cohorts held."""
    scorer = actor.scorer
    return {"registered": len(scorer._prompts), "cached_sequences": len(scorer._cohort_of),
            "kv_cohorts": len({id(c) for c in scorer._cohort_of.values()})}


def settle(_actor=None) -> dict:
    """In a process: collect garbage, hand cached heap back to the OS, count what is alive."""
    import torch

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:   # not glibc: RSS then includes the allocator's cache
        pass
    with warnings.catch_warnings():   # isinstance() on every object touches deprecated torch aliases
        warnings.simplefilter("ignore")
        tensors = [o for o in gc.get_objects() if isinstance(o, torch.Tensor)]
    return {"rss_mb": psutil.Process().memory_info().rss / 2**20, "objects": len(gc.get_objects()),
            "tensors": len(tensors),
            "tensor_mb": sum(t.numel() * t.element_size() for t in tensors if not t.is_meta) / 2**20}


def sample(recipe) -> dict:
    """Memory and holdings of every process of the run, now."""
    import ray

    out = {"alive": {"driver": settle()}, "held": {}}
    for g in recipe.groups:
        for rank, h in enumerate(g.handles):
            out["alive"][f"{g.role}.{rank}"] = ray.get(h.__ray_call__.remote(settle))
    out["rss_mb"] = {name: a["rss_mb"] for name, a in out["alive"].items()}
    hosts = recipe.scheduler.hosts
    for rank, h in enumerate(hosts.handles):
        out["held"][f"{hosts.role}.{rank}"] = ray.get(h.__ray_call__.remote(held_by_host))
    for name, g in recipe.scheduler.scorers.items():
        for rank, h in enumerate(g.handles):
            out["held"][f"{name}.{rank}"] = ray.get(h.__ray_call__.remote(held_by_scorer))
    buffer = recipe.scheduler.buffer
    out["held"]["scheduler"] = {
        "buffer_groups": len(buffer),
        "partial_sequences": sum(1 for e in buffer for s in e.samples.values() if s.tokens and not s.done)}
    out["rss_mb"]["total"] = sum(out["rss_mb"].values())
    return out


def slope(values: list[float]) -> float:
    """Least-squares slope per step (0 for fewer than 2 points)."""
    if len(values) < 2:
        return 0.0
    return float(np.polyfit(np.arange(len(values)), np.asarray(values, dtype=float), 1)[0])


def soak(overrides: list[str], steps: int) -> dict:
    sys.path.insert(0, str(REPO / "bench"))
    from asr_grpo.recipes.rl import RLRecipe
    from overlap_speedup import compose_run

    cfg = compose_run(overrides)
    recipe = RLRecipe(cfg, run_name="soak")
    samples, step_s = [], []
    try:
        recipe.setup()
        samples.append(sample(recipe))
        for step in range(steps):
            t0 = time.monotonic()
            metrics = recipe.train_step(step)
            step_s.append(time.monotonic() - t0)
            samples.append({**sample(recipe), "carried_groups": metrics["overlap/carried_groups"],
                            "delta": metrics["overlap/delta"]})
            print(f"step {step + 1}/{steps}: {samples[-1]['rss_mb']['total']:.0f} MB total, "
                  f"{samples[-1]['held']['scheduler']}", flush=True)
    finally:
        recipe.cleanup()
    return {"samples": samples, "step_s": step_s}


def summarize(run: dict, overrides: list[str]) -> dict:
    samples = run["samples"][1:]                 # after each step
    warm = max(1, len(samples) // 4)
    steady = samples[warm:]
    processes = list(samples[0]["rss_mb"])
    per_process = {p: {"start_mb": samples[0]["rss_mb"][p], "end_mb": samples[-1]["rss_mb"][p],
                       "slope_mb_per_step": slope([s["rss_mb"][p] for s in steady])} for p in processes}
    for p, row in per_process.items():
        if p in samples[0]["alive"]:
            for k in ("objects", "tensors", "tensor_mb"):
                row[f"{k}_end"] = samples[-1]["alive"][p][k]
                row[f"{k}_slope"] = slope([s["alive"][p][k] for s in steady])
    held_max = {}
    for s in samples:
        for who, counts in s["held"].items():
            for k, v in counts.items():
                held_max.setdefault(who, {}).setdefault(k, 0)
                held_max[who][k] = max(held_max[who][k], v)
    held_end = samples[-1]["held"]
    return {"overrides": overrides, "steps": len(samples), "warmup_steps": warm,
            "median_step_s": float(np.median(run["step_s"])),
            "delta": samples[-1].get("delta"), "total_slope_mb_per_step": per_process["total"]["slope_mb_per_step"],
            "per_process": per_process, "held_max": held_max, "held_end": held_end,
            "carried_groups": [s.get("carried_groups") for s in samples]}


def markdown(result: dict) -> str:
    lines = [f"# Soak: {result['steps']} steps with overcommit pinned at Δ_max = {result['delta']:.0f}", "",
             f"Overrides: `{' '.join(result['overrides'])}`", "",
             f"Median step {result['median_step_s']:.2f} s. Memory slope over the steps after warm-up "
             f"(the first {result['warmup_steps']}): **{result['total_slope_mb_per_step']:+.2f} MB/step** "
             f"for all processes together.", "",
             "| process | RSS after step 1 (MB) | RSS at the end (MB) | RSS slope (MB/step) | tensors alive "
             "(end) | tensor MB (end) | tensor MB slope | Python objects (end) | objects slope |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, p in result["per_process"].items():
        alive = (f"{p['tensors_end']} | {p['tensor_mb_end']:.1f} | {p['tensor_mb_slope']:+.4f} | {p['objects_end']} | "
                 f"{p['objects_slope']:+.1f}" if "tensors_end" in p else " | | | | ")
        lines.append(f"| {name} | {p['start_mb']:.0f} | {p['end_mb']:.0f} | {p['slope_mb_per_step']:+.3f} | {alive} |")
    lines += ["", "What the processes hold (largest over the run / at the end):", "",
              "| who | held | max | end |", "|---|---|---|---|"]
    for who, counts in result["held_max"].items():
        for k, v in counts.items():
            lines.append(f"| {who} | {k} | {v} | {result['held_end'][who][k]} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--delta-max", type=int, default=4)
    ap.add_argument("--fast", action="store_true", help="debug=fast in a temporary folder")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "cpu_2core_soak_memory"))
    ap.add_argument("overrides", nargs="*", help="extra Hydra overrides")
    args = ap.parse_args()
    d = args.delta_max
    overrides = [*WORKLOAD, f"trainer.steps={args.steps}", f"overlap.delta_init={d}", f"overlap.delta_min={d}",
                 f"overlap.delta_max={d}"]
    if args.fast:
        overrides = ["debug=fast", f"paths.output_root={tempfile.mkdtemp(prefix='soak-')}", *overrides]
    overrides += args.overrides
    result = summarize(soak(overrides, args.steps), [portable(o) for o in overrides])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "soak_memory.json").write_text(json.dumps(result, indent=2))
    (out / "soak_memory.md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
