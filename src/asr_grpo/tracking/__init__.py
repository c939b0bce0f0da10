"""Experiment tracking: MLflow runs, timers."""
from asr_grpo.tracking.busy import BusyClock, busy
from asr_grpo.tracking.mlflow_run import MlflowRun, absolute_tracking_uri, flatten_config

__all__ = ["BusyClock", "busy", "MlflowRun", "absolute_tracking_uri", "flatten_config"]
