"""The driver's SIGTERM/SIGINT handling (recipes/stop.py) in this process, with real
signals: at once where no step is in flight, at the step's end within the grace period,
abandoned past it or at a second signal; ray.init does not take SIGTERM back; an MLflow
run a signal stops ends KILLED; a sweep records the stopped job KILLED with its resume
command and skips the rest. The whole command under a signal: tests/faults/test_fault_signals.py."""
from __future__ import annotations

import os
import signal
import time

import pytest

from asr_grpo.distributed import ray_cluster
from asr_grpo.recipes import stop as stop_module
from asr_grpo.recipes.stop import RunStopped, StopSignals
from asr_grpo.sweep import SweepJob
from asr_grpo.tracking.mlflow_run import end_status


@pytest.fixture
def stop(monkeypatch):
    """A fresh process-wide StopSignals, installed; pytest's own handlers back afterwards."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    fresh = StopSignals()
    monkeypatch.setattr(stop_module, "_process", fresh)
    yield fresh.install()
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def send(sig: int) -> None:
    os.kill(os.getpid(), sig)
    time.sleep(0.05)   # the handler runs in this (the main) thread at the next bytecode


def test_no_step_in_flight_stops_at_once(stop):
    with pytest.raises(RunStopped, match="stopped by SIGTERM: before a step") as stopped:
        with stop.immediate():
            send(signal.SIGTERM)
    assert stopped.value.exit_code == 143


def test_a_step_in_flight_finishes_and_the_stop_is_seen_at_its_end(stop):
    with stop.immediate(), stop.deferred():
        with stop.grace(5.0):
            send(signal.SIGINT)
            time.sleep(0.3)   # the rest of the step
        assert stop.requested and stop.signum == signal.SIGINT
        time.sleep(0.1)   # the checkpoint: no signal handling may interrupt it
    assert stop.stopped("x").exit_code == 130


def test_a_step_past_the_grace_is_abandoned(stop):
    t0 = time.monotonic()
    with pytest.raises(RunStopped, match="abandoned: not finished 0.3 s after the signal"):
        with stop.deferred(), stop.grace(0.3):
            send(signal.SIGTERM)
            time.sleep(10)   # a step that will not finish (the handler interrupts the sleep)
    assert time.monotonic() - t0 < 3


def test_a_second_signal_abandons_the_step_at_once(stop):
    with pytest.raises(RunStopped, match="a second SIGINT abandoned the step"):
        with stop.deferred(), stop.grace(60.0):
            send(signal.SIGINT)
            send(signal.SIGINT)


def test_zero_grace_abandons_at_the_signal(stop):
    with pytest.raises(RunStopped, match=r"abandoned \(trainer.stop_grace_s=0\)"):
        with stop.deferred(), stop.grace(0.0):
            send(signal.SIGTERM)


def test_a_stop_that_c_code_wrapped_comes_out_as_itself(stop):
    """Raised by the handler while Ray's Cython called back into Python, the stop becomes
    the cause of a SystemError; the step's end unwraps it."""
    with pytest.raises(RunStopped, match="stopped by SIGTERM: x"):
        with stop.deferred(), stop.grace(5.0):
            try:
                raise stop.stopped("x")
            except RunStopped as stopped:
                raise SystemError("<built-in method __new__> returned a result with an exception set") from stopped


def test_a_stop_that_ray_replaced_by_its_own_keyboard_interrupt_comes_out_as_itself(stop):
    """ray.get, waiting, runs the handler; it turns the stop into a plain KeyboardInterrupt."""
    with pytest.raises(RunStopped, match="a second SIGTERM abandoned the step"):
        with stop.deferred(), stop.grace(60.0):
            try:
                send(signal.SIGTERM)
                send(signal.SIGTERM)
            except RunStopped:
                raise KeyboardInterrupt() from None


def test_between_steps_a_signal_is_only_noted(stop):
    with stop.deferred():
        send(signal.SIGTERM)
        send(signal.SIGTERM)
    assert stop.signum == signal.SIGTERM


def test_the_grace_ends_with_the_step(stop):
    """A step that finishes in its grace leaves no timer to interrupt what comes after."""
    with stop.deferred():
        with stop.grace(0.2):
            send(signal.SIGTERM)
        time.sleep(0.5)


def test_ray_init_leaves_the_drivers_sigterm_handler(stop):
    with ray_cluster._keeping_sigterm_handler():
        signal.signal(signal.SIGTERM, lambda *_: None)   # what ray.init does
    assert signal.getsignal(signal.SIGTERM) == stop._on_signal


@pytest.mark.parametrize("exc, status", [(None, "FINISHED"), (ValueError, "FAILED"), (RunStopped, "KILLED"),
                                         (KeyboardInterrupt, "KILLED")])
def test_mlflow_status_of_how_the_run_ended(exc, status):
    assert end_status(exc) == status


def test_a_sweep_stopped_by_a_signal_records_the_job_killed_and_skips_the_rest(stop):
    job = SweepJob(sweep_id="s", parent_run_id=None, num=0, overrides="seed=0", output_dir="/tmp/x",
                   explicit_keys=())

    def run_until_the_signal() -> dict:
        send(signal.SIGTERM)
        return {}

    first = job.run(run_until_the_signal, resume=lambda: "python -m asr_grpo.run RESUME")
    assert first["status"] == "KILLED"
    assert first["error"] == ("stopped by SIGTERM: before a step of this run finished; "
                              "resume this job with: python -m asr_grpo.run RESUME")
    started = []
    later = job.run(lambda: started.append(1) or {}, resume=lambda: "unused")
    assert later["status"] == "SKIPPED" and not started


def test_a_stopped_sweep_ends_its_parent_run_killed_and_exits_as_the_signal(stop, tmp_path, capsys):
    import json

    import mlflow
    from omegaconf import OmegaConf

    from asr_grpo.sweep import JOBS_FILE, SWEEP_FILE, SweepCallback

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = mlflow.MlflowClient(uri)
    parent = client.create_run(client.create_experiment("sweep")).info.run_id
    (tmp_path / SWEEP_FILE).write_text(json.dumps({"sweep_id": "s1", "parent_run_id": parent, "tracking_uri": uri}))
    jobs = [{"num": 0, "overrides": "seed=0", "status": "KILLED", "run_id": None, "seconds": 9.0,
             "error": "stopped by SIGTERM: after step 3 (checkpoint step_000003); resume this job with: CMD"},
            {"num": 1, "overrides": "seed=1", "status": "SKIPPED", "run_id": None, "seconds": 0.0,
             "error": "the sweep was stopped before this job"}]
    (tmp_path / JOBS_FILE).write_text("".join(json.dumps(j) + "\n" for j in jobs))
    stop.signum = signal.SIGTERM
    with pytest.raises(SystemExit) as exited:
        SweepCallback().on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}}))
    assert exited.value.code == 143
    assert client.get_run(parent).info.status == "KILLED"
    out, err = capsys.readouterr()
    assert "#0 seed=0: KILLED" in out and "resume this job with: CMD" in out and "#1 seed=1: SKIPPED" in out
    assert "sweep s1: stopped by SIGTERM: job #0 stopped, the jobs after it skipped" in err
