"""Each RL step's overlap plan, recorded with its MLflow run as `plans.jsonl` (one JSON
line a step, keyed by the scheduler's 0-based step), so `overlap.replay_plan=<run id>`
can repeat the run. The lines are the overlap layer's (`overlap.planners.plan_record`);
this module only stores and reads them."""
from __future__ import annotations

import json
from typing import Mapping

import mlflow
from mlflow.exceptions import MlflowException

from asr_grpo.config.validate import ConfigError
from asr_grpo.tracking.mlflow_run import absolute_tracking_uri

PLANS = "plans.jsonl"


def log_plans(plans: Mapping[int, dict]) -> None:
    """The whole record into the active run. An artifact cannot be appended to: written
    again after every step, a run that stops still holds every step it logged."""
    mlflow.log_text("".join(json.dumps(plans[s], sort_keys=True) + "\n" for s in sorted(plans)), PLANS)


def read_plans(logger_cfg, run_id: str) -> dict[int, dict]:
    """Run `run_id`'s record by step; a ConfigError naming the run when there is no such
    run or it recorded no plan (the CLI prints it as one line)."""
    uri = absolute_tracking_uri(logger_cfg.tracking_uri)
    client = mlflow.MlflowClient(uri)
    try:
        run = client.get_run(run_id)
    except MlflowException:
        raise ConfigError(f"overlap.replay_plan={run_id}: no MLflow run of that id at {uri}") from None
    try:
        text = mlflow.artifacts.load_text(f"{run.info.artifact_uri}/{PLANS}")
    except Exception:   # MLflow raises its own error types per store for a missing file
        text = ""
    plans = {int(rec["step"]): rec for rec in map(json.loads, filter(str.strip, text.splitlines()))}
    if not plans:
        raise ConfigError(f"overlap.replay_plan={run_id}: run {run.info.run_name!r} ({run.info.status}) recorded "
                          f"no plans ({PLANS}): not an RL run, one from before plans were recorded, or one that "
                          "stopped before its first step")
    return plans
