"""`python -m asr_grpo.forecast` end to end: roofline costs, every mode simulated, the
table printed, the JSON (`modes.<mode>.step_s`, `.speedup`), the Gantt plot and the MLflow
run written; and a bad profile source refused in one line."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import mlflow

MODES = ("none", "intra", "inter", "oppo")


def run_cli(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "-m", "asr_grpo.forecast", f"paths.output_root={tmp_path}",
                           f"logger.tracking_uri=sqlite:///{tmp_path}/mlflow.db", *overrides],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


def test_the_cli_forecasts_every_mode_from_a_roofline_and_writes_the_json(tmp_path):
    out = tmp_path / "f.json"
    proc = run_cli(tmp_path, "profile=roofline", "forecast_gpu=h100", "forecast_model=qwen3_asr_1p7b",
                   "steps=14", "warmup=4", "--json", str(out), f"output_dir={tmp_path / 'report'}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    fig = json.loads(out.read_text())
    assert set(fig["modes"]) == set(MODES)
    for mode in MODES:
        assert fig["modes"][mode]["step_s"] > 0
        assert fig["modes"][mode]["speedup"] > 0
    assert fig["modes"]["none"]["speedup"] == 1.0
    assert fig["profile"]["source"] == "roofline"
    assert "| oppo |" in proc.stdout and "speedup" in proc.stdout
    assert (tmp_path / "report" / "gantt.png").stat().st_size > 10_000
    assert (tmp_path / "report" / "forecast.md").exists()
    runs = mlflow.MlflowClient(f"sqlite:///{tmp_path}/mlflow.db").search_runs(
        [mlflow.MlflowClient(f"sqlite:///{tmp_path}/mlflow.db").get_experiment_by_name("forecast").experiment_id])
    assert runs and runs[0].data.metrics["forecast/oppo/speedup"] == fig["modes"]["oppo"]["speedup"]


def test_json_flag_becomes_the_json_override():
    from asr_grpo.forecast.__main__ import json_flag

    assert json_flag(["a=1", "--json", "/x.json", "--json=/y.json"]) == ["a=1", "json=/x.json", "json=/y.json"]


def test_a_missing_profile_source_fails_in_one_line(tmp_path):
    proc = run_cli(tmp_path, "profile=file", "log_to_mlflow=false")
    assert proc.returncode != 0
    assert "profile=file needs cost_file=" in proc.stderr
    assert "Traceback" not in proc.stderr
