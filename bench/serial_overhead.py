"""What Ray, DeepSpeed and the role split cost the serial step: `overlap=none` next to
`bench/bare_loop.py` (the same step in one process), interleaved in one run.

    python bench/serial_overhead.py                      # 2 repeats x 30 measured steps each
    python bench/serial_overhead.py --repeats 3 --steps 30

Writes `<out>/serial_overhead.json`: per repeat the median step of each, and the ratio
of the medians (none / bare)."""
from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--steps", type=int, default=30, help="measured steps per run")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "cpu_2core")
    args = ap.parse_args()
    bare, speedup = load("bare_loop"), load("overlap_speedup")
    import mlflow

    from asr_grpo.recipes.rl import run_rl
    from asr_grpo.tracking import absolute_tracking_uri

    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for rep in range(args.repeats):
        bare_json = args.out / f"bare_loop_r{rep}.json"
        bare.main(["--steps", str(args.steps), "--warmup", str(args.warmup), "--out", str(bare_json)])
        bare_step = json.loads(bare_json.read_text())["summary"]["median_step_s"]
        cfg = speedup.compose_run(["overlap=none", f"trainer.steps={args.steps + args.warmup}", "trainer.eval_every=0",
                                   "trainer.save_every=0", "logger.experiment_name=bench-serial-overhead",
                                   f"trainer.output_dir={REPO}/outputs/bench/serial-overhead"])
        summary = run_rl(cfg, run_name=f"serial-overhead-r{rep}")
        client = mlflow.tracking.MlflowClient(absolute_tracking_uri(cfg.logger.tracking_uri))
        none_step = speedup.median(speedup.measured(client, summary["mlflow_run_id"], args.warmup)["perf/time/step"])
        rows.append({"bare_median_step_s": bare_step, "none_median_step_s": none_step,
                     "ratio": none_step / bare_step, "none_run_id": summary["mlflow_run_id"]})
        print(f"repeat {rep}: bare {bare_step:.2f} s, none {none_step:.2f} s, ratio {none_step / bare_step:.2f}")
    result = {"command": "python bench/serial_overhead.py", "repeats": rows,
              "ratio_median": statistics.median(r["ratio"] for r in rows)}
    (args.out / "serial_overhead.json").write_text(json.dumps(result, indent=1))
    print(f"none / bare (median over repeats): {result['ratio_median']:.2f}")


if __name__ == "__main__":
    main()
