"""Which MLflow runs a report compares: a sweep (by tag, or the latest), an experiment's
RL runs, or runs by id."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

SAFE_TAG = re.compile(r"^[\w.:@+-]+$")


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
    if not SAFE_TAG.match(sweep):
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
