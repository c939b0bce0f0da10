"""Per-phase step times of an experiment's RL runs (median and max over steps), with
held-out CER (dev and held-out voices) by step and the weight-sync check's gap: what
`compare`'s table leaves out.

    python bench/run_phases.py --experiment NAME [--tracking-uri URI] [--out phases.json]
"""
from __future__ import annotations

import argparse
import json
import statistics

from mlflow.tracking import MlflowClient

from asr_grpo.tracking.runs import experiment_runs, history

EVALS = ("eval/cer", "eval/heldout_voices/cer")
PHASES = ("perf/time/step", "perf/time/rollout", "perf/time/scoring_wall", "perf/time/training", "perf/time/sync",
          "perf/time/sync_check", "reward/total", "rollout/sync/max_abs_diff", "perf/decode/prefix_cache_hit")


def run_phases(client: MlflowClient, run) -> dict:
    rid = run.info.run_id
    row = {"run_id": rid, "run_name": run.info.run_name, "status": run.info.status,
           "rollout.engine": run.data.params.get("rollout.engine"),
           **{key: sorted(map(list, history(client, rid, key).items())) for key in EVALS}}
    for key in PHASES:
        values = list(history(client, rid, key).values())
        if values:
            row[key] = {"median": statistics.median(values), "max": max(values), "steps": len(values)}
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--experiment", required=True)
    p.add_argument("--tracking-uri", default="sqlite:///outputs/mlflow.db")
    p.add_argument("--out", default="")
    args = p.parse_args()
    client = MlflowClient(tracking_uri=args.tracking_uri)
    try:
        runs = experiment_runs(client, args.experiment, "attributes.status = 'FINISHED'")
    except ValueError as exc:
        raise SystemExit(f"run_phases: {exc}") from None
    rl_runs = [r for r in runs if "rollout.engine" in r.data.params]   # not compare's own report run
    text = json.dumps([run_phases(client, r) for r in rl_runs], indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
