"""torch threads per phase: the serial step (overlap=none) with every rank pinned to one
thread (`trainer.num_threads=1`, the old default) against `auto` (workers/base.py: a rank
computing alone takes the node's cores, ranks computing side by side split them), with
OpenMP's default spin-wait and with OMP_WAIT_POLICY=PASSIVE in the actors.

    python bench/thread_phases.py                          # 20 steps, 2 runs of each, interleaved
    python bench/thread_phases.py --steps 20 --repeats 3 --settings 1 auto+passive

Same SFT checkpoint, seed and batch for every run; runs alternate (1, auto, auto+passive,
1, ...) so load from other jobs on the box falls on each, and each run records how many
cores other jobs kept busy meanwhile. Per run: the median over the steps
after the first `--drop` of perf/time/{step,rollout,scoring_wall,training,sync}, read
back from MLflow. Writes `<out>/thread_phases.json`. Reads the corpus and checkpoint
under --output-root and writes only under --scratch (checkpoints, MLflow store).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PHASES = ("step", "rollout", "scoring_wall", "training", "sync")
# name -> (trainer.num_threads, env of the Ray workers). libgomp reads OMP_WAIT_POLICY when
# torch loads, so it reaches the actors only through their environment: a local Ray start
# inherits the driver's. Its default spin-waits, which a thread team on a shared box pays
# for dearly (a spinning thread holds the core its preempted partner needs).
# GOMP_SPINCOUNT (libgomp's, which torch's Linux wheels ship) spins briefly, then sleeps.
SETTINGS = {"1": ("1", {}), "auto": ("auto", {}), "auto+passive": ("auto", {"OMP_WAIT_POLICY": "PASSIVE"}),
            "auto+spin10k": ("auto", {"GOMP_SPINCOUNT": "10000"})}


def compose_run(overrides: list[str]):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from asr_grpo.config import register_configs
    from asr_grpo.config.store import CONF_DIR

    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose("config", overrides=overrides)


@contextlib.contextmanager
def environ(env: dict):
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run_once(setting: str, args, tag: str) -> dict:
    """One overlap=none run; the per-step phase times after the first `args.drop` steps."""
    import mlflow

    from asr_grpo.models import is_complete_checkpoint
    from asr_grpo.recipes.rl import run_rl
    from asr_grpo.tracking import absolute_tracking_uri
    from asr_grpo.tracking.runs import history

    scratch = Path(args.scratch)
    threads, env = SETTINGS[setting]
    cfg = compose_run([f"paths.output_root={args.output_root}", "overlap=none", f"trainer.num_threads={threads}",
                       f"trainer.steps={args.steps}", "trainer.eval_every=0", "trainer.save_every=0",
                       "trainer.eval_max_utterances=4", f"trainer.output_dir={scratch}/ckpt/{tag}",
                       f"logger.tracking_uri=sqlite:///{scratch}/mlflow.db", "logger.experiment_name=bench-threads",
                       *args.overrides])
    if not is_complete_checkpoint(cfg.model.path):   # run_rl would train one, writing under output_root
        sys.exit(f"no complete SFT checkpoint at {cfg.model.path}: run SFT first")
    with ForeignLoad() as foreign, environ(env):
        summary = run_rl(cfg, run_name=f"threads-{tag}")
    client = mlflow.tracking.MlflowClient(absolute_tracking_uri(cfg.logger.tracking_uri))

    def kept(key: str) -> list[float]:
        return [v for s, v in sorted(history(client, summary["mlflow_run_id"], key).items()) if s > args.drop]

    out = {"setting": setting, "threads": threads, "env": env, "run_id": summary["mlflow_run_id"],
           "steps_kept": len(kept("perf/time/step"))}
    out.update({f"{p}_s": statistics.median(kept(f"perf/time/{p}")) for p in PHASES})
    out["step_s_all"] = kept("perf/time/step")
    out["response_length"] = statistics.mean(kept("charts/response_length"))
    out["reward"] = statistics.mean(kept("reward/total"))
    out["foreign_cores"] = foreign.cores
    return out


class ForeignLoad:
    """Cores kept busy by processes outside this one's tree while a run lasts (other jobs
    on a shared box), sampled from /proc: the noise under each run's step times. Ray's
    workers run at nice 15, so a foreign process at nice 0 takes a core from them."""

    def __init__(self, period_s: float = 1.0):
        self.period_s, self.seen, self.busy_s = period_s, {}, 0.0
        self.stop, self.t0 = threading.Event(), time.monotonic()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()
        self.cores = self.busy_s / max(1e-9, time.monotonic() - self.t0)

    def _loop(self) -> None:
        tick = os.sysconf("SC_CLK_TCK")
        while not self.stop.wait(self.period_s):
            procs = _procs()
            mine = _tree(os.getpid(), procs)
            for pid, (_, cpu) in procs.items():
                if pid not in mine:
                    self.busy_s += (cpu - self.seen.get(pid, cpu)) / tick
                    self.seen[pid] = cpu


def _procs() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, user + system ticks)."""
    out = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                f = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            out[int(name)] = (int(f[1]), int(f[11]) + int(f[12]))
    return out


def _tree(root: int, procs: dict) -> set[int]:
    kids: dict[int, list[int]] = {}
    for pid, (ppid, _) in procs.items():
        kids.setdefault(ppid, []).append(pid)
    out, todo = set(), [root]
    while todo:
        pid = todo.pop()
        out.add(pid)
        todo += kids.get(pid, [])
    return out


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "runs": values}


def summarize(runs: list[dict]) -> dict:
    """Per setting: each phase's per-run medians, as median / min / max over the runs."""
    return {t: {f"{p}_s": spread([r[f"{p}_s"] for r in runs if r["setting"] == t]) for p in PHASES}
            | {k: spread([r[k] for r in runs if r["setting"] == t]) for k in ("response_length", "foreign_cores")}
            for t in SETTINGS if any(r["setting"] == t for r in runs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--drop", type=int, default=3, help="first steps left out (warm-up)")
    ap.add_argument("--repeats", type=int, default=2, help="runs of each setting, interleaved")
    ap.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    ap.add_argument("--output-root", default=str(REPO / "outputs"), help="where the corpus and SFT checkpoint are")
    ap.add_argument("--scratch", default="/tmp/thread_phases", help="where the runs write")
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))
    ap.add_argument("overrides", nargs="*", help="extra Hydra overrides for every run")
    args = ap.parse_args()

    stamp = time.strftime("%Y%m%d-%H%M%S")
    runs = []
    for i in range(args.repeats):
        for setting in args.settings:
            print(f"== run {i + 1}/{args.repeats}: {setting}", flush=True)
            runs.append(run_once(setting, args, f"{stamp}-{i}-{setting}"))
            print("   " + ", ".join(f"{p} {runs[-1][f'{p}_s']:.2f} s" for p in PHASES)
                  + f"; other jobs kept {runs[-1]['foreign_cores']:.2f} cores busy", flush=True)
    result = {"what": "overlap=none step phases (median over steps after the first --drop) per torch-thread setting",
              "steps": args.steps, "drop": args.drop, "repeats": args.repeats, "overrides": args.overrides,
              "summary": summarize(runs), "runs": runs}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "thread_phases.json").write_text(json.dumps(result, indent=1))
    for t, s in result["summary"].items():
        print(f"{t}: " + ", ".join(
            f"{p} {s[f'{p}_s']['median']:.2f} s [{s[f'{p}_s']['min']:.2f}-{s[f'{p}_s']['max']:.2f}]" for p in PHASES))


if __name__ == "__main__":
    main()
