"""The speedup report: RL runs read back from MLflow, one row per configuration with its
seeds pooled, every speedup measured against the `overlap=none` run of the same seed and
placement.

A configuration is what the runs' params say varies between them (overlap mode and
placement always, plus anything else a sweep changed, e.g. `overlap.delta_max`), less
the seed and less what merely follows from the mode or placement (the `overlap.*` and
`placement.*` values their group files set). Run-specific params (paths, output folders,
the nodes Ray chose) never count.
"""
from __future__ import annotations

import math
import re
import statistics
from typing import Optional

from asr_grpo.config.schema import OverlapMode
from asr_grpo.tracking.runs import RunNotComparable, smoothed, summarize, time_to, time_to_cer
from asr_grpo.tracking.selection import Selection, SelectionError
from asr_grpo.tracking.speedup_ci import run_speedup_ci, speedup_ci

MODE_ORDER = {m.value: i for i, m in enumerate(OverlapMode)}
ROLE_ORDER = ("actor", "ref", "critic", "reward_model", "reward", "rollout")
ALIASES = {"overlap.mode": "overlap", "placement.name": "placement"}
FIXED_KEYS = ("overlap.mode", "placement.name")
# Params that differ between runs without being an experimental choice (`overrides`: the
# command line, seed included, whose choices are params of their own).
_RUN_SPECIFIC = re.compile(r"^(paths\.|logger\.|trainer\.output_dir$|trainer\.resume$|placement\.[a-z_]+\.\d+$|overrides$)")

# (key, header, format) of the per-run numbers the table and the CSVs show.
METRICS = (
    ("median_step_s", "median step (s)", "{:.2f}"),
    ("step_speedup", "step speedup", "{:.2f}x"),
    ("total_wall_s", "wall for all steps (s)", "{:.0f}"),
    ("time_to_reward_s", "time to reward target (s)", "{:.0f}"),
    ("reward_speedup", "speedup (reward)", "{:.2f}x"),
    ("time_to_cer_s", "time to CER target (s)", "{:.0f}"),
    ("cer_speedup", "speedup (CER)", "{:.2f}x"),
    ("final_cer", "final CER", "{:.3f}"),
    ("final_reward", "final reward", "{:.3f}"),
    ("stale_frac", "stale samples", "{:.0%}"),
    ("cpu_pct", "CPU %", "{:.0f}"),
    ("gpu_pct", "GPU %", "{:.0f}"),
)


# The METRICS that are speedups against the baseline: each gets a bootstrap interval.
SPEEDUPS = ("step_speedup", "reward_speedup", "cer_speedup")


def label_keys(param_sets: list[dict[str, str]]) -> list[str]:
    """The params that tell configurations apart: overlap mode, placement, then whatever
    else varies that is neither the seed nor fixed by the mode and placement."""
    keys = sorted(set().union(*param_sets)) if param_sets else []
    varying = [k for k in keys if not _RUN_SPECIFIC.match(k) and k not in (*FIXED_KEYS, "seed")
               and len({p.get(k) for p in param_sets}) > 1]
    by_fixed: dict[tuple, list[dict]] = {}
    for p in param_sets:
        by_fixed.setdefault(tuple(p.get(k) for k in FIXED_KEYS), []).append(p)
    free = [k for k in varying if any(len({p.get(k) for p in ps}) > 1 for ps in by_fixed.values())]
    return [*FIXED_KEYS, *free]


def finite(x: float) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def _ratio(base: float, value: float) -> float:
    return base / value if finite(base) and finite(value) and value > 0 and base > 0 else float("nan")


def _baseline(rec: dict, records: list[dict], keys: list[str]) -> Optional[dict]:
    """The overlap=none run of the same seed and configuration; failing that, of the same
    seed, placement and non-overlap settings."""
    exact = [k for k in keys if k != "overlap.mode"] + ["seed"]
    for ks in (exact, [k for k in exact if not k.startswith("overlap.")]):
        for r in records:
            if r["params"].get("overlap.mode") == "none" and all(r["params"].get(k) == rec["params"].get(k)
                                                                  for k in ks):
                return r
    return None


def _run_metrics(s: dict, base: Optional[dict], window: int, target_frac: float,
                 target_reward: Optional[float], target_cer: Optional[float]) -> dict:
    b = base["summary"] if base else None
    if target_reward is None:
        target_reward = target_frac * smoothed(b["reward"], window)[-1] if b else float("nan")
    if target_cer is None:
        target_cer = b["cer_after"] * (2.0 - target_frac) if b else float("nan")
    ttr, ttc = time_to(target_reward, s, window), time_to_cer(target_cer, s)
    counts = s["staleness_counts"]
    total = sum(counts.values())
    gpu = [v for k, v in s["system"].items() if re.fullmatch(r"gpu_\d+_utilization_percentage", k)]
    return {
        "median_step_s": s["median_step_s"],
        "step_speedup": _ratio(b["median_step_s"], s["median_step_s"]) if b else float("nan"),
        "total_wall_s": s["wall_clock_s"][-1],
        "target_reward": target_reward, "time_to_reward_s": ttr,
        "reward_speedup": _ratio(time_to(target_reward, b, window), ttr) if b else float("nan"),
        "target_cer": target_cer, "time_to_cer_s": ttc,
        "cer_speedup": _ratio(time_to_cer(target_cer, b), ttc) if b else float("nan"),
        "cer_before": s["cer_before"], "final_cer": s["cer_after"], "final_reward": s["final_reward"],
        "stale_frac": sum(v for k, v in counts.items() if k != "0") / total if total else 0.0,
        "cpu_pct": s["system"].get("cpu_utilization_percentage", float("nan")),
        "memory_gb": s["system"].get("system_memory_usage_megabytes", float("nan")) / 1000,
        "gpu_pct": statistics.fmean(gpu) if gpu else float("nan"),
        **{f"util_{role}": u for role, u in s["util"].items()},
    }


def aggregate(values: list[float]) -> dict:
    """mean and sd over the seeds that reached a finite value; n, and how many did."""
    reached = [v for v in values if finite(v)]
    return {"mean": statistics.fmean(reached) if reached else float("nan"),
            "sd": statistics.stdev(reached) if len(reached) > 1 else float("nan"),
            "n": len(values), "n_finite": len(reached), "never": sum(1 for v in values if v == float("inf"))}


def intervals(members: list[dict], by_id: dict[str, dict], window: int) -> dict:
    """95% bootstrap intervals of a configuration's speedups over its seeds (see
    tracking.speedup_ci), each run paired with its same-seed baseline: step times resample
    the seed pairs and, within a pair, step i of both runs together (same seed, same
    prompts at step i; where an overlapped step holds other groups the pairing only
    weakens to the unpaired width); times to target are one figure a run, so only the
    seed pairs are resampled. Empty for the baseline configuration itself and where a run
    has no baseline; None for a speedup with no finite time on some run (a target never
    reached, or met before RL)."""
    bases = [by_id.get(r["baseline_run_id"]) for r in members]
    if any(b is None for b in bases) or all(b is r for b, r in zip(bases, members)):
        return {}
    pairs = list(zip(bases, members))
    return {
        "step_speedup": speedup_ci([b["summary"]["step_s"] for b, _ in pairs],
                                   [r["summary"]["step_s"] for _, r in pairs], paired=True),
        "reward_speedup": run_speedup_ci(
            [time_to(r["metrics"]["target_reward"], b["summary"], window) for b, r in pairs],
            [r["metrics"]["time_to_reward_s"] for _, r in pairs], paired=True),
        "cer_speedup": run_speedup_ci([time_to_cer(r["metrics"]["target_cer"], b["summary"]) for b, r in pairs],
                                      [r["metrics"]["time_to_cer_s"] for _, r in pairs], paired=True),
    }


def _sort_key(params: dict[str, str], keys: list[str]) -> tuple:
    return (params.get("placement.name", ""), MODE_ORDER.get(params.get("overlap.mode", ""), 9),
            *(str(params.get(k, "")) for k in keys[2:]))


def build_report(client, selection: Selection, *, window: int = 3, target_frac: float = 0.98,
                 target_reward: Optional[float] = None, target_cer: Optional[float] = None) -> dict:
    if window < 1:
        raise SelectionError(f"window={window}: the reward smoothing window must be >= 1 step")
    if not 0 < target_frac <= 1:
        raise SelectionError(f"target_frac={target_frac}: must be in (0, 1]")
    notes = list(selection.notes)
    records = []
    for run in selection.runs:
        name = run.info.run_name
        if run.info.status != "FINISHED":
            notes.append(f"run {run.info.run_id} ({name}) is {run.info.status}: left out")
            continue
        try:
            summary = summarize(client, run.info.run_id, window)
        except RunNotComparable as e:
            notes.append(f"{e}: left out")
            continue
        records.append({"run_id": run.info.run_id, "run_name": name, "params": dict(run.data.params),
                        "summary": summary})
    if not records:
        raise SelectionError(f"none of the {len(selection.runs)} runs of {selection.description} is a finished RL "
                             "run:\n  " + "\n  ".join(notes))
    keys = label_keys([r["params"] for r in records])
    records.sort(key=lambda r: (_sort_key(r["params"], keys), r["params"].get("seed", "")))
    for r in records:
        r["label"] = " ".join(f"{ALIASES.get(k, k)}={r['params'].get(k, '?')}" for k in keys)
        r["seed"] = r["params"].get("seed", "?")
        base = _baseline(r, records, keys)
        r["baseline_run_id"] = base["run_id"] if base else None
        if base is None:
            notes.append(f"run {r['run_id']} ({r['label']} seed={r['seed']}) has no overlap=none run of the same "
                         f"seed and placement: no speedups")
        r["metrics"] = _run_metrics(r["summary"], base, window, target_frac, target_reward, target_cer)
    rows: dict[str, dict] = {}
    for r in records:
        row = rows.setdefault(r["label"], {"label": r["label"], "params": {k: r["params"].get(k) for k in keys},
                                           "seeds": [], "run_ids": []})
        row["seeds"].append(r["seed"])
        row["run_ids"].append(r["run_id"])
    by_id = {r["run_id"]: r for r in records}
    for row in rows.values():
        members = [r for r in records if r["label"] == row["label"]]
        names = sorted({k for r in members for k in r["metrics"]})
        row["metrics"] = {k: aggregate([r["metrics"].get(k, float("nan")) for r in members]) for k in names}
        row["intervals"] = {k: ci.to_dict() if ci else None for k, ci in intervals(members, by_id, window).items()}
    roles = sorted({k[len("util_"):] for r in records for k in r["metrics"] if k.startswith("util_")},
                   key=lambda x: ROLE_ORDER.index(x) if x in ROLE_ORDER else 99)
    return {"selection": selection.description, "slug": selection.slug, "parent_run_id": selection.parent_run_id,
            "label_keys": keys, "roles": roles, "window": window, "target_frac": target_frac,
            "target_reward": target_reward, "target_cer": target_cer,
            "runs": records, "rows": list(rows.values()), "notes": notes}


def best_run(report: dict) -> Optional[dict]:
    """The run with the lowest final held-out CER (then the highest final reward)."""
    scored = [r for r in report["runs"] if finite(r["metrics"]["final_cer"])]
    return min(scored, key=lambda r: (r["metrics"]["final_cer"], -r["metrics"]["final_reward"]), default=None)
