"""OPPO speedup benchmark: one workload under overlap=none|intra|inter|oppo, side by side.

    python bench/overlap_speedup.py                      # both workloads, all modes
    python bench/overlap_speedup.py --workloads paper --steps 12

Each mode is a real `run_rl` (Ray, DeepSpeed, MLflow) from the same SFT checkpoint with
the same seed, batch, samples and max new tokens; the numbers are read back from the
MLflow runs. Writes `<out>/overlap_speedup.json` and `.md`: median step latency, time
to the target reward, CER before/after, utilization per role, staleness, the serial
run's phase split, the ideal step (no tail, scoring fully hidden) and the efficiency.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from asr_grpo.tracking.runs import smoothed, summarize, time_to

REPO = Path(__file__).resolve().parents[1]
MODES = ("none", "intra", "inter", "oppo")

# The embedded default, and PPO workloads aiming at the regime of the OPPO paper: a
# critic, the LM reward model on, room for long tails. All keep the default corpus,
# model and SFT checkpoint.
WORKLOADS = {
    # One KV batch holds the whole overcommitted buffer ((B + Δmax) x n = 96 sequences),
    # as it holds the serial batch (64): the same memory knob for every mode.
    "default": ["trainer.rollout_batch_size=128", "overlap.chunk_size=16", "overlap.chunk_candidates=[8,16,32]"],
    "paper": ["algorithm=ppo", "reward=asr_lm", "algorithm.n_samples_per_prompt=1",
              "trainer.prompts_per_step=32", "algorithm.max_new_tokens=160", "trainer.train_epochs=2",
              "overlap.chunk_size=16", "overlap.chunk_candidates=[8,16,32]", "overlap.delta_init=8",
              "overlap.delta_max=16", "overlap.delta_inc=2", "overlap.delta_dec=2", "overlap.delta_window=3"],
    # The paper's regime by its own levers: exploration-heavy sampling (temperature 1.3)
    # gives run-on transcripts up to a long max, one PPO epoch (OpenRLHF's default).
    "longtail": ["algorithm=ppo", "reward=asr_lm", "algorithm.n_samples_per_prompt=1",
                 "trainer.prompts_per_step=32", "algorithm.max_new_tokens=192", "algorithm.temperature=1.3",
                 "trainer.train_epochs=1", "overlap.chunk_size=16", "overlap.chunk_candidates=[8,16,32]",
                 "overlap.delta_init=8", "overlap.delta_max=16", "overlap.delta_inc=2", "overlap.delta_dec=2",
                 "overlap.delta_window=3"],
}


def compose_run(overrides: list[str]):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from asr_grpo.config import register_configs
    from asr_grpo.config.store import CONF_DIR

    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose("config", overrides=overrides)


def ideal_step(serial: dict) -> float:
    """The serial step without its tail and with scoring fully hidden: decoding costs
    what the mean-length sequence needs (not the longest), then training and sync."""
    ph, lengths = serial["phases_s"], serial["response_length"]
    tail_free = ph["rollout"] * lengths.get("", 1.0) / max(1.0, lengths.get("_max", 1.0))
    return tail_free + ph["training"] + ph.get("sync", 0.0)


def report(workload: str, runs: dict[str, dict], window: int, overrides: list[str] | None = None) -> dict:
    serial = runs["none"]
    step = serial["mean_step_s"]
    ph = serial["phases_s"]
    split = {"rollout": ph["rollout"] / step, "scoring+reward": ph["scoring_wall"] / step,
             "training": ph["training"] / step, "sync": ph.get("sync", 0.0) / step}
    split["other"] = max(0.0, 1.0 - sum(split.values()))
    target = 0.98 * smoothed(serial["reward"], window)[-1]   # the serial run's last smoothed reward
    ideal = ideal_step(serial)
    rows = {}
    for mode, run in runs.items():
        ttt = time_to(target, run, window)
        rows[mode] = {
            "median_step_s": run["median_step_s"],
            "step_speedup": serial["median_step_s"] / run["median_step_s"],
            "time_to_target_s": ttt,
            "total_wall_s": run["wall_clock_s"][-1],
            "wall_speedup": serial["wall_clock_s"][-1] / run["wall_clock_s"][-1],
            "ttt_speedup": time_to(target, serial, window) / ttt if ttt not in (0, float("inf")) else float("nan"),
            "cer_before": run["cer_before"], "cer_after": run["cer_after"],
            "final_reward": run["final_reward"],
            "overlap_efficiency": ideal / run["median_step_s"],
            "util": run["util"], "idle_s": run.get("idle_s", {}), "staleness_counts": run["staleness_counts"],
        }
    return {"workload": workload, "overrides": WORKLOADS[workload] if overrides is None else overrides,
            "steps": serial["steps"], "serial_phase_split": split,
            "serial_rollout_plus_scoring": split["rollout"] + split["scoring+reward"],
            "target_reward": target, "ideal_step_s": ideal,
            "response_length": serial["response_length"], "modes": rows, "runs": runs}


def markdown(results: list[dict]) -> str:
    out = []
    for r in results:
        split = ", ".join(f"{k} {100 * v:.0f}%" for k, v in r["serial_phase_split"].items())
        lengths = ", ".join(f"{k or 'mean'} {v:.0f}" for k, v in r["response_length"].items())
        out += [f"### Workload `{r['workload']}` ({r['steps']} steps per mode)", "",
                f"Overrides: `{' '.join(r['overrides']) or '(defaults)'}`", "",
                f"Serial phase split: {split} (rollout + scoring = "
                f"{100 * r['serial_rollout_plus_scoring']:.0f}%). Response lengths (tokens): {lengths}. "
                f"Ideal step (no tail, scoring hidden): {r['ideal_step_s']:.2f} s. "
                f"Target reward (98% of the serial run's final): {r['target_reward']:.3f}.", "",
                "| mode | median step (s) | step speedup | wall for all steps (s) | time to target (s) | speedup "
                "| CER before -> after | final reward | efficiency | actor idle (s/step) "
                "| util actor / ref / critic / reward_model | stale samples |",
                "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for mode, m in r["modes"].items():
            u = m["util"]
            util = " / ".join(f"{u[k]:.2f}" if k in u else "-" for k in ("actor", "ref", "critic", "reward_model"))
            stale = sum(v for k, v in m["staleness_counts"].items() if k != "0")
            total = sum(m["staleness_counts"].values())
            out.append(f"| {mode} | {m['median_step_s']:.2f} | {m['step_speedup']:.2f}x | "
                       f"{m['total_wall_s']:.0f} | {m['time_to_target_s']:.0f} | {m['ttt_speedup']:.2f}x | "
                       f"{m['cer_before']:.3f} -> {m['cer_after']:.3f} | {m['final_reward']:.3f} | "
                       f"{m['overlap_efficiency']:.2f} | {m['idle_s'].get('actor', float('nan')):.2f} | {util} | "
                       f"{stale:.0f}/{total:.0f} |")
        out.append("")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--window", type=int, default=3, help="steps in the reward smoothing window")
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))
    ap.add_argument("--output-root", default=str(REPO / "outputs"),
                    help="paths.output_root: where the corpus, SFT checkpoint and MLflow store live")
    ap.add_argument("--from-json", help="re-render the report from an earlier run's JSON (no training)")
    ap.add_argument("overrides", nargs="*", help="extra Hydra overrides for every run")
    args = ap.parse_args()
    if args.from_json:
        old = json.loads(Path(args.from_json).read_text())
        print(markdown([report(r["workload"], r["runs"], args.window, r["overrides"]) for r in old]))
        return
    if "none" not in args.modes:
        sys.exit("the serial baseline (overlap=none) is what every speedup is measured against")

    import mlflow

    from asr_grpo.recipes.rl import run_rl
    from asr_grpo.tracking import absolute_tracking_uri

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    results = []
    for workload in args.workloads:
        runs = {}
        for mode in args.modes:
            # Value overrides apply after the group files, so the workload's overlap.*
            # knobs hold whichever overlap mode is selected.
            overrides = [f"paths.output_root={args.output_root}", f"overlap={mode}", *WORKLOADS[workload],
                         f"trainer.steps={args.steps}", f"trainer.eval_every={args.steps}",
                         "trainer.save_every=0", f"trainer.output_dir={args.output_root}/bench/{workload}-{mode}",
                         "logger.experiment_name=bench-overlap", *args.overrides]
            cfg = compose_run(overrides)
            print(f"== {workload} / overlap={mode}", flush=True)
            summary = run_rl(cfg, run_name=f"bench-{stamp}-{workload}-{mode}")
            client = mlflow.tracking.MlflowClient(absolute_tracking_uri(cfg.logger.tracking_uri))
            runs[mode] = summarize(client, summary["mlflow_run_id"], args.window)
            print(f"   median step {runs[mode]['median_step_s']:.2f} s", flush=True)
        results.append(report(workload, runs, args.window))
        (out / "overlap_speedup.json").write_text(json.dumps(results, indent=1))
        (out / "overlap_speedup.md").write_text(markdown(results))
    print(markdown(results))


if __name__ == "__main__":
    main()
