"""A sweep whose jobs fail: each failure is recorded and reported, the next job still
runs, the parent run ends FAILED and the command exits non-zero."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from asr_grpo.sweep import read_jobs
from asr_grpo.tracking.selection import select_runs

pytestmark = pytest.mark.slow


def test_failed_jobs_are_reported_and_the_sweep_goes_on(tmp_path):
    # Both jobs fail their config check (before any corpus, model or Ray): cheap and certain.
    proc = subprocess.run([sys.executable, "-m", "asr_grpo.run", "-m", "trainer.steps=0,-1",
                           f"paths.output_root={tmp_path}"],
                          capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-4000:]
    assert "0 of 2 jobs finished" in out and "2 of 2 jobs failed" in out
    assert "trainer.steps=0: must be >= 1" in out and "trainer.steps=-1: must be >= 1" in out
    sweep_dir = next((tmp_path / "multirun").glob("*/*"))
    jobs = read_jobs(sweep_dir)
    assert [(j["num"], j["overrides"], j["status"]) for j in jobs] == [
        (0, "trainer.steps=0", "FAILED"), (1, "trainer.steps=-1", "FAILED")]   # job 1 ran after job 0 failed
    assert all("ConfigError" in j["error"] and j["run_id"] is None for j in jobs)
    info = json.loads((sweep_dir / "sweep.json").read_text())
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    parent = client.get_run(info["parent_run_id"])
    assert parent.info.status == "FAILED" and parent.data.metrics["sweep/jobs_failed"] == 2
    assert parent.data.tags["sweep"] == info["sweep_id"] and parent.data.tags["sweep_role"] == "parent"
    logged = json.loads(Path(client.download_artifacts(parent.info.run_id, "sweep_jobs.json")).read_text())
    assert logged == jobs
    with pytest.raises(ValueError, match=f"no runs tagged sweep='{info['sweep_id']}'"):
        select_runs(client, sweep=info["sweep_id"])   # nothing to compare: no job got to a run
