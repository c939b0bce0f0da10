"""SIGTERM (a cluster's preemption) and SIGINT (Ctrl-C) sent to a real
`python -m asr_grpo.run` mid-step: the step in flight finishes within
`trainer.stop_grace_s` and is checkpointed (or, past the grace, is abandoned), the MLflow
run ends KILLED, no Ray process of the run is left, stderr has one line with the resume
command and no traceback, and the exit status is 128 + the signal. Run as printed, the
resume command continues to the end, equal to the uninterrupted run.

The step is held in flight by the fault reward file's `slow` mode: its reward call
sleeps (then gives the built-in reward, so the numbers are the uninterrupted run's), and
the signal is sent once that call has begun."""
from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
from fault_injection import wait_for
from helpers import compose_cfg, metric_history
from safetensors.torch import load_file

from asr_grpo.models import step_checkpoints as ckpt

pytestmark = [pytest.mark.long, pytest.mark.slow, pytest.mark.timeout(1800)]   # three runs of the command, one after another
GRACE_S = 45   # below a real scheduler's 30-60 s; the test machine may be slow


def start_run(root: Path, fault_reward, out: Path, *overrides: str, grace_s: float = GRACE_S
              ) -> tuple[subprocess.Popen, Path]:
    """The command in a session of its own (a terminal's process group); output to files."""
    log = out.parent / f"{out.name}.stderr"
    args = ["debug=fast", f"paths.output_root={root}", f"reward.reward_file={fault_reward.path}",
            "trainer.eval_every=0", f"trainer.stop_grace_s={grace_s:g}", f"trainer.output_dir={out}", *overrides]
    env = {**os.environ, "RAY_ADDRESS": ""}
    env.pop("HYDRA_FULL_ERROR", None)
    proc = subprocess.Popen([sys.executable, "-m", "asr_grpo.run", *args], env=env, start_new_session=True,
                            stdout=open(out.parent / f"{out.name}.stdout", "w"), stderr=open(log, "w"))
    return proc, log


def group_alive(pgid: int) -> list[str]:
    """The processes of the run's process group still alive: Ray's GCS, raylet and workers
    are started in the driver's group."""
    out = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if os.getpgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                out.append(" ".join(p.info["cmdline"] or [])[:120])
        except (psutil.Error, ProcessLookupError):
            pass
    return out


def stop_mid_step(proc: subprocess.Popen, log: Path, fault_reward, sig: int, after_steps: int,
                  send=os.kill) -> tuple[int, float]:
    """Once `after_steps` steps are done, make the reward calls slow; when one has begun
    (the next step is in flight), send `sig`. Returns (exit status, seconds to exit)."""
    try:
        wait_for(lambda: f"| {after_steps}/" in log.read_text() or proc.poll() is not None, 600,
                 f"step {after_steps} to finish", period_s=0.05)
        assert proc.poll() is None, log.read_text()[-3000:]
        fault_reward.set("slow", seconds=8)
        fault_reward.stalled_pid(timeout_s=120)
        t0 = time.monotonic()
        send(proc.pid, sig)
        fault_reward.set("ok")
        rc = proc.wait(timeout=GRACE_S + 120)
        return rc, time.monotonic() - t0
    finally:
        fault_reward.set("ok")
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def the_stop_line(stderr: str, name: str) -> str:
    assert "Traceback" not in stderr, stderr[-5000:]
    ours = [line for line in stderr.splitlines() if line.startswith("asr_grpo.run: ")]
    assert len(ours) == 1, stderr[-3000:]
    assert ours[0].startswith(f"asr_grpo.run: stopped by {name}: "), ours[0]
    return ours[0]


def assert_killed_and_gone(root: Path, out: Path, pgid: int) -> str:
    run_id = ckpt.read_driver_state(ckpt.latest_checkpoint(out))["mlflow_run_id"]
    import mlflow

    client = mlflow.tracking.MlflowClient(f"sqlite:///{root}/mlflow.db")
    assert client.get_run(run_id).info.status == "KILLED"
    try:
        wait_for(lambda: not group_alive(pgid), 30, "the run's processes to go", period_s=0.5)
    except TimeoutError:
        pytest.fail(f"left running: {group_alive(pgid)}")
    return run_id


def test_sigterm_mid_step_checkpoints_it_and_the_resume_equals_the_uninterrupted_run(root, tmp_path, fault_reward):
    steps = ("trainer.steps=4", "trainer.save_every=100")   # no checkpoint but the stop's and the last
    out = tmp_path / "stopped"
    proc, log = start_run(root, fault_reward, out, *steps)
    rc, seconds = stop_mid_step(proc, log, fault_reward, signal.SIGTERM, after_steps=1)
    stderr = log.read_text()
    assert rc == 143, stderr[-3000:]
    assert seconds < GRACE_S, f"exited {seconds:.0f} s after SIGTERM, past the {GRACE_S} s grace"
    line = the_stop_line(stderr, "SIGTERM")
    assert "after step 2 (checkpoint step_000002)" in line
    assert "SIGTERM: finishing the step in flight" in stderr + (out.parent / f"{out.name}.stdout").read_text()
    assert ckpt.latest_checkpoint(out) == out / "step_000002"
    assert sorted(p.name for p in out.glob("step_*")) == ["step_000002"]
    run_id = assert_killed_and_gone(root, out, proc.pid)

    command = shlex.split(line.split("; resume from step_000002: ", 1)[1])
    assert command[:3] == ["python", "-m", "asr_grpo.run"]
    assert "trainer.resume=true" in command and f"trainer.output_dir={out}" in command
    resumed = subprocess.run([sys.executable, *command[1:]], env={**os.environ, "RAY_ADDRESS": ""},
                             capture_output=True, text=True, timeout=900)
    assert resumed.returncode == 0, resumed.stderr[-3000:]

    straight_out = tmp_path / "straight"
    straight = subprocess.run([sys.executable, "-m", "asr_grpo.run", "debug=fast", f"paths.output_root={root}",
                               f"reward.reward_file={fault_reward.path}", "trainer.eval_every=0", *steps,
                               f"trainer.output_dir={straight_out}"], env={**os.environ, "RAY_ADDRESS": ""},
                              capture_output=True, text=True, timeout=900)
    assert straight.returncode == 0, straight.stderr[-3000:]
    straight_id = ckpt.read_driver_state(straight_out / "step_000004")["mlflow_run_id"]
    assert ckpt.read_driver_state(out / "step_000004")["mlflow_run_id"] == run_id   # the same MLflow run
    cfg = compose_cfg(root)
    for key in ("reward/total", "loss/policy", "policy/entropy", "kl/policy_ref"):
        got, expected = dict(metric_history(cfg, run_id, key)), dict(metric_history(cfg, straight_id, key))
        assert sorted(got) == [1, 2, 3, 4], (key, got)
        assert got == pytest.approx(expected, abs=1e-6), (key, got, expected)
    a = load_file(f"{out}/step_000004/hf/model.safetensors")
    b = load_file(f"{straight_out}/step_000004/hf/model.safetensors")
    assert set(a) == set(b)
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=1e-6, msg=k)


def test_ctrl_c_past_the_grace_abandons_the_step_without_a_traceback(root, tmp_path, fault_reward):
    """SIGINT to the whole process group, as a terminal sends Ctrl-C; the step in flight
    (its reward call sleeping 8 s) outlasts a 1 s grace and is abandoned: step 1's
    checkpoint is what a resume continues from."""
    out = tmp_path / "interrupted"
    proc, log = start_run(root, fault_reward, out, "trainer.steps=4", "trainer.save_every=1", grace_s=1)
    rc, seconds = stop_mid_step(proc, log, fault_reward, signal.SIGINT, after_steps=1, send=os.killpg)
    stderr = log.read_text()
    assert rc == 130, stderr[-3000:]
    line = the_stop_line(stderr, "SIGINT")
    assert "the step in flight was abandoned: not finished 1 s after the signal" in line
    assert "KeyboardInterrupt" not in stderr
    assert "resume from step_000001: python -m asr_grpo.run " in line
    assert line.endswith(f"trainer.resume=true trainer.output_dir={out}")
    assert ckpt.latest_checkpoint(out) == out / "step_000001" and not list(out.glob(".step_*"))
    assert_killed_and_gone(root, out, proc.pid)
