"""A speedup report (`report.build_report`) as a markdown table and CSV files."""
from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

from asr_grpo.tracking.report import METRICS, SPEEDUPS, best_run, finite
from asr_grpo.tracking.speedup_ci import SpeedupCI, format_speedup


def _cell(agg: dict, fmt: str) -> str:
    if agg["n_finite"] == 0:
        return "never" if agg["never"] else "-"
    text = fmt.format(agg["mean"])
    if agg["n_finite"] > 1 and finite(agg["sd"]):
        text += " ± " + fmt.format(agg["sd"]).rstrip("x%")
    if agg["n_finite"] < agg["n"]:
        text += f" ({agg['n_finite']}/{agg['n']}" + (", others never)" if agg["never"] else ")")
    return text


def _speedup_cell(row: dict, key: str, fmt: str) -> str:
    """A speedup with its interval; a row with intervals but none for this speedup shows
    the mean ± sd over seeds and says it has none; the baseline row has no intervals."""
    ivs = row.get("intervals") or {}
    if ivs.get(key):
        return format_speedup(ivs[key])
    cell = _cell(row["metrics"][key], fmt)
    return cell + " (no interval)" if key in ivs and cell != "-" else cell


def markdown(report: dict) -> str:
    runs = report["runs"]
    seeds = sorted({r["seed"] for r in runs})
    frac = report["target_frac"]
    reward_target = (f"{report['target_reward']:g}" if report["target_reward"] is not None else
                     f"{frac:.0%} of that baseline's final reward (mean of its last {report['window']} steps)")
    cer_target = (f"{report['target_cer']:g}" if report["target_cer"] is not None else
                  f"that baseline's final held-out CER + {1 - frac:.0%}")
    shown = [m for m in METRICS if any(finite(r["metrics"].get(m[0], float("nan"))) or
                                       r["metrics"].get(m[0]) == float("inf") for r in runs)]
    roles = report["roles"]
    head = ["configuration", "seeds", *(h for _, h, _ in shown)] + (
        [f"util {' / '.join(roles)}"] if roles else [])
    out = [f"Speedup report: {report['selection']}, seeds {', '.join(seeds)}.", "",
           f"Each speedup is (the `overlap=none` run's figure) / (this run's), against the baseline run of the "
           f"same seed and placement; the baseline itself shows 1.00x. Times are wall-clock seconds from the first "
           f"RL step. Reward target: {reward_target}, reward smoothed over {report['window']} steps. CER target: "
           f"{cer_target} (held-out CER is measured every `trainer.eval_every` steps; 0 s = already met before "
           f"RL). Cells: mean ± sd over seeds; (k/n): only k of the n seeds reached the target. Speedups: the "
           f"baseline's median over seeds / this configuration's (of each run's median step, or its time to the "
           f"target), with its 95% bootstrap interval [low, high] over seeds and steps, each seed paired with its "
           f"baseline; 'no difference': the interval holds 1.00x; 'runs only, n=k': only the k seeds' figures were "
           f"resampled. util: busy / "
           f"wall time per role; stale samples: sequences trained on with tokens of an older policy.", "",
           "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in report["rows"]:
        m = row["metrics"]
        cells = [row["label"], str(len(row["seeds"]))]
        cells += [("-" if k not in m else _speedup_cell(row, k, fmt) if k in SPEEDUPS else _cell(m[k], fmt))
                  for k, _, fmt in shown]
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


# A speedup interval's fields, `<speedup>_ci_<field>` columns of report.csv.
CI_FIELDS = tuple(f for f in SpeedupCI.__dataclass_fields__ if f != "level")


def _csv_value(x: Any) -> Any:
    return "" if isinstance(x, float) and math.isnan(x) else x


def write_csvs(report: dict, out_dir: Path) -> list[Path]:
    """`report.csv`: a row per configuration (mean and sd of each figure over seeds);
    `runs.csv`: a row per run."""
    keys = report["label_keys"]
    names = sorted({k for row in report["rows"] for k in row["metrics"]})
    ci_names = sorted({k for row in report["rows"] for k in row.get("intervals") or {}})
    rows_path, runs_path = out_dir / "report.csv", out_dir / "runs.csv"
    with open(rows_path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["configuration", *keys, "runs", "seeds", *(f"{n}_{s}" for n in names for s in ("mean", "sd")),
                    *(f"{n}_ci_{f}" for n in ci_names for f in CI_FIELDS)])
        for row in report["rows"]:
            ivs = row.get("intervals") or {}
            w.writerow([row["label"], *(row["params"].get(k) for k in keys), len(row["run_ids"]),
                        " ".join(row["seeds"]),
                        *(_csv_value(row["metrics"][n][s]) if n in row["metrics"] else "" for n in names
                          for s in ("mean", "sd")),
                        *(_csv_value(ivs[n][f]) if ivs.get(n) else "" for n in ci_names for f in CI_FIELDS)])
    run_names = sorted({k for r in report["runs"] for k in r["metrics"]})
    with open(runs_path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["run_id", "run_name", "configuration", *keys, "seed", "baseline_run_id", "steps", *run_names])
        for r in report["runs"]:
            w.writerow([r["run_id"], r["run_name"], r["label"], *(r["params"].get(k) for k in keys), r["seed"],
                        r["baseline_run_id"] or "", r["summary"]["steps"],
                        *(_csv_value(r["metrics"].get(n, float("nan"))) for n in run_names)])
    return [rows_path, runs_path]
