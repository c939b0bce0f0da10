"""Hydra multirun sweeps as one MLflow parent run with a child run per job.

`python -m asr_grpo.run -m overlap=none,oppo seed=0,1` runs its jobs one after another
in one process (Hydra's basic launcher). `SweepCallback` (registered under
`hydra.callbacks` in conf/config.yaml):
- before the first job, creates the sweep's parent run (tags `sweep=<id>`,
  `sweep_role=parent`) and writes `<sweep dir>/sweep.json` for the jobs;
- after each job, appends its outcome to `<sweep dir>/sweep_jobs.jsonl` and logs a
  failure loudly (the sweep goes on);
- after the last job, logs the job table to the parent run, ends it (FAILED if any job
  failed), prints the table and the compare command, and exits non-zero if a job failed.

SIGTERM or SIGINT (recipes/stop.py) stops the sweep: the job in flight ends as a run does
(its step finished or abandoned, checkpointed, its MLflow run KILLED) and is recorded
KILLED with the command that resumes it; the jobs after it are recorded SKIPPED without
starting; the parent run ends KILLED and the process exits 128 + the signal.

Each job (`SweepJob`) tags its run `sweep=<id>`, `mlflow.parentRunId=<parent>`,
`sweep_job=<n>`, writes its checkpoints into its own multirun folder, and turns an
exception into a FAILED record instead of ending the sweep. A local Ray lives for one
job (the recipe starts and shuts it down); on a shared cluster (`placement.ray_address`)
the jobs keep one connection and each frees its actors and placement group.
"""
from __future__ import annotations

import json
import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from asr_grpo.recipes.stop import RunStopped, stop_signals

log = logging.getLogger(__name__)

SWEEP_FILE = "sweep.json"
JOBS_FILE = "sweep_jobs.jsonl"
SWEEP_TAG = "sweep"


def _is_multirun(config: DictConfig) -> bool:
    from hydra.types import RunMode

    return OmegaConf.select(config, "hydra.mode") == RunMode.MULTIRUN


def _client(tracking_uri: str):
    from mlflow.tracking import MlflowClient

    from asr_grpo.tracking.mlflow_run import _ensure_sqlite_parent, absolute_tracking_uri

    uri = absolute_tracking_uri(tracking_uri)
    _ensure_sqlite_parent(uri)
    return MlflowClient(uri), uri


def read_jobs(sweep_dir: str | Path) -> list[dict]:
    path = Path(sweep_dir) / JOBS_FILE
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def jobs_table(jobs: list[dict]) -> str:
    lines = []
    for j in jobs:
        run = f"run {j['run_id']}" if j.get("run_id") else "no MLflow run"
        line = f"  #{j['num']} {j['overrides'] or '(no overrides)'}: {j['status']}, {run}, {j['seconds']:.0f} s"
        lines.append(line + (f"\n      {j['error']}" if j.get("error") else ""))
    return "\n".join(lines)


class SweepCallback(Callback):
    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        from asr_grpo.tracking.mlflow_run import ensure_experiment

        sweep_dir = Path(config.hydra.sweep.dir).resolve()
        sweep_dir.mkdir(parents=True, exist_ok=True)
        name = OmegaConf.select(config, "hydra.runtime.choices.experiment") or "sweep"
        sweep_id = f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
        stop_signals().install()   # a signal between jobs is noted; the next job does not start
        client, uri = _client(config.logger.tracking_uri)
        experiment_id = ensure_experiment(client, config.logger.experiment_name, uri)
        overrides = " ".join(OmegaConf.to_container(config.hydra.overrides.task, resolve=False))
        params = OmegaConf.select(config, "hydra.sweeper.params")   # sweeps an experiment file declares
        if params:
            overrides = " ".join([overrides, *(f"{k}={v}" for k, v in params.items())]).strip()
        parent = client.create_run(experiment_id, run_name=sweep_id, tags={
            SWEEP_TAG: sweep_id, "sweep_role": "parent", "stage": "sweep",
            "sweep_dir": str(sweep_dir), "sweep_overrides": overrides})
        info = {"sweep_id": sweep_id, "parent_run_id": parent.info.run_id, "tracking_uri": uri,
                "experiment_name": config.logger.experiment_name, "sweep_dir": str(sweep_dir),
                "overrides": overrides}
        (sweep_dir / SWEEP_FILE).write_text(json.dumps(info, indent=2))
        log.info("sweep %s: MLflow parent run %s in %s; jobs under %s",
                 sweep_id, parent.info.run_id, uri, sweep_dir)

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        if not _is_multirun(config):
            return
        from hydra.core.utils import JobStatus

        value = job_return._return_value   # .return_value re-raises a failed job's exception
        if job_return.status == JobStatus.FAILED:   # raised outside SweepJob.run
            value = {"status": "FAILED", "error": f"{type(value).__name__}: {value}"}
        value = value if isinstance(value, dict) else {}
        record = {"num": int(config.hydra.job.num), "overrides": config.hydra.job.override_dirname,
                  "status": value.get("status", "FINISHED"), "run_id": value.get("mlflow_run_id"),
                  "error": value.get("error"), "seconds": float(value.get("job_seconds", 0.0)),
                  "output_dir": config.hydra.runtime.output_dir}
        sweep_dir = Path(config.hydra.sweep.dir)
        with open(sweep_dir / JOBS_FILE, "a") as fh:
            fh.write(json.dumps(record) + "\n")
        if record["status"] == "FAILED":
            log.error("sweep job #%d (%s) FAILED: %s; the sweep goes on", record["num"], record["overrides"],
                      record["error"])

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        info = json.loads((sweep_dir / SWEEP_FILE).read_text())
        jobs = read_jobs(sweep_dir)
        failed = [j for j in jobs if j["status"] != "FINISHED"]
        client, _ = _client(info["tracking_uri"])
        parent = info["parent_run_id"]
        client.log_text(parent, json.dumps(jobs, indent=2), "sweep_jobs.json")
        client.log_metric(parent, "sweep/jobs", len(jobs))
        client.log_metric(parent, "sweep/jobs_failed", len(failed))
        stop = stop_signals()
        client.set_terminated(parent, status="KILLED" if stop.requested else "FAILED" if failed else "FINISHED")
        summary = (f"sweep {info['sweep_id']}: {len(jobs) - len(failed)} of {len(jobs)} jobs finished "
                   f"(MLflow parent run {parent})\n{jobs_table(jobs)}\n"
                   f"report: python -m asr_grpo.compare sweep={info['sweep_id']}")
        print(summary, flush=True)
        if stop.requested:   # 143 / 130, as a run stopped by the signal; the table names the job to resume
            killed = [f"#{j['num']}" for j in jobs if j["status"] == "KILLED"]
            stopped = stop.stopped(f"job {', '.join(killed) or 'none'} stopped, the jobs after it skipped")
            print(f"sweep {info['sweep_id']}: {stopped} (the table above gives the command resuming a stopped job)",
                  file=sys.stderr, flush=True)
            raise SystemExit(stopped.exit_code)
        if failed:   # exit status 1: Hydra turns a callback's exceptions into warnings, not SystemExit
            raise SystemExit(f"sweep {info['sweep_id']}: {len(failed)} of {len(jobs)} jobs failed: "
                             + "; ".join(f"#{j['num']} ({j['overrides']}): {j['error']}" for j in failed))


@dataclass
class SweepJob:
    """The running job of a multirun, as Hydra and the sweep callback describe it."""
    sweep_id: str
    parent_run_id: Optional[str]
    num: int
    overrides: str
    output_dir: str
    explicit_keys: tuple[str, ...]

    @property
    def tags(self) -> dict[str, str]:
        tags = {SWEEP_TAG: self.sweep_id, "sweep_role": "job", "sweep_job": str(self.num),
                "sweep_overrides": self.overrides}
        if self.parent_run_id:
            tags["mlflow.parentRunId"] = self.parent_run_id
        return tags

    def prepare(self, cfg: DictConfig) -> None:
        """Checkpoints go into the job's multirun folder (jobs must not share
        trainer.output_dir), unless the command line sets trainer.output_dir. On a shared
        cluster (placement.ray_address) the jobs keep one driver connection."""
        if "trainer.output_dir" not in self.explicit_keys:
            cfg.trainer.output_dir = str(Path(self.output_dir) / "checkpoints")
        if cfg.placement.ray_address:
            from asr_grpo.distributed.ray_cluster import keep_joined_connection

            keep_joined_connection()

    def run(self, train: Callable[[], dict], resume: Callable[[], str]) -> dict:
        """`train()`, with a failure turned into a FAILED record (the sweep goes on) and a
        stop by a signal into a KILLED one naming `resume()`, the command that continues
        it; once a signal came, the jobs left are SKIPPED."""
        t0 = time.monotonic()
        stop = stop_signals().install()
        if stop.requested:
            return {"status": "SKIPPED", "error": "the sweep was stopped before this job", "job_seconds": 0.0}
        try:
            with stop.immediate():
                result = {"status": "FINISHED", **train()}
        except RunStopped as stopped:
            result = {"status": "KILLED", "error": f"{stopped}; resume this job with: {resume()}"}
        except Exception as e:   # noqa: BLE001 - any failure of one job is that job's
            log.exception("sweep %s job #%d (%s) failed", self.sweep_id, self.num, self.overrides)
            result = {"status": "FAILED", "error": f"{type(e).__name__}: {e}"}
        finally:
            _disconnect_ray()
        result["job_seconds"] = time.monotonic() - t0
        return result


def _disconnect_ray() -> None:
    """The next job starts with no local Ray left behind by this one (a shared cluster's
    connection stays: see ray_cluster.keep_joined_connection)."""
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        from asr_grpo.distributed.ray_cluster import shutdown_ray

        shutdown_ray()


def current_sweep_job() -> Optional[SweepJob]:
    """The sweep job being run, or None outside a Hydra multirun."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    try:
        hc = HydraConfig.get()
    except ValueError:   # not under @hydra.main
        return None
    if hc.mode != RunMode.MULTIRUN:
        return None
    sweep_file = Path(hc.sweep.dir) / SWEEP_FILE
    info = json.loads(sweep_file.read_text()) if sweep_file.is_file() else {}
    explicit = tuple(o.split("=", 1)[0].lstrip("+~") for o in hc.overrides.task)
    return SweepJob(sweep_id=info.get("sweep_id", Path(hc.sweep.dir).name), parent_run_id=info.get("parent_run_id"),
                    num=int(hc.job.num), overrides=hc.job.override_dirname, output_dir=hc.runtime.output_dir,
                    explicit_keys=explicit)
