"""bench/gpu_check.py's bookkeeping without running the check: every stage ends ran,
skipped (with its reason; GPU-only parts by name) or failed (exit status and output
tail), a later stage still runs after a failure, a stage without time left is skipped,
the summary on disk is current while a stage runs (what survives a kill), and the exit
status says whether the required stages ran. CI runs the whole CPU dry run
(.ci/vllm_leg.sh)."""
from __future__ import annotations

import json
import tarfile
import tempfile
import time
from argparse import Namespace
from pathlib import Path

import pytest
from helpers import load_bench_script

gc = load_bench_script("gpu_check")


def read(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def test_each_stage_ends_ran_skipped_or_failed_and_the_rest_still_run(tmp_path):
    summary = gc.Summary(tmp_path, "cpu", 60.0)
    seen_running = {}

    def ran(left):
        return {"note": "fine"}

    def gpu_only(left):
        raise gc.Skip("needs 2+ GPUs; this machine has 0", gpu_only=True)

    def fails(left):
        raise gc.Failed("exited non-zero", rc=2, tail=f"Traceback ...\n{tempfile.gettempdir()}/x/y.py: boom")

    def bug(left):
        raise ValueError("a bug in the stage")

    def peeks(left):   # the file on disk while this stage runs: what a kill would leave
        seen_running.update(read(tmp_path)["stages"])
        return {}

    gc.run_stages([("env", ran), ("separate", gpu_only), ("build", fails), ("profile", bug), ("compare", peeks)],
                  summary, time.monotonic() + 60, {})
    st = read(tmp_path)["stages"]
    assert {k: v["status"] for k, v in st.items()} == {"env": "ran", "separate": "skipped", "build": "failed",
                                                       "profile": "failed", "compare": "ran"}
    assert st["separate"]["gpu_only"] is True and "2+ GPUs" in st["separate"]["reason"]
    assert st["build"]["rc"] == 2 and "boom" in st["build"]["tail"]
    assert "<tmp>/x/y.py" in st["build"]["tail"] and tempfile.gettempdir() + "/" not in st["build"]["tail"]
    assert "ValueError: a bug in the stage" in st["profile"]["reason"] and "Traceback" in st["profile"]["tail"]
    assert seen_running["compare"]["status"] == "running" and seen_running["env"]["status"] == "ran"
    md = (tmp_path / "summary.md").read_text()
    assert "| build | failed |" in md and "rc 2: exited non-zero" in md and "### build: the output's tail" in md
    assert "| hf_pair | not reached |" in md
    assert summary.ok([]) == 1


def test_a_stage_without_enough_time_left_is_skipped_and_says_so(tmp_path):
    summary = gc.Summary(tmp_path, "gpu", 100.0)
    called = []
    gc.run_stages([("hf_pair", lambda left: called.append(left))], summary, time.monotonic() + 30, {"hf_pair": 60})
    s = read(tmp_path)["stages"]["hf_pair"]
    assert not called and s["status"] == "skipped" and s["reason"].startswith("out of time")


def test_the_exit_status_names_required_stages_that_did_not_run(tmp_path):
    summary = gc.Summary(tmp_path, "cpu", 60.0)
    summary.record("env", "ran")
    summary.record("vllm_pair", "skipped", reason="vllm is not importable here")
    summary.record("separate", "skipped", reason="needs 2+ GPUs", gpu_only=True)
    assert summary.ok([]) == 0
    assert summary.ok(["env"]) == 0
    assert summary.ok(["env", "vllm_pair"]) == 3
    assert summary.ok(["build"]) == 3   # never reached
    summary.record("build", "running")
    assert summary.ok([]) == 1   # killed mid-stage


def test_gpu_only_parts_are_listed_by_name(tmp_path):
    summary = gc.Summary(tmp_path, "cpu", 60.0)
    summary.skip_gpu_only(gc.GPU_ONLY)
    summary.write()
    data = read(tmp_path)
    assert {"cuda_timings", "bf16", "vllm_cuda", "nccl_weight_sync", "multi_gpu_separate"} <= set(data["gpu_only_skipped"])
    assert "- `nccl_weight_sync`:" in (tmp_path / "summary.md").read_text()


def test_the_results_are_packed_after_every_stage(tmp_path):
    out, tar = tmp_path / "r", tmp_path / "back" / "gpu_check.tar.gz"
    summary = gc.Summary(out, "gpu", 60.0, tar)
    gc.run_stages([("env", lambda left: (out / "env.json").write_text("{}") and {})], summary,
                  time.monotonic() + 60, {})
    with tarfile.open(tar) as t:
        names = set(t.getnames())
    assert {"r/summary.json", "r/summary.md", "r/env.json"} <= names


def test_the_gpu_plan_fits_the_device_call_and_the_cpu_plan_ci():
    args = Namespace(steps=None, budget_s=None)
    gpu, cpu = gc.plan(True, 1, args), gc.plan(False, 0, args)
    assert gpu["model"] == "qwen3_asr_0p6b" and gpu["dtype"] == "bfloat16" and cpu["model"] == "tiny_qwen3_asr"
    assert gpu["budget_s"] + 20 <= 540 <= 9 * 60   # the stages' budget inside bench/gpu_check.sh's hard limit
    assert cpu["budget_s"] <= 7 * 60
    assert set(gpu["limits"]) == set(gc.STAGES) == set(cpu["limits"])
    assert len(gpu["contexts"].split(",")) >= 2 and len(gpu["rows"].split(",")) >= 5


@pytest.mark.parametrize("gpus, kl_off", [(2, True), (3, False), (8, False)])
def test_separate_placement_fits_the_gpus_there_are(gpus, kl_off):
    p = gc.plan(True, gpus, Namespace(steps=None, budget_s=None))
    over = gc.separate_overrides(p, True, "vllm")
    assert "placement=separate" in over and f"placement.gpus_per_node={gpus}" in over
    assert ("algorithm.kl_coef=0" in over) == kl_off and "rollout.sync_check_every=1" in over
    cpu = gc.separate_overrides(gc.plan(False, 0, Namespace(steps=None, budget_s=None)), False, "hf")
    assert "placement.gpus_per_node=3" in cpu and "rollout=hf" in cpu


def test_the_install_keeps_the_machine_s_torch_and_adds_the_vllm_extra():
    reqs = gc.project_requirements(with_vllm=True, without_torch=True)
    assert not [r for r in reqs if r.startswith("torch") and not r.startswith("torch-")]
    assert "vllm==0.33.0" in reqs and any(r.startswith("ray") for r in reqs)
    assert "vllm==0.33.0" not in gc.project_requirements(with_vllm=False, without_torch=True)


def test_the_forecast_is_compared_with_the_measured_steps():
    pred = {"predicted_at": "t", "modes": {"none": {"step_s": 1.1, "speedup": 1.0},
                                           "oppo": {"step_s": 0.9, "speedup": 1.22}}}
    measured = {"modes": {"none": {"median_step_s": 1.0, "phases_s": {}},
                          "oppo": {"median_step_s": 1.0, "step_speedup": 1.0, "phases_s": {},
                                   "step_speedup_ci": {"low": 0.9, "high": 1.1}}}}
    res = gc.compare(pred, measured, 0.15)
    assert res["modes"]["none"]["error"] == pytest.approx(0.1) and res["modes"]["oppo"]["error"] == pytest.approx(-0.1)
    assert res["within_target"] and res["speedup"]["inside_ci"] is False
    assert not gc.compare(pred, measured, 0.05)["within_target"]
    assert "| none | 1.100 | 1.000 | +10% | - |" in gc.compare_markdown(res, True)
    pred["roofline"] = {"forecast_gpu": "h100", "modes": {"none": {"step_s": 0.5}, "oppo": {"step_s": 0.4}}}
    res = gc.compare(pred, measured, 0.15)
    assert res["roofline"]["modes"]["none"]["error"] == pytest.approx(-0.5)
    assert "| none | 1.100 | 1.000 | +10% | 0.500 s (-50%) |" in gc.compare_markdown(res, True)


def test_the_roofline_check_reads_a_cost_table():
    table = {"device": "NVIDIA H100 80GB HBM3", "decode_context_tokens": 128,
             "model": {"name": "m", "layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "head_dim": 16,
                       "intermediate": 128, "vocab": 1000, "tie_embeddings": True, "audio_encoder_params": 0,
                       "dtype_bytes": 2},
             "decode_round_s_by_context": {"128": {"1": 0.010, "8": 0.012, "64": 0.026},
                                           "1024": {"1": 0.011, "8": 0.015}},
             "decode_round_s": {"1": 0.010, "8": 0.012, "64": 0.026}}
    res = gc.roofline_check(table, True)
    assert res["gpu_config"] == "h100" and res["assumed_round_overhead_s"] == pytest.approx(0.002)
    assert len(res["points"]) == 5 and res["fit"]["context"] == 128
    assert res["fit"]["fixed_s"] == pytest.approx(0.00975, abs=2e-4)
    assert gc.gpu_config_name("NVIDIA H200") == "h200"


def test_unsatisfied_names_missing_and_out_of_range_requirements():
    assert gc.unsatisfied(["pytest>=1", "pytest<1", "no-such-distribution-here>=1"]) == \
        ["pytest<1", "no-such-distribution-here>=1"]


def test_a_pair_stopped_at_its_limit_keeps_the_runs_that_finished(tmp_path):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    assert gc.finished_runs(uri, "gpu-check-vllm_pair") == []   # no experiment yet
    client = MlflowClient(uri)
    exp = client.create_experiment("gpu-check-vllm_pair")
    for name, status in (("bench-x-default-none-r0", "FINISHED"), ("bench-x-default-oppo-r0", "KILLED")):
        rid = client.create_run(exp, run_name=name).info.run_id
        for step, (s, gap) in enumerate([(2.0, 1e-3), (1.0, 2e-3), (3.0, 1e-3)]):
            client.log_metric(rid, "perf/time/step", s, step=step)
            client.log_metric(rid, "rollout/sync/max_abs_diff", gap, step=step)
        client.set_terminated(rid, status)
    runs = gc.finished_runs(uri, "gpu-check-vllm_pair")
    assert [(r["name"], r["steps"], r["median_step_s"], r["sync_checks"], r["sync_max_abs_diff"]) for r in runs] == \
        [("bench-x-default-none-r0", 3, 2.0, 3, 2e-3)]


H100 = {"cuda_available": True, "cuda_devices": 1, "torch_cuda": "13.0",
        "gpus": [{"name": "NVIDIA H100 80GB HBM3", "memory": "81559 MiB", "driver": "580.159.04"}]}


def gpu_check(monkeypatch, tmp_path, facts=H100, **kw):
    monkeypatch.setattr(gc, "gpu_facts", lambda: facts)
    monkeypatch.setattr(gc.tempfile, "mkdtemp", lambda prefix: str(Path(tmp_path, prefix).mkdir() or
                                                                   Path(tmp_path, prefix)))   # no work folder left
    args = Namespace(out=str(tmp_path / "out"), cpu=False, steps=None, budget_s=None, repeats=1, target=0.15,
                     require="", keep=False, **kw)
    check = gc.Check(args)
    check.summary = gc.Summary(check.out, check.mode, check.p["budget_s"])
    return check


def test_on_one_gpu_the_separate_placement_is_a_gpu_only_skip(monkeypatch, tmp_path):
    check = gpu_check(monkeypatch, tmp_path)
    assert check.gpu and check.p["model"] == "qwen3_asr_0p6b" and "DS_ACCELERATOR" not in check.env
    with pytest.raises(gc.Skip) as e:
        check.separate_stage(300)
    assert e.value.gpu_only and "2+ GPUs" in e.value.reason


def test_the_gpu_install_holds_the_machine_s_torch_and_puts_vllm_apart(monkeypatch, tmp_path):
    check = gpu_check(monkeypatch, tmp_path)
    monkeypatch.setattr(gc, "unsatisfied", lambda reqs: ["ray[default]>=2.60,<2.61", "transformers>=5.19,<6"])
    monkeypatch.setattr(gc, "index_reachable", lambda: True)
    monkeypatch.setattr(gc.importlib.util, "find_spec", lambda name: None if name == "vllm" else object())
    calls = {}
    monkeypatch.setattr(check, "command", lambda name, argv, timeout_s, env=None: calls.setdefault(name, argv) and {})
    note = check.install_stage(200)["note"]
    base, vllm = calls["install"], calls["install_vllm"]
    pins = base[base.index("-c") + 1]
    assert Path(pins).read_text().startswith("torch==") and "ray[default]>=2.60,<2.61" in base
    assert "--target" not in base and "vllm==0.33.0" not in base
    assert "--target" in vllm and "vllm==0.33.0" in vllm and any(r.startswith("torch>=") for r in vllm)
    assert check.vllm_env["PYTHONPATH"].startswith(vllm[vllm.index("--target") + 1])
    assert "the vllm extra" in note


def test_a_gpu_machine_without_an_index_says_so_at_once(monkeypatch, tmp_path):
    check = gpu_check(monkeypatch, tmp_path)
    monkeypatch.delenv("GPU_CHECK_WHEELS", raising=False)
    monkeypatch.setattr(gc, "unsatisfied", lambda reqs: ["mlflow>=3.17,<4"])
    monkeypatch.setattr(gc, "index_reachable", lambda: False)
    with pytest.raises(gc.Failed, match="no package index reachable and no GPU_CHECK_WHEELS; missing: mlflow"):
        check.install_stage(200)


def test_main_on_one_gpu_names_the_multi_gpu_parts_as_skipped(monkeypatch, tmp_path):
    monkeypatch.setattr(gc, "gpu_facts", lambda: H100)
    monkeypatch.setattr(gc.tempfile, "mkdtemp", lambda prefix: str(Path(tmp_path, prefix).mkdir() or
                                                                   Path(tmp_path, prefix)))
    monkeypatch.setattr(gc.Check, "stages", lambda self: [("env", lambda left: {}),
                                                          ("separate", self.separate_stage)])
    rc = gc.main([str(tmp_path / "out"), "--require", "env,separate"])
    data = read(tmp_path / "out")
    assert rc == 3 and data["mode"] == "gpu"   # separate did not run: skipped, if by name
    assert set(data["gpu_only_skipped"]) == {"multi_gpu_separate", "nccl_weight_sync"}
    assert data["stages"]["separate"]["status"] == "skipped" and data["stages"]["separate"]["gpu_only"]
