"""bench/gpu_profile.sh without a GPU: the scaled-down shape on one CPU thread writes a
cost table that `profile=file` loads and forecasts from."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from asr_grpo.forecast import simulate
from asr_grpo.forecast.profiles import build, read_cost_table

REPO = Path(__file__).resolve().parents[2]


def test_gpu_profile_cpu_mode_writes_a_table_that_profile_file_loads(tmp_path, forecast_cfg):
    out = tmp_path / "cpu_profile.json"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHON": sys.executable}   # the tests' own interpreter
    proc = subprocess.run(["bash", str(REPO / "bench/gpu_profile.sh"), str(out), "tiny_qwen3_asr"], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    table = read_cost_table(str(out))
    assert table["device"] == "cpu" and table["model"]["name"] == "tiny_qwen3_asr"
    assert [int(r) for r in table["decode_round_s"]] == [1, 4, 16]
    assert all(v > 0 for v in table["decode_round_s"].values())
    assert table["prefill_tokens_per_s"] > 0 and table["train_tokens_per_s"]["actor"] > 0

    cfg = forecast_cfg("profile=file", f"cost_file={out}", "forecast_model=tiny_qwen3_asr",
                       "forecast_placement=single_gpu", "workload.prompts_per_step=8", "workload.n_samples=4",
                       "steps=10", "warmup=3")
    profile, workload = build(cfg)
    assert profile.source == "file" and profile.hosts == 1
    assert profile.decode.table_rows == [1.0, 4.0, 16.0]
    assert profile.decode.round_s(4, 0) == pytest.approx(table["decode_round_s"]["4"])
    assert profile.roles["actor"].train_per_token_s == pytest.approx(1 / table["train_tokens_per_s"]["actor"])
    res = simulate(profile, workload, cfg.overlap, ("none", "oppo"), steps=10, warmup=3)
    assert res["none"].summary()["step_s"] > 0 and res["oppo"].summary()["step_s"] > 0


def test_a_file_that_is_not_a_cost_table_is_refused(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"decode_round_s": {"1": 0.1}}))
    with pytest.raises(ValueError, match="not a cost table"):
        read_cost_table(str(bad))
