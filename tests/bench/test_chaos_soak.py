"""bench/chaos_soak.py's verdict: the faulted run's metrics and weights against the
fault-free run's, read from a real MLflow store and real step checkpoints; a step the
faulted run did not log and a weight that differs are reported, not smoothed over."""
from __future__ import annotations

import mlflow
import torch
from helpers import load_bench_script
from safetensors.torch import save_file

from asr_grpo.models import step_checkpoints as ckpt


def fake_run(client, experiment: str, folder, steps: dict[int, float], weight: float) -> None:
    run = client.create_run(experiment)
    for step, value in steps.items():
        for key in load_bench_script("chaos_soak").COMPARED:
            client.log_metric(run.info.run_id, key, value, step=step)
    client.set_terminated(run.info.run_id)
    staging = ckpt.staging_dir(folder, 3)
    (staging / "hf").mkdir()
    save_file({"w": torch.full((2, 2), weight)}, str(staging / "hf" / "model.safetensors"))
    ckpt.commit(folder, staging, 3, {"step": 3, "mlflow_run_id": run.info.run_id})


def test_the_comparison_reports_missing_steps_and_weight_differences(tmp_path):
    soak = load_bench_script("chaos_soak")
    uri = f"sqlite:///{tmp_path}/store.db"
    client = mlflow.tracking.MlflowClient(uri)
    experiment = client.create_experiment("soak")
    fake_run(client, experiment, tmp_path / "faulted", {1: 1.0, 3: 3.0}, weight=1.0)   # step 2 never logged
    fake_run(client, experiment, tmp_path / "clean", {1: 1.0, 2: 2.0, 3: 3.5}, weight=1.25)
    got = soak.compare(tmp_path / "faulted", tmp_path / "clean", uri, 3)
    reward = got["metrics"]["reward/total"]
    assert reward["missing_steps"] == [[2], []]
    assert reward["last"] == [3.0, 3.5] and reward["max_abs_diff_all_steps"] == 0.5
    assert got["weights_max_abs_diff"] == 0.25 and got["weights_equal"] is False
    same = soak.compare(tmp_path / "clean", tmp_path / "clean", uri, 3)
    assert same["weights_equal"] and same["metrics"]["reward/total"]["max_abs_diff_all_steps"] == 0.0
