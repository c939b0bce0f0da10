"""MLflow tracking for every run: flattened config as params, namespaced metrics,
config + summary as artifacts. Local SQLite store under outputs/ by default."""
from __future__ import annotations

import json
import logging
import math
import os
from collections import deque
from pathlib import Path
from typing import Any, Mapping

import mlflow
from mlflow.exceptions import MlflowException
from omegaconf import DictConfig, OmegaConf

from asr_grpo.config.errors import first_line
from asr_grpo.config.schema import LoggerConfig

log = logging.getLogger(__name__)

# MLflow caps a param value at 6000 chars; the config's long lists are cut at 500 (the full
# config is an artifact), a param logged by name (e.g. the command's overrides) at the cap.
_MAX_PARAM_LEN = 500
_MLFLOW_PARAM_CAP = 6000


def flatten_config(cfg: DictConfig | Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    container = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else cfg
    flat: dict[str, str] = {}
    for key, value in container.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten_config(value, prefix=f"{name}."))
        else:
            flat[name] = str(value)[:_MAX_PARAM_LEN]
    return flat


def _ensure_sqlite_parent(uri: str) -> None:
    if uri.startswith("sqlite:///"):
        Path(uri[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)


def absolute_tracking_uri(uri: str) -> str:
    """sqlite:///relative/path -> sqlite:////abs/path so runs land in one store whatever the cwd."""
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        return "sqlite:///" + os.path.abspath(uri[len("sqlite:///"):])
    return uri


def ensure_experiment(client, name: str, tracking_uri: str) -> str:
    """The id of experiment `name`, created when missing. With a SQLite store its artifacts
    go next to the database (`<db folder>/mlartifacts/`), not MLflow's default `./mlruns`
    of whatever the working directory was: a Ray job runs in a temporary copy of the code."""
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    location = None
    if tracking_uri.startswith("sqlite:///"):
        location = str(Path(tracking_uri[len("sqlite:///"):]).parent / "mlartifacts")
    try:
        return client.create_experiment(name, artifact_location=location)
    except MlflowException:   # created meanwhile by a concurrent job
        return client.get_experiment_by_name(name).experiment_id


def end_status(exc_type: type[BaseException] | None) -> str:
    """FINISHED; FAILED on an error; KILLED when a signal stopped the run (KeyboardInterrupt,
    the recipes' RunStopped: BaseExceptions that are not errors of the run)."""
    if exc_type is None:
        return "FINISHED"
    return "FAILED" if issubclass(exc_type, Exception) else "KILLED"


class TrackingLost(RuntimeError):
    """Metrics MLflow could not deliver: the tracking server stayed unreachable past its retries."""


def logs_async(logger_cfg: LoggerConfig) -> bool:
    """`logger.async_logging`, null meaning: for a tracking server (it can blink), not a local store."""
    if logger_cfg.async_logging is not None:
        return bool(logger_cfg.async_logging)
    return logger_cfg.tracking_uri.startswith(("http://", "https://"))


class MlflowRun:
    """One MLflow run as a context manager; `log_metrics` drops non-finite values loudly.

    With `logger.async_logging` the metrics go from MLflow's background thread: the loop
    does not wait for the store, and a server that is down is retried (MLflow's HTTP
    retries) while training goes on, the metrics landing when it returns. At most
    `logger.async_max_pending` steps are in flight; past that the loop waits for the
    oldest. A batch that ran out of retries raises `TrackingLost` (at that wait, or at the
    run's end, which waits for all)."""

    def __init__(self, logger_cfg: LoggerConfig, run_name: str, config: DictConfig | None = None,
                 tags: Mapping[str, str] | None = None, resume_run_id: str | None = None):
        self.cfg = logger_cfg
        self.run_name = logger_cfg.run_name or run_name
        self.config = config
        self.tags = dict(tags or {})
        self.resume_run_id = resume_run_id
        self.run = None
        self.synchronous = not logs_async(logger_cfg)
        self._pending: deque = deque()   # (step, MLflow's RunOperations) not yet waited for

    def __enter__(self) -> "MlflowRun":
        uri = absolute_tracking_uri(self.cfg.tracking_uri)
        _ensure_sqlite_parent(uri)
        mlflow.set_tracking_uri(uri)
        mlflow.set_experiment(experiment_id=ensure_experiment(mlflow.MlflowClient(uri), self.cfg.experiment_name, uri))
        if self.cfg.log_system_metrics:
            mlflow.set_system_metrics_sampling_interval(self.cfg.system_metrics_interval_s)
        if self.resume_run_id:
            # A resumed training run continues the same MLflow run (params were logged then).
            self.run = mlflow.start_run(run_id=self.resume_run_id,
                                        log_system_metrics=self.cfg.log_system_metrics)
            log.info("MLflow run %s resumed", self.resume_run_id)
            return self
        self.run = mlflow.start_run(run_name=self.run_name, tags=self.tags,
                                    log_system_metrics=self.cfg.log_system_metrics)
        if self.config is not None:
            mlflow.log_params(flatten_config(self.config))
            mlflow.log_text(OmegaConf.to_yaml(self.config, resolve=True), "config.yaml")
        log.info("MLflow run %s (%s) in %s", self.run.info.run_id, self.run_name, uri)
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self._wait_pending(0)   # the steps logged so far land before the run ends, stopped or not
        except TrackingLost as lost:
            if exc_type is None:
                raise
            log.error("while the run ended on %s: %s", exc_type.__name__, lost)   # that one is the error to raise
        finally:
            mlflow.end_run(status=end_status(exc_type))

    @property
    def run_id(self) -> str:
        return self.run.info.run_id

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        clean = {}
        for key, value in metrics.items():
            value = float(value)
            if math.isfinite(value):
                clean[key] = value
            else:
                log.warning("metric %s=%s at step %d is not finite; not logged", key, value, step)
        if self.synchronous:
            mlflow.log_metrics(clean, step=step)
            return
        self._pending.append((step, mlflow.log_metrics(clean, step=step, synchronous=False)))
        self._wait_pending(self.cfg.async_max_pending)

    def _wait_pending(self, keep: int) -> None:
        """Wait for the oldest batches in flight until at most `keep` are left."""
        while len(self._pending) > keep:
            step, operations = self._pending.popleft()
            try:
                operations.wait()
            except Exception as exc:   # MLflow's own error after its last retry
                raise TrackingLost(f"MLflow at {self.cfg.tracking_uri} did not take the metrics of step {step} "
                                   f"within its retries (MLFLOW_HTTP_REQUEST_MAX_RETRIES): {first_line(exc)}") from exc

    def log_summary(self, summary: Mapping[str, Any], name: str = "summary.json") -> None:
        mlflow.log_text(json.dumps(summary, indent=2, sort_keys=True, default=str), name)

    def log_params(self, params: Mapping[str, Any]) -> None:
        mlflow.log_params({k: str(v)[:_MLFLOW_PARAM_CAP] for k, v in params.items()})

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        mlflow.set_tags({k: str(v) for k, v in tags.items()})
