"""OPPO speedup benchmark: overlap=none|intra|inter|oppo on one workload, side by side.

    python bench/overlap_speedup.py                                  # every workload, 3 repeats x 33 steps
    python bench/overlap_speedup.py --workloads default --repeats 3 --steps 33 --warmup 3
    python bench/overlap_speedup.py --from-json bench/results/cpu_2core/overlap_speedup.json   # re-render
    python bench/overlap_speedup.py --from-json X/overlap_speedup.json --write   # ... into X/overlap_speedup.md

Each run is a real `run_rl` (Ray, DeepSpeed, MLflow) from the same SFT checkpoint with the
same seed, batch, samples and max new tokens; figures are read back from the MLflow runs.
The modes are interleaved (repeat r runs every mode, in an order drawn at random per
repeat from `--order-seed`, recorded in the JSON) so that drift of the machine falls on
all modes alike and no mode always follows the same one; the first `--warmup` steps of
every run are dropped. Per mode: the median step over each run's measured steps, then
the median and the range of those over the repeats (the run-to-run spread); the mean
step the same way (throughput: where the step's time is set by what it trains, as with
long-form audio, the median step says little about a run's length); time to the serial
run's final reward, rows decoded, decode rounds, carried unfinished groups, rescored
(wasted) sequences, and the cost-model planner's choices and predictions. Every speedup
carries its 95% bootstrap interval and verdict (asr_grpo.tracking.speedup_ci): steps and
repeats resampled, paired by repeat where the mode planned every step serial (the same
work as `none`). Writes `<out>/overlap_speedup.json` and `.md`.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

from asr_grpo.tracking.runs import history, smoothed, summarize, time_to
from asr_grpo.tracking.speedup_ci import format_speedup, run_speedup_ci, speedup_ci

REPO = Path(__file__).resolve().parents[1]
MODES = ("none", "intra", "inter", "oppo")
COMMON = ["trainer.eval_max_utterances=32", "trainer.save_every=0"]

# 8 samples a prompt, all trained: the GRPO recipe the published step timings measured
# (algorithm=grpo now samples 32 and trains 8); bare_loop.py times the same step.
BENCH_SAMPLING = ["algorithm.n_samples_per_prompt=8", "algorithm.train_samples_per_prompt=null"]

# The embedded default, PPO with a run-on sampling tail, and long-form audio. All keep
# the default SFT checkpoint (the long-form corpus changes only the rl split).
WORKLOADS = {
    # One KV batch holds the whole overcommitted buffer ((B + Δmax) x n = 96 sequences),
    # as it holds the serial batch (64): the same memory knob for every mode.
    "default": [*BENCH_SAMPLING, "trainer.rollout_batch_size=128", "overlap.chunk_size=16",
                "overlap.chunk_candidates=[8,16,32]"],
    # The configuration as `make run` composes it, nothing pinned: algorithm=grpo's 32
    # samples a prompt (8 trained), so decoding is a larger share of the step than above.
    "recipe": [],
    # The paper's regime by its own levers: exploration-heavy sampling (temperature 1.3)
    # gives run-on transcripts up to a long max, one PPO epoch (OpenRLHF's default).
    "longtail": ["algorithm=ppo", "reward=asr_lm", "algorithm.n_samples_per_prompt=1",
                 "trainer.prompts_per_step=32", "algorithm.max_new_tokens=192", "algorithm.temperature=1.3",
                 "trainer.train_epochs=1", "overlap.chunk_size=16", "overlap.chunk_candidates=[8,16,32]",
                 "overlap.delta_init=8", "overlap.delta_max=16", "overlap.delta_inc=2", "overlap.delta_dec=2",
                 "overlap.delta_window=3"],
    # 30% of the RL prompts are 20-60 s dictations: responses from a few tokens to a few
    # hundred because the audio is long (no padding, no forced lengths).
    # Four prompts a step keep 3 repeats x 33 steps of every mode within an hour on 2 cores.
    "longform": ["data.corpus.longform_fraction=0.3", "algorithm.max_new_tokens=384",
                 "algorithm.n_samples_per_prompt=4", "trainer.prompts_per_step=4", "trainer.rollout_batch_size=64",
                 "overlap.chunk_size=32", "overlap.chunk_candidates=[16,32,64]"],
}
PER_STEP = ("overlap/rows_decoded", "overlap/decode_rounds", "overlap/carried_unfinished_groups",
            "overlap/rescored_sequences", "overlap/chunk", "overlap/delta",
            "perf/time/rollout", "perf/time/scoring_wall", "perf/time/training", "perf/time/sync",
            "charts/response_length", "charts/response_length_max")


def compose_run(overrides: list[str]):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from asr_grpo.config import register_configs
    from asr_grpo.config.store import CONF_DIR

    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose("config", overrides=overrides)


def median(xs) -> float:
    xs = [x for x in xs if x == x]
    return float(statistics.median(xs)) if xs else float("nan")


def measured(client, run_id: str, warmup: int) -> dict:
    """Per-step series of one run, warm-up steps dropped."""
    out = {}
    for key in PER_STEP:
        h = history(client, run_id, key)
        out[key] = [h[s] for s in sorted(h) if s > warmup]
    steps = history(client, run_id, "perf/time/step")
    out["perf/time/step"] = [steps[s] for s in sorted(steps) if s > warmup]
    predicted = history(client, run_id, "overlap/predicted_step_s")
    out["predicted_vs_measured"] = [[predicted[s], steps[s]] for s in sorted(predicted) if s > warmup and s in steps]
    return out


def ideal_steps(series: dict) -> list[float]:
    """Per serial step: decoding as long as the mean response (no tail), scoring fully
    hidden, then training and sync. Compared with the same statistic of every mode."""
    return [r * m / max(1.0, x) + t + s for r, m, x, t, s in
            zip(series["perf/time/rollout"], series["charts/response_length"], series["charts/response_length_max"],
                series["perf/time/training"], series["perf/time/sync"])]


def mean_step(run: dict) -> float:
    """Seconds per step over the measured steps (throughput: every step trains B groups)."""
    steps = run["series"]["perf/time/step"]
    return sum(steps) / len(steps) if steps else float("nan")


def mode_row(runs: list[dict], serial_target: float, serial_ttt: float, serial_step: float, serial_mean: float,
             ideal: float, window: int) -> dict:
    per_run = [median(r["series"]["perf/time/step"]) for r in runs]
    means = [mean_step(r) for r in runs]
    ttt = [time_to(serial_target, r["summary"], window) for r in runs]
    mid = median(per_run)
    pick = lambda key: median([median(r["series"][key]) for r in runs])  # noqa: E731
    pairs = [pair for r in runs for pair in r["series"]["predicted_vs_measured"]]
    return {
        "median_step_s": mid, "step_spread_s": [min(per_run), max(per_run)], "per_run_median_step_s": per_run,
        "step_speedup": serial_step / mid,
        "mean_step_s": median(means), "mean_spread_s": [min(means), max(means)], "per_run_mean_step_s": means,
        "mean_speedup": serial_mean / median(means),
        "time_to_target_s": median(ttt), "ttt_speedup": serial_ttt / median(ttt) if median(ttt) > 0 else float("nan"),
        "per_run_time_to_target_s": ttt,
        # Per run (repeat order), the measured steps: what the speedups' intervals resample.
        "per_run_step_s": [r["series"]["perf/time/step"] for r in runs],
        "efficiency": ideal / mid,
        "rows_decoded": pick("overlap/rows_decoded"), "decode_rounds": pick("overlap/decode_rounds"),
        # A mean: most steps carry none, so a median hides the steps that do.
        "carried_unfinished_groups": median([statistics.fmean(r["series"]["overlap/carried_unfinished_groups"]
                                                              or [0.0]) for r in runs]),
        "rescored_sequences": pick("overlap/rescored_sequences"),
        "chunks": sorted({c for r in runs for c in r["series"]["overlap/chunk"]}),
        "deltas": sorted({d for r in runs for d in r["series"]["overlap/delta"]}),
        "predicted_step_s": median([p for p, _ in pairs]) if pairs else None,
        "measured_when_predicted_s": median([m for _, m in pairs]) if pairs else None,
        "prediction_error_median": median([p / m - 1 for p, m in pairs]) if pairs else None,
        "cer_before": median([r["summary"]["cer_before"] for r in runs]),
        "cer_after": median([r["summary"]["cer_after"] for r in runs]),
        "final_reward": median([r["summary"]["final_reward"] for r in runs]),
        "phases_s": {p: pick(f"perf/time/{p}") for p in ("rollout", "scoring_wall", "training", "sync")},
        "run_ids": [r["summary"]["run_id"] for r in runs],
    }


def same_work(row: dict) -> bool:
    """The mode planned every measured step serial (chunk 0, Δ 0): with the benchmark's one
    seed its runs do the work of `none`'s, step for step, so repeat r of both is a pair."""
    return bool(row["chunks"]) and bool(row["deltas"]) and not any(row["chunks"]) and not any(row["deltas"])


def _per_run_means(row: dict, repeats: int) -> tuple[list[float] | None, bool]:
    """Each run's mean step and whether in repeat order. JSONs from before
    `per_run_mean_step_s` hold the median and range of the means: with 3 repeats or fewer
    these are every run's mean, in an order lost (so resampled unpaired)."""
    if "per_run_mean_step_s" in row:
        return row["per_run_mean_step_s"], True
    if repeats > 3:
        return None, False
    lo, hi = row["mean_spread_s"]
    return ([lo, row["mean_step_s"], hi] if repeats == 3 else [lo, hi][:repeats]), False


def add_intervals(result: dict) -> dict:
    """Sets `step_speedup_ci`, `mean_speedup_ci`, `ttt_speedup_ci` (SpeedupCI fields, None
    for `none`) on every mode of a report from what it holds: per-step series (the
    two-level bootstrap), else per-run figures (runs only); no interval for time to target
    without each run's time. Measured figures are left as they are."""
    serial = result["modes"]["none"]
    for mode, m in result["modes"].items():
        if mode == "none":
            m.update(step_speedup_ci=None, mean_speedup_ci=None, ttt_speedup_ci=None)
            continue
        paired = same_work(m)
        if "per_run_step_s" in m and "per_run_step_s" in serial:
            step = speedup_ci(serial["per_run_step_s"], m["per_run_step_s"], paired=paired)
            mean = speedup_ci(serial["per_run_step_s"], m["per_run_step_s"], paired=paired, statistic="mean")
        else:
            step = run_speedup_ci(serial["per_run_median_step_s"], m["per_run_median_step_s"], paired=paired)
            (base, base_ordered), (means, ordered) = (_per_run_means(r, result["repeats"]) for r in (serial, m))
            mean = (run_speedup_ci(base, means, paired=paired and base_ordered and ordered)
                    if base and means else None)
        ttt = (run_speedup_ci(serial["per_run_time_to_target_s"], m["per_run_time_to_target_s"], paired=paired)
               if "per_run_time_to_target_s" in m and "per_run_time_to_target_s" in serial else None)
        m.update({k: ci.to_dict() if ci else None
                  for k, ci in (("step_speedup_ci", step), ("mean_speedup_ci", mean), ("ttt_speedup_ci", ttt))})
    return result


def report(workload: str, overrides: list[str], runs: dict[str, list[dict]], window: int, *,
           order_seed: int | None = None, orders: list[list[str]] | None = None) -> dict:
    serial = runs["none"]
    serial_step = median([median(r["series"]["perf/time/step"]) for r in serial])
    serial_mean = median([mean_step(r) for r in serial])
    target = 0.98 * median([smoothed(r["summary"]["reward"], window)[-1] for r in serial])
    serial_ttt = median([time_to(target, r["summary"], window) for r in serial])
    ideal = median([median(ideal_steps(r["series"])) for r in serial])   # the statistic every mode gets
    rows = {mode: mode_row(rs, target, serial_ttt, serial_step, serial_mean, ideal, window)
            for mode, rs in runs.items()}
    ph = rows["none"]["phases_s"]
    split = {k: v / serial_step for k, v in ph.items()}
    split["other"] = max(0.0, 1.0 - sum(split.values()))
    lengths = [x for r in serial for x in r["series"]["charts/response_length"]]
    longest = [x for r in serial for x in r["series"]["charts/response_length_max"]]
    return add_intervals({"workload": workload, "overrides": overrides, "repeats": len(serial),
                          "measured_steps": len(serial[0]["series"]["perf/time/step"]), "serial_phase_split": split,
                          "target_reward": target, "ideal_step_s": ideal, "order_seed": order_seed,
                          "orders": orders, "response_length": {"mean": median(lengths), "max": median(longest)},
                          "modes": rows})


def _speedup(mode: str, m: dict, key: str) -> str:
    return f"{m[key]:.2f}x" if mode == "none" else format_speedup(m.get(f"{key}_ci"), m[key])


def _interval_note(r: dict) -> str:
    modes = [m for k, m in r["modes"].items() if k != "none"]
    paired = [k for k, m in r["modes"].items() if k != "none" and same_work(m)]
    note = ("Speedups: `none`'s median over repeats / the mode's (of each run's median step; of its mean step; of its "
            "time to target), with the 95% bootstrap interval [low, high] over repeats and steps; 'no difference': "
            "the interval holds 1.00x. Paired by repeat (the same work as `none`, every step planned serial): "
            f"{', '.join(f'`{k}`' for k in paired) or 'no mode'}"
            f"{'; the other modes unpaired' if len(paired) < len(modes) else ''}.")
    if not all("per_run_step_s" in m for m in modes):
        note += (" This JSON holds each run's median step, not its steps: the step speedup's interval resamples "
                 "the runs only")
        note += ("; of the mean steps only their median and range (with 3 repeats or fewer, every run's mean, "
                 "in an order lost: resampled unpaired)" if not all("per_run_mean_step_s" in m for m in modes)
                 else "")
        note += "."
    if not all("per_run_time_to_target_s" in m for m in modes):
        note += " Time to target: the median over repeats only, no interval."
    return note


def markdown(results: list[dict]) -> str:
    out = []
    for r in results:
        split = ", ".join(f"{k} {100 * v:.0f}%" for k, v in r["serial_phase_split"].items())
        out += [f"### Workload `{r['workload']}`: {r['repeats']} interleaved repeats x {r['measured_steps']} "
                "measured steps per mode", "",
                f"Overrides: `{' '.join(r['overrides']) or '(defaults)'}`", "",
                f"Serial phase split: {split}. Response length (tokens, median over steps): mean "
                f"{r['response_length']['mean']:.0f}, longest {r['response_length']['max']:.0f}. Ideal step (no tail, "
                f"scoring hidden): {r['ideal_step_s']:.2f} s. Target reward (98% of the serial final): "
                f"{r['target_reward']:.3f}.", "", _interval_note(r), "",
                "| mode | median step (s) [run range] | step speedup | mean step (s) [run range] | speedup "
                "| time to target | speedup | efficiency "
                "| rows decoded / step | decode rounds / step | carried unfinished groups / step (mean) "
                "| rescored seqs "
                "| chunk / Δ used | predicted vs measured (s) | CER before -> after |",
                "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for mode, m in r["modes"].items():
            lo, hi = m["step_spread_s"]
            pred = (f"{m['predicted_step_s']:.2f} vs {m['measured_when_predicted_s']:.2f}"
                    if m["predicted_step_s"] is not None else "-")
            used = f"{'/'.join(str(int(c)) for c in m['chunks'])} / {'/'.join(str(int(d)) for d in m['deltas'])}"
            mlo, mhi = m["mean_spread_s"]
            out.append(f"| {mode} | {m['median_step_s']:.2f} [{lo:.2f}-{hi:.2f}] | "
                       f"{_speedup(mode, m, 'step_speedup')} | {m['mean_step_s']:.2f} [{mlo:.2f}-{mhi:.2f}] | "
                       f"{_speedup(mode, m, 'mean_speedup')} | "
                       f"{m['time_to_target_s']:.0f} s | {_speedup(mode, m, 'ttt_speedup')} | {m['efficiency']:.2f} | "
                       f"{m['rows_decoded']:.0f} | {m['decode_rounds']:.0f} | {m['carried_unfinished_groups']:.1f} | "
                       f"{m['rescored_sequences']:.0f} | {used} | {pred} | "
                       f"{m['cer_before']:.3f} -> {m['cer_after']:.3f} |")
        out.append("")
    return "\n".join(out)


def load_run(client, run_id: str, window: int, warmup: int) -> dict:
    return {"summary": summarize(client, run_id, window), "series": measured(client, run_id, warmup)}


def rebuild(path: Path, args) -> None:
    """The report of an earlier benchmark recomputed from its MLflow runs (same run ids)."""
    import mlflow

    from asr_grpo.tracking import absolute_tracking_uri

    client = mlflow.tracking.MlflowClient(absolute_tracking_uri(f"sqlite:///{args.output_root}/mlflow.db"))
    results = [report(old["workload"], old["overrides"],
                      {mode: [load_run(client, rid, args.window, args.warmup) for rid in row["run_ids"]]
                       for mode, row in old["modes"].items()}, args.window,
                      order_seed=old.get("order_seed"), orders=old.get("orders"))
               for old in json.loads(path.read_text())]
    path.write_text(json.dumps(results, indent=1))
    path.with_suffix(".md").write_text(markdown(results))
    print(markdown(results))


def from_json(path: Path, write: bool) -> str:
    """The markdown of an earlier run's JSON, the speedups' intervals computed from what it
    holds; `write`: into `<path>.md`, the interval fields added to the JSON (its measured
    figures unchanged)."""
    results = json.loads(path.read_text())
    old = [r.get("workload", "?") for r in results if "repeats" not in r]
    if old:   # one run a mode and another table: rendered by the script of its commit
        sys.exit(f"{path}: workloads {', '.join(old)} predate interleaved repeats; not rendered by this version")
    text = markdown([add_intervals(r) for r in results])
    if write:
        path.write_text(json.dumps(results, indent=1))
        path.with_suffix(".md").write_text(text)
    return text


def mode_orders(modes: list[str], repeats: int, seed: int) -> list[list[str]]:
    """The order of the modes in each repeat, drawn at random (seeded): a mode neither
    always runs first nor always follows the same mode, so drift and warm caches fall on
    all modes alike."""
    rng = random.Random(seed)
    return [rng.sample(list(modes), len(modes)) for _ in range(repeats)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    ap.add_argument("--steps", type=int, default=33, help="steps per run, warm-up included")
    ap.add_argument("--warmup", type=int, default=3, help="first steps of every run left out")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--order-seed", type=int, default=0, help="seeds the random mode order of every repeat")
    ap.add_argument("--window", type=int, default=3, help="steps in the reward smoothing window")
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))
    ap.add_argument("--output-root", default=str(REPO / "outputs"),
                    help="paths.output_root: where the corpus, SFT checkpoint and MLflow store live")
    ap.add_argument("--from-json", help="re-render the report from an earlier run's JSON (no training)")
    ap.add_argument("--write", action="store_true",
                    help="with --from-json: write the .md beside the JSON and add the interval fields to it")
    ap.add_argument("--rebuild", help="recompute an earlier run's JSON from its MLflow runs (no training)")
    ap.add_argument("overrides", nargs="*", help="extra Hydra overrides for every run")
    args = ap.parse_args()
    if args.from_json:
        print(from_json(Path(args.from_json), args.write))
        return
    if args.rebuild:
        rebuild(Path(args.rebuild), args)
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
        runs: dict[str, list[dict]] = {m: [] for m in args.modes}
        orders = mode_orders(args.modes, args.repeats, args.order_seed)
        for rep, order in enumerate(orders):
            for mode in order:
                # Value overrides apply after the group files, so the workload's overlap.*
                # knobs hold whichever overlap mode is selected.
                overrides = [f"paths.output_root={args.output_root}", f"overlap={mode}", *WORKLOADS[workload],
                             *COMMON, f"trainer.steps={args.steps}", f"trainer.eval_every={args.steps}",
                             f"trainer.output_dir={args.output_root}/bench/{workload}-{mode}",
                             "logger.experiment_name=bench-overlap", *args.overrides]
                cfg = compose_run(overrides)
                print(f"== {workload} / overlap={mode} / repeat {rep}", flush=True)
                summary = run_rl(cfg, run_name=f"bench-{stamp}-{workload}-{mode}-r{rep}")
                client = mlflow.tracking.MlflowClient(absolute_tracking_uri(cfg.logger.tracking_uri))
                run = load_run(client, summary["mlflow_run_id"], args.window, args.warmup)
                runs[mode].append(run)
                print(f"   median step {median(run['series']['perf/time/step']):.2f} s", flush=True)
        results.append(report(workload, WORKLOADS[workload] + list(args.overrides), runs, args.window,
                              order_seed=args.order_seed, orders=orders))
        (out / "overlap_speedup.json").write_text(json.dumps(results, indent=1))
        (out / "overlap_speedup.md").write_text(markdown(results))
    print(markdown(results))


if __name__ == "__main__":
    main()
