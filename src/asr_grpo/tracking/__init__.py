"""Experiment tracking: MLflow runs, timers, the rollout's metrics.

MLflow loads when one of its names is first asked for, not with the package: the
scheduler (and so the forecast) takes `rollout_metrics` from here without it."""
from asr_grpo.tracking.busy import BusyClock, busy

_MLFLOW_NAMES = ("MlflowRun", "absolute_tracking_uri", "flatten_config")

__all__ = ["BusyClock", "busy", *_MLFLOW_NAMES]


def __getattr__(name: str):
    if name in _MLFLOW_NAMES:
        from asr_grpo.tracking import mlflow_run

        return getattr(mlflow_run, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
