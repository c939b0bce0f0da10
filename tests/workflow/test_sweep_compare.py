"""The sweep the cluster ran (overlap none|oppo x seed 0|1): grouped in MLflow under one
parent run, system metrics logged; `python -m asr_grpo.compare` turns it into a table,
CSVs and plots whose numbers are the runs' own MLflow metrics, logs them back and
registers the best run's checkpoint."""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from asr_grpo.models import is_complete_checkpoint
from asr_grpo.tracking.runs import history
from asr_grpo.tracking.selection import SelectionError, open_store, select_runs

pytestmark = [pytest.mark.long, pytest.mark.slow, pytest.mark.timeout(1800)]   # the session fixture brings up a cluster and a sweep


@pytest.fixture(scope="module")
def client(cluster_sweep):
    return MlflowClient(cluster_sweep["tracking_uri"])


@pytest.fixture(scope="module")
def compared(cluster_sweep, tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    proc = subprocess.run([sys.executable, "-m", "asr_grpo.compare", f"sweep={cluster_sweep['sweep']}",
                           f"paths.output_root={cluster_sweep['root']}", "window=1", f"output_dir={out}"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return {"out": out, "stdout": proc.stdout, "report": json.loads((out / "report.json").read_text())}


def test_sweep_jobs_are_child_runs_of_one_parent(cluster_sweep, client):
    sel = select_runs(client, sweep=cluster_sweep["sweep"])
    parent = client.get_run(sel.parent_run_id)
    assert parent.info.status == "FINISHED" and parent.data.metrics["sweep/jobs_failed"] == 0
    jobs = json.loads(Path(client.download_artifacts(parent.info.run_id, "sweep_jobs.json")).read_text())
    assert sorted(j["num"] for j in jobs) == [0, 1, 2, 3] and {j["status"] for j in jobs} == {"FINISHED"}
    assert {r.info.run_id for r in sel.runs} == {j["run_id"] for j in jobs}
    combos = set()
    for run in sel.runs:
        assert run.info.status == "FINISHED"
        assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id
        combos.add((run.data.params["overlap.mode"], run.data.params["seed"]))
        # each job checkpoints into its own Hydra multirun folder
        ckpt_dir = Path(run.data.params["trainer.output_dir"])
        assert ckpt_dir.is_relative_to(parent.data.tags["sweep_dir"])
        assert is_complete_checkpoint(ckpt_dir / "step_000002" / "hf")
        # MLflow system metrics of the driver's node
        assert {"system/cpu_utilization_percentage", "system/system_memory_usage_megabytes"} <= set(run.data.metrics)
    assert combos == {("none", "0"), ("none", "1"), ("oppo", "0"), ("oppo", "1")}


def test_compare_table_holds_the_runs_own_numbers(cluster_sweep, client, compared):
    report = compared["report"]
    rows = {r["label"]: r for r in report["rows"]}
    assert set(rows) == {"overlap=none placement=separate", "overlap=oppo placement=separate"}
    runs = {(r["params"]["overlap.mode"], r["seed"]): r for r in report["runs"]}
    for (_mode, seed), r in runs.items():
        steps = history(client, r["run_id"], "perf/time/step")
        assert r["metrics"]["median_step_s"] == pytest.approx(statistics.median(steps.values()))
        cer = history(client, r["run_id"], "eval/cer")
        assert r["metrics"]["final_cer"] == pytest.approx(cer[max(cer)])
        base = runs[("none", seed)]
        assert r["baseline_run_id"] == base["run_id"]   # same seed, same placement
        assert r["metrics"]["step_speedup"] == pytest.approx(
            base["metrics"]["median_step_s"] / r["metrics"]["median_step_s"])
        assert set(r["metrics"]) >= {"util_actor", "util_ref", "util_rollout", "cpu_pct", "stale_frac"}
    none = rows["overlap=none placement=separate"]["metrics"]
    assert none["step_speedup"]["mean"] == 1.0 and none["step_speedup"]["n"] == 2
    oppo_medians = [runs[("oppo", s)]["metrics"]["median_step_s"] for s in ("0", "1")]
    oppo = rows["overlap=oppo placement=separate"]["metrics"]["median_step_s"]
    assert oppo["mean"] == pytest.approx(statistics.fmean(oppo_medians))
    assert oppo["sd"] == pytest.approx(statistics.stdev(oppo_medians))   # spread across seeds
    table = compared["stdout"]
    assert "| configuration | seeds | median step (s) | step speedup |" in table
    assert "| overlap=oppo placement=separate | 2 |" in table and "1.00x" in table


def test_compare_writes_csvs_and_plots(compared):
    out = compared["out"]
    assert len((out / "report.csv").read_text().splitlines()) == 3   # header + 2 configurations
    assert len((out / "runs.csv").read_text().splitlines()) == 5
    assert "median_step_s_mean" in (out / "report.csv").read_text().splitlines()[0]
    for name in ("curves.png", "step_latency.png", "utilization.png", "overlap_controllers.png", "staleness.png"):
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000, name


def test_compare_logs_back_and_registers_the_best_checkpoint(cluster_sweep, client, compared):
    report = compared["report"]
    parent = report["parent_run_id"]
    logged = {a.path for a in client.list_artifacts(parent, "report")}
    assert {"report/report.md", "report/report.csv", "report/curves.png", "report/staleness.png"} <= logged
    best = min(report["runs"], key=lambda r: (r["metrics"]["final_cer"], -r["metrics"]["final_reward"]))
    versions = [v for v in client.search_model_versions("name='asr-grpo-rl'") if v.run_id == best["run_id"]]
    assert len(versions) == 1 and versions[0].source == f"runs:/{best['run_id']}/asr_model"
    import mlflow

    mlflow.set_tracking_uri(cluster_sweep["tracking_uri"])
    uri = f"models:/asr-grpo-rl/{versions[0].version}"
    local = Path(mlflow.artifacts.download_artifacts(uri))
    assert is_complete_checkpoint(local / "artifacts" / "hf")   # transformers loads the folder as it is
    # ...and MLflow loads the model back and transcribes with it.
    audio = next(Path(cluster_sweep["root"]).rglob("*.wav"))
    texts = mlflow.pyfunc.load_model(uri).predict([{"audio_filepath": str(audio), "language": "en"}])
    assert len(texts) == 1 and isinstance(texts[0], str)
    assert client.get_run(best["run_id"]).data.tags["best_of"] == cluster_sweep["sweep"]


def test_bad_selections_name_what_is_wrong(cluster_sweep, client, tmp_path):
    with pytest.raises(SelectionError, match=cluster_sweep["sweep"]):   # lists the sweeps there are
        select_runs(client, sweep="no-such-sweep")
    with pytest.raises(SelectionError, match="'deadbeef' is not in this MLflow store"):
        select_runs(client, run_ids=["deadbeef"])
    with pytest.raises(SelectionError, match="no MLflow experiment named 'nope'.*wf-sweep"):
        select_runs(client, experiment_name="nope")
    with pytest.raises(SelectionError, match="not both"):
        select_runs(client, sweep="x", run_ids=["y"])
    with pytest.raises(SelectionError, match="not a sweep tag"):
        select_runs(client, sweep="x' or '1'='1")
    with pytest.raises(SelectionError, match="no MLflow store at"):
        open_store(f"sqlite:///{tmp_path}/missing/mlflow.db")
