"""A reward served by another machine, forecast from a serial (`overlap=none`) run: the
service's per-sequence wait is fitted apart from the local scoring, and the streaming
modes hide it as the cost model says (sequences sent at the end of the decode call they
finish in, one slot draining them). A run with a local reward forecasts as before; an
unknown run id is one line, not a traceback."""
from __future__ import annotations

import random
import subprocess
import sys

import mlflow
import pytest
from mlflow.entities import Metric, Param

from asr_grpo.forecast import report, simulate
from asr_grpo.forecast.profiles import build

B, N = 8, 4                                  # prompts a step, samples a prompt: 32 sequences sampled
SERVICE = "['http://reward-host:8000/score']"
STEPS, WARMUP = 20, 6


def log_none_run(uri: str, per_seq_s: float, urls: str = SERVICE, log_wait: bool = True, feed: bool = True) -> str:
    """An overlap=none run as the recipe logs it: GRPO on a CPU, its reward asked of a
    service (`urls`) that answers a sequence every `per_seq_s` seconds, the driver's wait
    (`perf/time/reward_wait`, all B x N sequences sent after the decode) inside the scoring wall."""
    rng = random.Random(0)
    client = mlflow.MlflowClient(uri)
    exp = client.get_experiment_by_name("asr-grpo")
    run = client.create_run(exp.experiment_id if exp else client.create_experiment("asr-grpo"))
    rid = run.info.run_id
    params = [Param(k, str(v)) for k, v in {"overlap.mode": "none", "trainer.prompts_per_step": B, "algorithm.n_samples_per_prompt": N,
                 "algorithm.max_new_tokens": 64, "algorithm.name": "grpo", "reward.smoothness_scorer": "none",
                 "placement.colocate": True, "algorithm.recompute_old_logprobs": True,
                 "reward.remote.urls": urls, "reward.remote.feed": feed}.items()]
    metrics = []
    for step in range(1, 13):
        rounds, rows = rng.randint(20, 45), rng.randint(300, 520)
        decode = 0.002 * rounds + 0.0005 * rows + 0.02
        local = 0.01 + 0.0004 * (rows + B * 64)
        wait = B * N * per_seq_s
        train = 0.05 + 0.0001 * (rows + B * N * 64)
        m = {"perf/time/rollout_decode": decode, "perf/time/rollout": decode, "overlap/decode_rounds": rounds,
             "overlap/rows_decoded": rows, "perf/time/scoring_wall": local + wait, "perf/time/training": train,
             "perf/time/sync": 0.005, "perf/time/step": decode + local + wait + train + 0.015,
             "charts/response_length": rows / (B * N), "charts/response_length_p50": 12.0,
             "charts/response_length_p90": 20.0, "charts/response_length_max": rounds}
        if log_wait:
            m["perf/time/reward_wait"] = wait
        metrics += [Metric(key, float(value), 0, step) for key, value in m.items()]
    client.log_batch(rid, metrics=metrics, params=params)   # one write: a sqlite store is slow per metric
    client.set_terminated(rid)
    return rid


def forecast(forecast_cfg, uri: str, rid: str) -> tuple:
    cfg = forecast_cfg("profile=run", f"run.run_id={rid}", f"run.tracking_uri={uri}", f"steps={STEPS}",
                       f"warmup={WARMUP}")
    profile, workload = build(cfg)
    results = simulate(profile, workload, cfg.overlap, list(cfg.modes), STEPS, WARMUP, cfg.reward_trend)
    return profile, report.figures(results, profile, workload)["modes"]


def test_a_reward_services_wait_is_fitted_apart_and_hidden_by_streaming(tmp_path, forecast_cfg):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    speedups = {}
    for r in (0.0, 0.004, 0.008):
        profile, modes = forecast(forecast_cfg, uri, log_none_run(uri, r))
        assert profile.remote_per_seq_s == pytest.approx(r, abs=1e-12)
        # Serially every sequence goes out after the decode: the fit's wait comes back whole.
        assert modes["none"]["reward_wait_s"] == pytest.approx(B * N * r, rel=1e-9, abs=1e-12)
        speedups[r] = {m: modes[m]["speedup"] for m in ("intra", "oppo")}
        if r:
            assert modes["intra"]["reward_wait_s"] < modes["none"]["reward_wait_s"]
    # No service wait: nothing for streaming to hide, and this workload's tail is too
    # short for overcommit to pay.
    assert speedups[0.0] == pytest.approx({"intra": 1.0, "oppo": 1.0}, abs=0.02)
    for mode in ("intra", "oppo"):
        assert 1.0 < speedups[0.004][mode] < speedups[0.008][mode], speedups
    # Not fed (`reward.remote.feed=false`): every mode waits the serial wait.
    _, unfed = forecast(forecast_cfg, uri, log_none_run(uri, 0.008, feed=False))
    assert unfed["intra"]["reward_wait_s"] == pytest.approx(unfed["none"]["reward_wait_s"], rel=1e-9)


def test_a_local_reward_forecasts_as_a_run_that_logged_no_wait(tmp_path, forecast_cfg):
    # A local reward file's wait is local work (it would share the decode's cores): it stays
    # in the scoring, and the forecast is the one of a run that never logged the wait.
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    local_profile, local = forecast(forecast_cfg, uri, log_none_run(uri, 0.004, urls="[]"))
    _, older = forecast(forecast_cfg, uri, log_none_run(uri, 0.004, urls="[]", log_wait=False))
    assert local_profile.remote_per_seq_s == 0.0
    assert {m: s["step_s"] for m, s in local.items()} == {m: s["step_s"] for m, s in older.items()}
    assert all(s["reward_wait_s"] == 0.0 for s in local.values())


def test_an_unknown_run_id_is_one_line_naming_the_store(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    mlflow.MlflowClient(uri).search_experiments()   # the store exists; the run does not
    proc = subprocess.run([sys.executable, "-m", "asr_grpo.forecast", "profile=run", "run.run_id=doesnotexist",
                           f"run.tracking_uri={uri}", f"paths.output_root={tmp_path}", "log_to_mlflow=false"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert f"forecast: run doesnotexist not found in {uri}" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_the_validation_records_a_prediction_first_and_compares_it_with_the_measured_table(tmp_path):
    from helpers import load_bench_script

    fv = load_bench_script("forecast_validation")
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    rid = log_none_run(uri, 0.008)
    bench = tmp_path / "remote"
    # predict-only: on record before any measured run exists (bench/remote_reward.py's call)
    pred = fv.remote_prediction(rid, uri, steps=STEPS, warmup=WARMUP, predict_only=str(bench / "forecast_full.json"))
    assert (bench / "forecast_full.json").exists() and pred["speedups"]["none"] == 1.0
    assert pred["remote_per_seq_s"] == pytest.approx(0.008)
    measured = bench / "remote_reward.json"
    measured.write_text('{"full": {"none": {"step_speedup": 1.0, "ci": [1.0, 1.0]}, '
                        '"oppo": {"step_speedup": 1.05, "ci": [0.98, 1.12]}}}')
    got = fv.remote_validation(str(measured), {}, uri)["settings"]["full"]
    oppo = got["modes"]["oppo"]
    assert got["prediction"] == str(bench / "forecast_full.json") and got["none_run"] == rid
    assert oppo["predicted_speedup"] == pred["speedups"]["oppo"]
    assert oppo["error"] == pytest.approx(pred["speedups"]["oppo"] / 1.05 - 1)
    assert oppo["inside_ci"] == (0.98 <= pred["speedups"]["oppo"] <= 1.12)
    assert "| full |" in "\n".join(fv.remote_markdown({"measured": str(measured), "settings": {"full": got}}))
