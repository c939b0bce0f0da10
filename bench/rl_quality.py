"""What RL did to recognition, per run of an MLflow experiment: held-out CER (dev and
the held-out-voice split, overall and per language, and each held-out acoustic condition) at step 0 and as the mean of the
last evaluations inside a time budget, their relative drops, and the reward's
components (CER, keyword, language, smoothness) early and late, so a CER gain that
comes with gamed keyword or smoothness scores shows.

    python bench/rl_quality.py --experiment NAME [--minutes 45] [--max-step N] [--last 3]
                               [--out quality.json] [--keep quality.json] [--also RUN_ID ...]
                               [--plot cer_minutes.png] [--versus defaults]

Prints a markdown table; --out also writes the figures as JSON. --keep carries the runs
of an earlier quality.json that this tracking store does not hold (seeds run on another
machine or from a store since cleared) into the table, same budget and window required;
--also adds runs of other experiments in the same store by id (a baseline run once).
--plot draws CER against minutes per eval set: each variant (runs that differ only in
their seed) as the mean over its seeds and, for several seeds, the band from the lowest
to the highest.
--max-step reads every run at the same steps instead (runs on machines of different speed
reach different steps in the same minutes).
--versus VARIANT adds a table of each other variant against that one, seed by seed from the
same checkpoint, with the adoption rule's verdict (bench/rl_pairs.py).
"""
from __future__ import annotations

import argparse
import json

from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from asr_grpo.tracking.runs import experiment_runs, history, mean
from portable import portable
from rl_pairs import paired_table

EVAL_SETS = {"dev": "eval/cer", "heldout_voices": "eval/heldout_voices/cer"}
# A run with trainer.ema_decay > 0 also evaluates its weight average: the same sets under ema/.
EVAL_SETS.update({f"ema/{name}": key.replace("eval/", "eval/ema/", 1) for name, key in EVAL_SETS.items()})
LANGUAGES = ("en", "zh")
CONDITIONS_PREFIX = "eval/heldout_conditions/"   # eval/heldout_conditions/<name>/cer: overall only
REWARDS = ("reward/total", "reward/cer", "reward/keyword", "reward/language", "reward/smoothness", "kl/policy_ref")
# Per language: the CER reward, and the share of groups whose samples all scored the same
# (no advantage, nothing learnt from that prompt).
LANGUAGE_REWARDS = tuple(f"{k}/{lang}" for k in ("reward/cer", "reward/flat_groups") for lang in LANGUAGES)


def inside_budget(step: int, minutes_at: dict[int, float], budget_min: float, max_step: int | None) -> bool:
    return minutes_at.get(step, float("inf")) <= budget_min and (max_step is None or step <= max_step)


def steps_inside(points: dict[int, float], minutes_at: dict[int, float], budget_min: float,
                 max_step: int | None) -> list[int]:
    """The logged steps of `points` inside the budget, in order."""
    return [s for s in sorted(points) if inside_budget(s, minutes_at, budget_min, max_step)]


def eval_summary(points: dict[int, float], minutes_at: dict[int, float], budget_min: float, last: int,
                 max_step: int | None = None) -> dict:
    """CER at step 0, the mean of the last `last` evaluations after it inside the budget
    (minutes, and steps when max_step is given), and the relative drop (positive: better)."""
    inside = [s for s in steps_inside(points, minutes_at, budget_min, max_step) if s > 0]
    start = points.get(0, float("nan"))
    tail = inside[-last:]
    end = mean(points[s] for s in tail)
    return {"start": start, "end": end, "drop": (start - end) / start if start else float("nan"),
            "steps": tail, "minutes": [round(minutes_at[s], 1) for s in tail]}


def curve(points: dict[int, float], minutes_at: dict[int, float], budget_min: float,
          max_step: int | None = None) -> dict[str, list]:
    """A set's CER at every evaluation inside the budget, with its step and minute (for plots)."""
    steps = steps_inside(points, minutes_at, budget_min, max_step)
    return {"steps": steps, "minutes": [round(minutes_at[s], 2) for s in steps], "cer": [points[s] for s in steps]}


def eval_sets(metric_keys) -> dict[str, str]:
    """EVAL_SETS, then each held-out acoustic condition the run logged (and its weight
    average's, under ema/)."""
    names = sorted({k[len(CONDITIONS_PREFIX):-len("/cer")] for k in metric_keys
                    if k.startswith(CONDITIONS_PREFIX) and k.endswith("/cer") and k.count("/") == 3})
    return {**EVAL_SETS, **{f"{ema}heldout_conditions/{n}": f"eval/{ema}heldout_conditions/{n}/cer"
                            for ema in ("", "ema/") for n in names}}


def _suffixes(name: str) -> tuple[str, ...]:
    """Per-language columns for dev and the held-out voices; a condition overall only."""
    return ("", *(f"/{lang}" for lang in LANGUAGES)) if name in EVAL_SETS else ("",)


def run_quality(client: MlflowClient, run, budget_min: float, last: int, window: int,
                max_step: int | None = None) -> dict:
    rid = run.info.run_id
    wall = history(client, rid, "perf/wall_clock")
    minutes_at = {0: 0.0, **{s: v / 60 for s, v in wall.items()}}
    # The Hydra overrides: a param of their own (older runs were named by them).
    overrides = run.data.params.get("overrides", run.info.run_name)
    # The last step the row reads from: the budget's (minutes, and steps under --max-step), not the run's end.
    read = steps_inside(wall, minutes_at, budget_min, max_step)
    row = {"run_id": rid, "run_name": portable(run.info.run_name), "overrides": portable(overrides),
           "seed": run.data.params.get("seed"),
           "steps": read[-1] if read else 0, "minutes": round(minutes_at[read[-1]], 1) if read else 0.0}
    for name, key in eval_sets(run.data.metrics).items():
        for suffix in _suffixes(name):
            points = history(client, rid, key + suffix)
            if points:
                row[f"{name}{suffix}"] = eval_summary(points, minutes_at, budget_min, last, max_step)
                if not suffix:
                    row.setdefault("curves", {})[name] = curve(points, minutes_at, budget_min, max_step)
    for key in REWARDS + LANGUAGE_REWARDS:
        values = history(client, rid, key)
        steps = steps_inside(values, minutes_at, budget_min, max_step)
        if steps:
            row[key] = {"first": mean(values[s] for s in steps[:window]),
                        "last": mean(values[s] for s in steps[-window:])}
    return row


# What bench/rl_quality.sh sets on every run: a lone run's label leaves them out.
HARNESS_OVERRIDES = ("experiment", "overlap", "placement", "logger.experiment_name")


def labels(rows: list[dict]) -> list[str]:
    """Each run's Hydra overrides (comma-separated) without the overrides every
    run shares, or for a lone run without the harness' own: what tells the runs apart
    ("defaults" for a run with none of its own)."""
    # The MLflow experiment's name never changes what a run trains (runs added with --also differ in it).
    parts = [[p for p in r["overrides"].split(",") if not p.startswith("logger.experiment_name=")] for r in rows]
    common = (set.intersection(*map(set, parts)) if len(parts) > 1
              else {p for ps in parts for p in ps if p.split("=", 1)[0] in HARNESS_OVERRIDES})
    names = [",".join(p for p in ps if p not in common) or "defaults" for ps in parts]
    # Runs with the same overrides (a seed rerun from another checkpoint or code): their ids tell them apart.
    return [f"{n} (run {r['run_id'][:8]})" if names.count(n) > 1 else n for n, r in zip(names, rows)]


def variants(rows: list[dict]) -> dict[str, list[dict]]:
    """The runs grouped by their label without the seed: one variant, its seeds."""
    groups: dict[str, list[dict]] = {}
    for name, row in zip(labels(rows), rows):
        variant = ",".join(p for p in name.split(",") if not p.startswith("seed=")) or "defaults"
        groups.setdefault(variant, []).append(row)
    return groups


def first_last_table(names: list[str], rows: list[dict], keys: tuple[str, ...]) -> list[str]:
    lines = ["| run | " + " | ".join(f"{k}: first -> last" for k in keys) + " |", "|" + " --- |" * (len(keys) + 1)]
    for name, r in zip(names, rows):
        lines.append(f"| {name} | " + " | ".join(
            f"{r[k]['first']:.3f} -> {r[k]['last']:.3f}" if k in r else "-" for k in keys) + " |")
    return lines


def table(rows: list[dict]) -> str:
    conditions = {k for r in rows for k in r if k.startswith(("heldout_conditions/", "ema/heldout_conditions/"))}
    sets = list(EVAL_SETS) + sorted(conditions, key=lambda k: (k.startswith("ema/"), k))   # the policy's first
    cols = [f"{name}{suffix}" for name in sets for suffix in _suffixes(name) if any(f"{name}{suffix}" in r for r in rows)]
    names = labels(rows)
    lines = ["| run | steps (min) | " + " | ".join(f"{c} CER: start -> end (drop)" for c in cols) + " |",
             "|" + " --- |" * (len(cols) + 2)]
    for name, r in zip(names, rows):
        cells = [f"{100 * r[c]['start']:.1f} -> {100 * r[c]['end']:.1f}% ({100 * r[c]['drop']:+.1f}%)"
                 if c in r else "-" for c in cols]
        lines.append(f"| {name} | {r['steps']} ({r['minutes']}) | " + " | ".join(cells) + " |")
    for keys in (REWARDS, LANGUAGE_REWARDS):
        if any(k in r for r in rows for k in keys):
            lines += ["", *first_last_table(names, rows, keys)]
    return "\n".join(lines)


def kept_rows(path: str, rows: list[dict], minutes: float, last: int, max_step: int | None = None) -> list[dict]:
    """The runs of an earlier quality.json that `rows` do not hold, measured the same way."""
    with open(path) as f:
        earlier = json.load(f)
    then = (earlier["minutes"], earlier["last"], earlier.get("max_step"))
    if then != (minutes, last, max_step):
        raise SystemExit(f"rl_quality: {path} was measured with --minutes {then[0]} --last {then[1]} "
                         f"--max-step {then[2]}, not {minutes}, {last} and {max_step}")
    have = {r["run_id"] for r in rows}
    return [r for r in earlier["runs"] if r["run_id"] not in have]


def added_runs(client: MlflowClient, run_ids: list[str]) -> list:
    runs = []
    for rid in run_ids:
        try:
            runs.append(client.get_run(rid))
        except MlflowException as exc:
            raise SystemExit(f"rl_quality: --also {rid}: {exc.message}") from None
    return runs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--experiment", required=True)
    p.add_argument("--tracking-uri", default="sqlite:///outputs/mlflow.db")
    p.add_argument("--minutes", type=float, default=45.0, help="time budget: evaluations after it are left out")
    p.add_argument("--max-step", type=int, default=None, help="step budget: evaluations after it are left out")
    p.add_argument("--last", type=int, default=3, help="evaluations averaged at the end")
    p.add_argument("--window", type=int, default=50, help="steps averaged for the early and late rewards")
    p.add_argument("--out", default="")
    p.add_argument("--keep", default="", help="an earlier quality.json whose runs stay in the table")
    p.add_argument("--also", action="append", default=[], metavar="RUN_ID",
                   help="a run of another experiment in this store to add (e.g. a baseline); repeatable")
    p.add_argument("--plot", default="", help="a PNG of CER against minutes, each variant's mean and spread over seeds")
    p.add_argument("--versus", default="", metavar="VARIANT",
                   help="pair every other variant with this one (e.g. defaults), seed by seed from the same checkpoint")
    args = p.parse_args()
    client = MlflowClient(tracking_uri=args.tracking_uri)
    try:
        runs = experiment_runs(client, args.experiment)
    except ValueError as exc:
        raise SystemExit(f"rl_quality: {exc}") from None
    runs = added_runs(client, args.also) + list(runs)
    rows = [run_quality(client, r, args.minutes, args.last, args.window, args.max_step)
            for r in runs if "perf/wall_clock" in r.data.metrics]
    if args.keep:
        rows = kept_rows(args.keep, rows, args.minutes, args.last, args.max_step) + rows
    if args.out:
        with open(args.out, "w") as f:
            f.write(json.dumps({"minutes": args.minutes, "max_step": args.max_step, "last": args.last,
                                "runs": rows}, indent=1) + "\n")
    if args.plot:
        from asr_grpo.tracking.plots import cer_over_minutes
        cer_over_minutes(variants([r for r in rows if "curves" in r]), args.plot)
    print(table(rows))
    if args.versus:
        print("\n" + paired_table(variants(rows), args.versus))


if __name__ == "__main__":
    main()
