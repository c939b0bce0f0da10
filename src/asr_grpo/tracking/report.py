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

import csv
import math
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from asr_grpo.tracking.runs import RunNotComparable, smoothed, summarize, time_to, time_to_cer

MODE_ORDER = {"none": 0, "intra": 1, "inter": 2, "oppo": 3}
ROLE_ORDER = ("actor", "ref", "critic", "reward_model", "reward", "rollout")
ALIASES = {"overlap.mode": "overlap", "placement.name": "placement"}
FIXED_KEYS = ("overlap.mode", "placement.name")
# Params that differ between runs without being an experimental choice.
_RUN_SPECIFIC = re.compile(r"^(paths\.|logger\.|trainer\.output_dir$|trainer\.resume$|placement\.[a-z_]+\.\d+$)")
_SAFE_TAG = re.compile(r"^[\w.:@+-]+$")

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


class SelectionError(ValueError):
    """The runs asked for cannot be found, or none of them can be compared."""


@dataclass
class Selection:
    description: str                    # for people: "sweep speedup-20261130-120000 (8 runs)"
    slug: str                           # for folder and run names
    runs: list                          # mlflow.entities.Run
    experiment_id: str
    parent_run_id: Optional[str] = None
    notes: list[str] = field(default_factory=list)


def open_store(tracking_uri: str):
    """An MlflowClient on `tracking_uri`; a SQLite store must already exist (MLflow would
    silently create an empty one)."""
    from mlflow.tracking import MlflowClient

    from asr_grpo.tracking.mlflow_run import absolute_tracking_uri

    uri = absolute_tracking_uri(tracking_uri)
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///"):]).is_file():
        raise SelectionError(f"no MLflow store at {uri[len('sqlite:///'):]} (tracking_uri={uri}); runs write to "
                             f"sqlite:///<paths.output_root>/mlflow.db: set tracking_uri= or paths.output_root=")
    return MlflowClient(uri), uri


def _experiment_ids(client, experiment_name: Optional[str]) -> list[str]:
    experiments = client.search_experiments()
    if not experiment_name:
        return [e.experiment_id for e in experiments]
    for e in experiments:
        if e.name == experiment_name:
            return [e.experiment_id]
    raise SelectionError(f"no MLflow experiment named {experiment_name!r}; experiments in this store: "
                         f"{', '.join(sorted(e.name for e in experiments)) or '(none)'}")


def _search(client, experiment_ids: list[str], filter_string: str, **kw) -> list:
    return list(client.search_runs(experiment_ids, filter_string, max_results=5000, **kw))


def select_runs(client, *, sweep: Optional[str] = None, experiment_name: Optional[str] = None,
                run_ids=()) -> Selection:
    """Exactly one of: `run_ids`; `sweep` (a sweep tag, or "latest"); `experiment_name`
    alone (all RL runs of that experiment). Nothing at all means the latest sweep."""
    from mlflow.exceptions import MlflowException

    run_ids = list(run_ids or [])
    if run_ids and sweep:
        raise SelectionError(f"give run_ids or sweep, not both (run_ids={run_ids}, sweep={sweep!r})")
    if run_ids:
        runs = []
        for rid in run_ids:
            try:
                runs.append(client.get_run(str(rid)))
            except MlflowException:
                raise SelectionError(f"run id {rid!r} is not in this MLflow store") from None
        return Selection(f"{len(runs)} runs", f"runs-{runs[0].info.run_id[:8]}", runs, runs[0].info.experiment_id)
    exp_ids = _experiment_ids(client, experiment_name)
    if experiment_name and not sweep:
        runs = _search(client, exp_ids, "tags.stage = 'rl'")
        if not runs:
            raise SelectionError(f"experiment {experiment_name!r} has no RL runs (tag stage=rl)")
        return Selection(f"experiment {experiment_name} ({len(runs)} runs)", re.sub(r"[^\w.-]", "_", experiment_name),
                         runs, exp_ids[0])
    sweep = sweep or "latest"
    if sweep == "latest":
        parents = _search(client, exp_ids, "tags.sweep_role = 'parent'", order_by=["attributes.start_time DESC"])
        if not parents:
            raise SelectionError("no sweep in this MLflow store: run one (python -m asr_grpo.run -m "
                                 "experiment=speedup), or pick runs with run_ids=[...] or experiment_name=...")
        sweep = parents[0].data.tags["sweep"]
    if not _SAFE_TAG.match(sweep):
        raise SelectionError(f"sweep={sweep!r} is not a sweep tag (letters, digits and ._:@+- only)")
    runs = _search(client, exp_ids, f"tags.sweep = '{sweep}' and tags.sweep_role = 'job'")
    parents = _search(client, exp_ids, f"tags.sweep = '{sweep}' and tags.sweep_role = 'parent'")
    if not runs:
        known = [r.data.tags["sweep"] for r in _search(client, exp_ids, "tags.sweep_role = 'parent'",
                                                       order_by=["attributes.start_time DESC"])]
        raise SelectionError(f"no runs tagged sweep={sweep!r}; sweeps in this store, newest first: "
                             f"{', '.join(known[:10]) or '(none)'}")
    notes = []
    if parents:
        failed = parents[0].data.metrics.get("sweep/jobs_failed", 0)
        if failed:
            notes.append(f"{failed:.0f} of {parents[0].data.metrics.get('sweep/jobs', 0):.0f} jobs of the sweep "
                         f"failed (their errors: sweep_jobs.json of parent run {parents[0].info.run_id})")
    return Selection(f"sweep {sweep} ({len(runs)} runs)", sweep, runs, runs[0].info.experiment_id,
                     parents[0].info.run_id if parents else None, notes)


# ---- the numbers ------------------------------------------------------------------------
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


def _finite(x: float) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def _ratio(base: float, value: float) -> float:
    return base / value if _finite(base) and _finite(value) and value > 0 and base > 0 else float("nan")


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
    finite = [v for v in values if _finite(v)]
    return {"mean": statistics.fmean(finite) if finite else float("nan"),
            "sd": statistics.stdev(finite) if len(finite) > 1 else float("nan"),
            "n": len(values), "n_finite": len(finite), "never": sum(1 for v in values if v == float("inf"))}


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
    for row in rows.values():
        members = [r for r in records if r["label"] == row["label"]]
        names = sorted({k for r in members for k in r["metrics"]})
        row["metrics"] = {k: aggregate([r["metrics"].get(k, float("nan")) for r in members]) for k in names}
    roles = sorted({k[len("util_"):] for r in records for k in r["metrics"] if k.startswith("util_")},
                   key=lambda x: ROLE_ORDER.index(x) if x in ROLE_ORDER else 99)
    return {"selection": selection.description, "slug": selection.slug, "parent_run_id": selection.parent_run_id,
            "label_keys": keys, "roles": roles, "window": window, "target_frac": target_frac,
            "target_reward": target_reward, "target_cer": target_cer,
            "runs": records, "rows": list(rows.values()), "notes": notes}


def best_run(report: dict) -> Optional[dict]:
    """The run with the lowest final held-out CER (then the highest final reward)."""
    scored = [r for r in report["runs"] if _finite(r["metrics"]["final_cer"])]
    return min(scored, key=lambda r: (r["metrics"]["final_cer"], -r["metrics"]["final_reward"]), default=None)


# ---- rendering ---------------------------------------------------------------------------
def _cell(agg: dict, fmt: str) -> str:
    if agg["n_finite"] == 0:
        return "never" if agg["never"] else "-"
    text = fmt.format(agg["mean"])
    if agg["n_finite"] > 1 and _finite(agg["sd"]):
        text += " ± " + fmt.format(agg["sd"]).rstrip("x%")
    if agg["n_finite"] < agg["n"]:
        text += f" ({agg['n_finite']}/{agg['n']}" + (", others never)" if agg["never"] else ")")
    return text


def markdown(report: dict) -> str:
    runs = report["runs"]
    seeds = sorted({r["seed"] for r in runs})
    frac = report["target_frac"]
    reward_target = (f"{report['target_reward']:g}" if report["target_reward"] is not None else
                     f"{frac:.0%} of that baseline's final reward (mean of its last {report['window']} steps)")
    cer_target = (f"{report['target_cer']:g}" if report["target_cer"] is not None else
                  f"that baseline's final held-out CER + {1 - frac:.0%}")
    shown = [m for m in METRICS if any(_finite(r["metrics"].get(m[0], float("nan"))) or
                                       r["metrics"].get(m[0]) == float("inf") for r in runs)]
    roles = report["roles"]
    head = ["configuration", "seeds", *(h for _, h, _ in shown)] + (
        [f"util {' / '.join(roles)}"] if roles else [])
    out = [f"Speedup report: {report['selection']}, seeds {', '.join(seeds)}.", "",
           f"Each speedup is (the `overlap=none` run's figure) / (this run's), against the baseline run of the "
           f"same seed and placement; the baseline itself shows 1.00x. Times are wall-clock seconds from the first "
           f"RL step. Reward target: {reward_target}, reward smoothed over {report['window']} steps. CER target: "
           f"{cer_target} (held-out CER is measured every `trainer.eval_every` steps; 0 s = already met before "
           f"RL). Cells: mean ± sd over seeds; (k/n): only k of the n seeds reached the target. util: busy / "
           f"wall time per role; stale samples: sequences trained on with tokens of an older policy.", "",
           "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in report["rows"]:
        m = row["metrics"]
        cells = [row["label"], str(len(row["seeds"]))]
        cells += [_cell(m[k], fmt) if k in m else "-" for k, _, fmt in shown]
        if roles:
            cells.append(" / ".join(_cell(m[f"util_{r}"], "{:.2f}") if f"util_{r}" in m else "-" for r in roles))
        out.append("| " + " | ".join(cells) + " |")
    best = best_run(report)
    if best:
        out += ["", f"Best run (lowest final CER): {best['run_id']} ({best['label']} seed={best['seed']}), "
                    f"CER {best['metrics']['cer_before']:.3f} -> {best['metrics']['final_cer']:.3f}."]
    if report["notes"]:
        out += ["", "Notes:", *(f"- {n}" for n in report["notes"])]
    return "\n".join(out) + "\n"


def _csv_value(x: Any) -> Any:
    return "" if isinstance(x, float) and math.isnan(x) else x


def write_csvs(report: dict, out_dir: Path) -> list[Path]:
    """`report.csv`: a row per configuration (mean and sd of each figure over seeds);
    `runs.csv`: a row per run."""
    keys = report["label_keys"]
    names = sorted({k for row in report["rows"] for k in row["metrics"]})
    rows_path, runs_path = out_dir / "report.csv", out_dir / "runs.csv"
    with open(rows_path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["configuration", *keys, "runs", "seeds", *(f"{n}_{s}" for n in names for s in ("mean", "sd"))])
        for row in report["rows"]:
            w.writerow([row["label"], *(row["params"].get(k) for k in keys), len(row["run_ids"]),
                        " ".join(row["seeds"]),
                        *(_csv_value(row["metrics"][n][s]) if n in row["metrics"] else "" for n in names
                          for s in ("mean", "sd"))])
    run_names = sorted({k for r in report["runs"] for k in r["metrics"]})
    with open(runs_path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["run_id", "run_name", "configuration", *keys, "seed", "baseline_run_id", "steps", *run_names])
        for r in report["runs"]:
            w.writerow([r["run_id"], r["run_name"], r["label"], *(r["params"].get(k) for k in keys), r["seed"],
                        r["baseline_run_id"] or "", r["summary"]["steps"],
                        *(_csv_value(r["metrics"].get(n, float("nan"))) for n in run_names)])
    return [rows_path, runs_path]


# ---- back into MLflow ----------------------------------------------------------------------
def log_report(client, selection: Selection, out_dir: Path) -> str:
    """The report folder as artifacts `report/` of the sweep's parent run, or of a new
    `compare-<slug>` run when the runs were picked by id or experiment."""
    run_id = selection.parent_run_id
    if run_id is None:
        run_id = client.create_run(selection.experiment_id, run_name=f"compare-{selection.slug}",
                                   tags={"stage": "report", "compared": selection.description}).info.run_id
        client.set_terminated(run_id)
    client.log_artifacts(run_id, str(out_dir), "report")
    return run_id


def log_best_checkpoint(client, best: dict, model_name: str, selection: Selection) -> dict:
    """Log the best run's last HF checkpoint as its artifact `checkpoint/hf` and register
    it as a version of `model_name` (once per run). Returns what was done."""
    from mlflow.exceptions import MlflowException

    from asr_grpo.recipes.checkpointing import latest_checkpoint

    run_id, out = best["run_id"], best["params"].get("trainer.output_dir", "")
    try:
        ckpt = latest_checkpoint(out) if out and Path(out).is_dir() else None
    except FileNotFoundError as e:
        ckpt, why = None, str(e)
    else:
        why = f"no checkpoint in trainer.output_dir={out!r} (trainer.save_every=0, or another machine's disk)"
    if ckpt is None or not (ckpt / "hf").is_dir():
        return {"run_id": run_id, "logged": False, "reason": why}
    if "checkpoint/hf" not in {a.path for a in client.list_artifacts(run_id, "checkpoint")}:
        client.log_artifacts(run_id, str(ckpt / "hf"), "checkpoint/hf")
    client.set_tag(run_id, "best_of", selection.slug)
    try:
        client.create_registered_model(model_name, description="RL fine-tuned speech LLM (HF folder), "
                                                               "best final CER of a compared sweep")
    except MlflowException as e:
        if "RESOURCE_ALREADY_EXISTS" not in str(e.error_code):
            raise
    existing = [v for v in client.search_model_versions(f"name='{model_name}'") if v.run_id == run_id]
    version = existing[0] if existing else client.create_model_version(
        model_name, source=f"runs:/{run_id}/checkpoint/hf", run_id=run_id,
        tags={"final_cer": f"{best['metrics']['final_cer']:.4f}", "configuration": best["label"],
              "seed": best["seed"], "selection": selection.slug})
    return {"run_id": run_id, "logged": True, "checkpoint": str(ckpt / "hf"), "model_name": model_name,
            "version": version.version, "uri": f"models:/{model_name}/{version.version}"}


# ---- the whole report ---------------------------------------------------------------------
def compare(cfg) -> dict:
    """Select the runs, write `report.md`, `report.csv`, `runs.csv`, `report.json` and the
    PNG plots to the output folder, log them to MLflow, register the best run's
    checkpoint; `cfg` is a CompareConfig. Returns what was written and logged."""
    import json

    from asr_grpo.tracking.plots import write_plots

    if not _SAFE_TAG.match(cfg.model_name):
        raise SelectionError(f"model_name={cfg.model_name!r}: letters, digits and ._:@+- only")
    client, uri = open_store(cfg.tracking_uri)
    selection = select_runs(client, sweep=cfg.sweep, experiment_name=cfg.experiment_name, run_ids=cfg.run_ids)
    report = build_report(client, selection, window=cfg.window, target_frac=cfg.target_frac,
                          target_reward=cfg.target_reward, target_cer=cfg.target_cer)
    out = Path(cfg.output_dir or Path(cfg.paths.output_root) / "reports" / selection.slug).resolve()
    out.mkdir(parents=True, exist_ok=True)
    table = markdown(report)
    (out / "report.md").write_text(table)
    files = [out / "report.md", *write_csvs(report, out)]
    (out / "report.json").write_text(json.dumps(report, indent=1, default=str))
    files.append(out / "report.json")
    if cfg.plots:
        files += write_plots(report, out)
    result = {"tracking_uri": uri, "selection": selection.description, "output_dir": str(out),
              "files": [str(f) for f in files], "table": table, "report": report}
    best = best_run(report)
    if cfg.register_best and best is not None:
        result["best"] = log_best_checkpoint(client, best, cfg.model_name, selection)
    if cfg.log_to_mlflow:
        result["logged_to_run"] = log_report(client, selection, out)
    return result
