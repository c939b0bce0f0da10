"""RL runs read back from MLflow: one summary per run (the figures the OPPO benchmark and
the speedup report put side by side), reward smoothing, and time to a target.

Training steps are 1..N (`perf/*`, `reward/*`, `overlap/*` at every step); `eval/cer` is
logged at step 0 (before RL) and every `trainer.eval_every` steps; `perf/wall_clock` is
the seconds since the first step started, so step 0 sits at 0 s.
"""
from __future__ import annotations

import json
import statistics

# Metric families a summary reads (system/* are MLflow's system metrics, sampled in time).
SUMMARY_PREFIXES = ("perf/", "overlap/", "reward/total", "eval/cer", "charts/response_length", "system/")


class RunNotComparable(ValueError):
    """A run that lacks the metrics of an RL training run (an SFT run, or one that failed
    before its first step)."""


# Per step, the response lengths of every group it trained ({"steps": {step: [[len, ...], ...]}}):
# the run's own length distribution, whole groups, for the forecast's profile=run.
GROUP_LENGTHS = "rollout/group_lengths.json"


def experiment_runs(client, name: str, filter_string: str = "") -> list:
    """The runs of MLflow experiment `name`, oldest first; ValueError naming the
    experiment and the tracking URI when there is none of that name."""
    experiment = client.get_experiment_by_name(name)
    if experiment is None:
        raise ValueError(f"no MLflow experiment {name!r} at {client.tracking_uri}")
    return client.search_runs([experiment.experiment_id], filter_string, order_by=["attributes.start_time ASC"])


def history(client, run_id: str, key: str) -> dict[int, float]:
    return {m.step: m.value for m in client.get_metric_history(run_id, key)}


def group_lengths(client, run_id: str) -> dict[int, list[list[int]]]:
    """The run's `GROUP_LENGTHS` artifact by step; empty for a run that has none (older runs)."""
    import mlflow

    try:
        text = mlflow.artifacts.load_text(f"{client.get_run(run_id).info.artifact_uri}/{GROUP_LENGTHS}")
    except Exception:   # MLflow raises its own error types per store for a missing file
        return {}
    return {int(k): v for k, v in json.loads(text).get("steps", {}).items()}


def mean(xs) -> float:
    xs = list(xs)
    return float(statistics.fmean(xs)) if xs else float("nan")


def summarize(client, run_id: str, window: int) -> dict:
    """Per-run figures from its MLflow metrics; `window`: steps of the final-reward mean."""
    run = client.get_run(run_id)
    keys = run.data.metrics.keys()
    missing = [k for k in ("perf/time/step", "perf/wall_clock", "reward/total") if k not in keys]
    if missing:
        raise RunNotComparable(
            f"run {run_id} ({run.info.run_name!r}, status {run.info.status}) has no {', '.join(missing)} "
            f"metric: not an RL training run, or it stopped before its first step")
    h = {k: history(client, run_id, k) for k in keys if k.startswith(SUMMARY_PREFIXES)}
    steps = sorted(h["perf/time/step"])
    step_s = [h["perf/time/step"][s] for s in steps]
    reward = [h["reward/total"].get(s, float("nan")) for s in steps]
    wall = h["perf/wall_clock"]
    phases = {p: mean(h[f"perf/time/{p}"].values()) for p in
              ("rollout", "rollout_decode", "stream_drain", "scoring_wall", "training", "sync")
              if f"perf/time/{p}" in h}
    staleness_counts: dict[str, float] = {}
    for k, v in h.items():
        if k.startswith("overlap/staleness_count/"):
            staleness_counts[k.rsplit("/", 1)[1]] = sum(v.values())
    cer = h.get("eval/cer", {})
    return {
        "run_id": run_id,
        "steps": len(steps),
        "step_numbers": steps,
        "step_s": step_s,
        "median_step_s": statistics.median(step_s),
        "mean_step_s": mean(step_s),
        "wall_clock_s": [wall[s] for s in steps],
        "reward": reward,
        "final_reward": mean(reward[-window:]),
        "eval_cer": {int(s): v for s, v in sorted(cer.items())},
        # eval at step k ran right after step k, whose wall clock includes it; step 0 is before RL.
        "eval_wall_s": {int(s): (wall.get(s, float("nan")) if s else 0.0) for s in sorted(cer)},
        "cer_before": cer.get(0, float("nan")),
        "cer_after": cer[max(cer)] if cer else float("nan"),
        "phases_s": phases,
        "util": {k.split("/")[-1]: mean(v.values()) for k, v in h.items() if k.startswith("perf/util/")},
        "idle_s": {k.split("/")[-1]: mean(v.values()) for k, v in h.items() if k.startswith("perf/idle/")},
        "staleness_counts": staleness_counts,
        "delta": [h["overlap/delta"][s] for s in steps] if "overlap/delta" in h else [],
        "chunk": [h["overlap/chunk"][s] for s in steps] if "overlap/chunk" in h else [],
        "response_length": {q: mean(h[f"charts/response_length{q}"].values())
                            for q in ("", "_p50", "_p90", "_max") if f"charts/response_length{q}" in h},
        "system": {k[len("system/"):]: mean(v.values()) for k, v in h.items() if k.startswith("system/")},
    }


def smoothed(reward: list[float], window: int) -> list[float]:
    """Mean over the last `window` steps, defined once a full window exists (NaN before)."""
    return [mean(reward[i - window + 1:i + 1]) if i >= window - 1 else float("nan") for i in range(len(reward))]


def time_to(target: float, run: dict, window: int) -> float:
    """Wall-clock seconds until the smoothed reward first reaches `target` (inf: never)."""
    for t, r in zip(run["wall_clock_s"], smoothed(run["reward"], window)):
        if r >= target:
            return t
    return float("inf")


def time_to_cer(target: float, run: dict) -> float:
    """Wall-clock seconds until held-out CER is first at or below `target` (0: already
    before RL; inf: never at any evaluation)."""
    for step, cer in run["eval_cer"].items():
        if cer <= target:
            return run["eval_wall_s"][step]
    return float("inf")
