"""bench/bare_loop.py, the one-process serial GRPO step, runs on the debug config and
writes what the comparison with `overlap=none` needs: per-step times that add up, the
phase split, finite rewards, response lengths and token checksums."""
from __future__ import annotations

import json
import math

import pytest
from helpers import load_bench_script


def load_bare_loop():
    return load_bench_script("bare_loop")


@pytest.mark.slow
def test_bare_loop_runs_two_steps_and_writes_its_json(root, tmp_path):
    out = tmp_path / "bare_loop.json"
    load_bare_loop().main(["debug=fast", f"paths.output_root={root}", "--steps", "2", "--warmup", "0",
                           "--out", str(out)])
    result = json.loads(out.read_text())
    assert {"command", "overrides", "threads", "summary", "per_step", "response_lengths"} <= set(result)
    assert result["overrides"][:3] == ["overlap=none", "algorithm.n_samples_per_prompt=8",
                                       "algorithm.train_samples_per_prompt=null"]
    steps = result["per_step"]
    assert [r["step"] for r in steps] == [0, 1]
    for r, lengths in zip(steps, result["response_lengths"]):
        assert math.isfinite(r["reward"]) and 0.0 <= r["reward"] <= 1.0
        # debug=fast's 2 prompts x the overlap benchmark's 8 samples, at most 16 new tokens each
        assert len(lengths) == 16 and all(1 <= n <= 16 for n in lengths)
        assert r["response_length"] == pytest.approx(sum(lengths) / len(lengths))
        phases = r["rollout_s"] + r["scoring_s"] + r["training_s"] + r["sync_s"]
        assert r["step_s"] == pytest.approx(phases, rel=1e-6)
        assert math.isfinite(r["metrics"]["loss/policy"]) and r["metrics"]["charts/lr"] >= 0.0
    summary = result["summary"]
    assert summary["measured_steps"] == 2
    assert sum(summary["phase_split"].values()) == pytest.approx(1.0, rel=1e-6)
    assert summary["median_step_s"] > 0
