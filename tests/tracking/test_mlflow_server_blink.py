"""A tracking server that blinks: a real `mlflow server` on the loopback is stopped after
step 2 of a real run and started again (same store, same port) only once the run has
trained two more steps without it; the run ends normally with every step's metrics in
the server's store. Without asynchronous logging the loop would wait in MLflow's HTTP
retries and the second wait would time out. Metrics that never get there (retries used
up) and the bound on what is in flight are tested on MlflowRun itself, with no server."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from types import SimpleNamespace

import pytest
from fault_injection import wait_for
from helpers import load_bench_script
from mlflow.exceptions import MlflowException

from asr_grpo.models import step_checkpoints as ckpt
from asr_grpo.tracking import mlflow_run
from asr_grpo.tracking.mlflow_run import MlflowRun, TrackingLost, logs_async

pytestmark = pytest.mark.long   # a real run of a minute or more: `make test-long`, CI's own leg


@pytest.fixture
def server(tmp_path):
    folder = tmp_path / "server"
    folder.mkdir()
    srv = load_bench_script("mlflow_server").MlflowServer(folder)
    srv.start()
    yield srv
    srv.stop()


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_run_rides_out_a_tracking_server_blink(root, tmp_path, server):
    out, log = tmp_path / "rl", tmp_path / "run.stderr"
    proc = subprocess.Popen([sys.executable, "-m", "asr_grpo.run", "debug=fast", f"paths.output_root={root}",
                             f"logger.tracking_uri={server.uri}", "logger.log_system_metrics=false",
                             "trainer.steps=6", "trainer.eval_every=0", "trainer.save_every=100",
                             f"trainer.output_dir={out}"], env={**os.environ, "RAY_ADDRESS": ""},
                            start_new_session=True, stdout=subprocess.DEVNULL, stderr=open(log, "w"))
    try:
        wait_for(lambda: "| 2/6" in log.read_text() or proc.poll() is not None, 900, "step 2", period_s=0.05)
        assert proc.poll() is None, log.read_text()[-3000:]
        server.stop()
        # Training goes on without the server: two more steps.
        wait_for(lambda: "| 4/6" in log.read_text() or proc.poll() is not None, 300, "steps 3 and 4 without the server")
        assert proc.poll() is None or proc.returncode == 0, log.read_text()[-3000:]
        server.start()
        assert proc.wait(timeout=900) == 0, log.read_text()[-5000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    import mlflow

    client = mlflow.MlflowClient(server.uri)
    run_id = ckpt.read_driver_state(out / "step_000006")["mlflow_run_id"]
    assert client.get_run(run_id).info.status == "FINISHED"
    for key in ("reward/total", "loss/policy", "perf/time/step"):
        assert sorted(m.step for m in client.get_metric_history(run_id, key)) == [1, 2, 3, 4, 5, 6], key


class Operations:
    """What MLflow's asynchronous log_metrics returns: `wait()` raises what the batch met."""

    def __init__(self, error: Exception | None = None):
        self.error, self.waited = error, False

    def wait(self) -> None:
        self.waited = True
        if self.error:
            raise self.error


def logger_cfg(**kw):
    return SimpleNamespace(**{"tracking_uri": "http://127.0.0.1:5000", "experiment_name": "x", "run_name": "",
                              "log_system_metrics": False, "async_logging": None, "async_max_pending": 2, **kw})


def test_async_logging_is_on_for_a_server_and_off_for_a_local_store():
    assert logs_async(logger_cfg())
    assert not logs_async(logger_cfg(tracking_uri="sqlite:////tmp/mlflow.db"))
    assert logs_async(logger_cfg(tracking_uri="sqlite:////tmp/mlflow.db", async_logging=True))
    assert not logs_async(logger_cfg(async_logging=False))


def test_past_the_bound_the_loop_waits_for_the_oldest_and_a_lost_batch_is_one_clear_error(monkeypatch):
    lost_batch = MlflowException("API request to /api/2.0/mlflow/runs/log-batch failed: Max retries exceeded")
    sent = [Operations(lost_batch), Operations(), Operations()]
    handed = iter(sent)
    monkeypatch.setattr(mlflow_run.mlflow, "log_metrics", lambda metrics, step, synchronous: next(handed))
    run = MlflowRun(logger_cfg(), "r")
    run.log_metrics({"a": 1.0}, step=1)
    run.log_metrics({"a": 2.0}, step=2)
    assert not any(op.waited for op in sent)   # two in flight: the bound
    with pytest.raises(TrackingLost) as lost:
        run.log_metrics({"a": 3.0}, step=3)   # a third: the loop waits for the oldest, step 1, which was lost
    assert [op.waited for op in sent] == [True, False, False]
    assert str(lost.value) == ("MLflow at http://127.0.0.1:5000 did not take the metrics of step 1 within its "
                               "retries (MLFLOW_HTTP_REQUEST_MAX_RETRIES): API request to "
                               "/api/2.0/mlflow/runs/log-batch failed: Max retries exceeded")
