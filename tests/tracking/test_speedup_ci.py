"""Speedups with a bootstrap interval (asr_grpo.tracking.speedup_ci): what the interval
says on synthetic step times whose true ratio is known, and that the speedup report (real
MLflow runs in a temporary store) and bench/overlap_speedup.py show it."""
from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import load_bench_script
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from asr_grpo.tracking.render import markdown, write_csvs
from asr_grpo.tracking.report import build_report
from asr_grpo.tracking.selection import select_runs
from asr_grpo.tracking.speedup_ci import SpeedupCI, format_speedup, run_speedup_ci, speedup_ci


def runs(rng, n_runs: int, n_steps: int, scale: float = 1.0, work=None) -> list[np.ndarray]:
    """Per-step times: a run-level factor (the machine that day) times step noise, times
    the steps' own work when given (one array per run, shared with the paired side)."""
    return [scale * rng.lognormal(0, 0.05) * rng.lognormal(0, 0.15, n_steps) * (1 if work is None else work[j])
            for j in range(n_runs)]


def holds(ci: SpeedupCI, x: float) -> bool:
    return ci.low <= x <= ci.high


def test_identical_distributions_give_no_difference():
    rng = np.random.default_rng(1)
    ci = speedup_ci(runs(rng, 3, 30), runs(rng, 3, 30))
    assert holds(ci, 1.0) and ci.verdict == "no difference"
    assert (ci.n_runs, ci.n_steps, ci.method) == (3, 90, "unpaired")
    assert format_speedup(ci).endswith(" no difference")


def test_a_true_speedup_is_found_and_bracketed():
    rng = np.random.default_rng(2)
    ci = speedup_ci(runs(rng, 4, 40), runs(rng, 4, 40, scale=1 / 1.5))
    assert not holds(ci, 1.0) and holds(ci, 1.5) and ci.verdict == "faster"
    assert ci.low <= ci.point <= ci.high
    assert format_speedup(ci) == f"{ci.point:.2f}x [{ci.low:.2f}, {ci.high:.2f}]"
    slower = speedup_ci(runs(rng, 4, 40, scale=1 / 1.5), runs(rng, 4, 40))
    assert slower.verdict == "slower" and holds(slower, 1 / 1.5)


def test_pairing_narrows_the_interval_when_steps_share_their_work():
    rng = np.random.default_rng(3)
    work = [rng.lognormal(0, 0.6, 30) for _ in range(3)]   # step i's response lengths, same seed on both sides
    base, mode = runs(rng, 3, 30, work=work), runs(rng, 3, 30, scale=1 / 1.2, work=work)
    paired, unpaired = speedup_ci(base, mode, paired=True), speedup_ci(base, mode)
    assert paired.method == "paired" and unpaired.method == "unpaired"
    assert paired.point == unpaired.point   # one estimator, two ways of resampling
    assert paired.high - paired.low < 0.75 * (unpaired.high - unpaired.low)
    assert holds(paired, 1.2) and not holds(paired, 1.0)


def test_the_interval_is_deterministic_for_a_seed():
    rng = np.random.default_rng(4)
    base, mode = runs(rng, 3, 20), runs(rng, 3, 20)
    assert speedup_ci(base, mode, seed=7) == speedup_ci(base, mode, seed=7)
    assert speedup_ci(base, mode, seed=7) != speedup_ci(base, mode, seed=8)


def test_per_run_figures_and_what_gives_no_interval():
    rng = np.random.default_rng(5)
    base, mode = [float(np.median(r)) for r in runs(rng, 3, 30)], [float(np.median(r)) for r in runs(rng, 3, 30)]
    ci = run_speedup_ci(base, mode, paired=True)
    assert ci.runs_only and ci.n_runs == 3 and ci.point == pytest.approx(np.median(base) / np.median(mode))
    assert "(runs only, n=3)" in format_speedup(ci)
    one = run_speedup_ci(base[:1], mode[:1])
    assert one.verdict == "no interval" and format_speedup(one).endswith("(no interval: 1 run)")
    assert run_speedup_ci([10.0, float("inf")], [8.0, 9.0]) is None   # a target never reached: no ratio
    assert format_speedup(None, 1.07) == "1.07x (no interval)" and format_speedup(None) == "-"
    assert format_speedup(ci.to_dict()) == format_speedup(ci)      # as stored in a JSON
    with pytest.raises(ValueError, match="paired"):
        speedup_ci(runs(rng, 2, 5), runs(rng, 3, 5), paired=True)


# ---- the speedup report, on real MLflow runs -----------------------------------------------
STEPS = 30
MODES = {"none": 1.0, "intra": 1.0, "oppo": 1.5}   # true speedup of each mode's steps


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """Two seeds x three modes of RL runs as the trainer logs them (perf/time/step,
    perf/wall_clock, reward/total, eval/cer), step i's work shared by the runs of a seed."""
    client = MlflowClient(f"sqlite:///{tmp_path_factory.mktemp('mlflow')}/mlflow.db")
    experiment = client.create_experiment("speedup-ci")
    rng = np.random.default_rng(0)
    ids = []
    for seed in (0, 1):
        work = rng.lognormal(0, 0.4, STEPS)
        for mode, speedup in MODES.items():
            rid = client.create_run(experiment, run_name=f"{mode}-{seed}").info.run_id
            for k, v in {"overlap.mode": mode, "placement.name": "colocate", "seed": str(seed)}.items():
                client.log_param(rid, k, v)
            step_s = 2.0 * work * rng.lognormal(0, 0.1, STEPS) / speedup
            wall, reward = np.cumsum(step_s), np.linspace(0.2, 0.8, STEPS)
            metrics = [Metric(k, float(v), 0, i + 1) for i in range(STEPS)
                       for k, v in (("perf/time/step", step_s[i]), ("perf/wall_clock", wall[i]),
                                    ("reward/total", reward[i]))]
            metrics += [Metric("eval/cer", 0.30, 0, 0), Metric("eval/cer", 0.25, 0, STEPS)]
            client.log_batch(rid, metrics=metrics)
            client.set_terminated(rid)
            ids.append(rid)
    return build_report(client, select_runs(client, run_ids=ids))


def test_report_rows_carry_paired_intervals_of_their_steps(report):
    rows = {r["params"]["overlap.mode"]: r for r in report["rows"]}
    assert rows["none"]["intervals"] == {}                      # the baseline against itself
    oppo, intra = (SpeedupCI(**rows[m]["intervals"]["step_speedup"]) for m in ("oppo", "intra"))
    assert oppo.method == "paired" and (oppo.n_runs, oppo.n_steps) == (2, 2 * STEPS)
    assert oppo.verdict == "faster" and holds(oppo, 1.5)
    assert intra.verdict == "no difference"
    medians = {(r["params"]["overlap.mode"], r["seed"]): np.median(r["summary"]["step_s"]) for r in report["runs"]}
    assert oppo.point == pytest.approx(np.median([medians["none", s] for s in "01"])
                                       / np.median([medians["oppo", s] for s in "01"]))
    reward = SpeedupCI(**rows["oppo"]["intervals"]["reward_speedup"])
    assert reward.runs_only and reward.n_runs == 2


def test_report_table_and_csv_show_the_intervals(report, tmp_path):
    rows = {r["params"]["overlap.mode"]: r for r in report["rows"]}
    table = markdown(report)
    head = [c.strip() for c in table.split("\n| configuration")[1].split("\n")[0].split("|")][1:]
    cells = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
             for line in table.splitlines() if line.startswith("| overlap=")}
    col = head.index("step speedup")
    assert cells["overlap=oppo placement=colocate"][col] == format_speedup(rows["oppo"]["intervals"]["step_speedup"])
    assert cells["overlap=intra placement=colocate"][col].endswith("no difference")
    assert cells["overlap=none placement=colocate"][col].startswith("1.00x")     # mean ± sd, no interval
    assert "[" not in cells["overlap=none placement=colocate"][col]
    assert "(runs only, n=2)" in cells["overlap=oppo placement=colocate"][head.index("speedup (reward)")]
    assert "95% bootstrap interval" in table
    write_csvs(report, tmp_path)
    import csv

    with open(tmp_path / "report.csv") as fh:
        csv_rows = {r["configuration"]: r for r in csv.DictReader(fh)}
    oppo = csv_rows["overlap=oppo placement=colocate"]
    assert float(oppo["step_speedup_ci_low"]) == pytest.approx(rows["oppo"]["intervals"]["step_speedup"]["low"])
    assert oppo["step_speedup_ci_verdict"] == "faster" and csv_rows["overlap=none placement=colocate"][
        "step_speedup_ci_low"] == ""
    json.dumps(report, default=str)   # report.json as compare writes it


# ---- bench/overlap_speedup.py ---------------------------------------------------------------
@pytest.fixture(scope="module")
def bench():
    return load_bench_script("overlap_speedup")


def bench_run(bench, rng, step_s: np.ndarray, chunk: float) -> dict:
    """One run as bench/overlap_speedup.py's load_run returns it (series after warm-up)."""
    n = len(step_s)
    series = {k: [1.0] * n for k in bench.PER_STEP}
    series.update({"perf/time/step": list(step_s), "overlap/chunk": [chunk] * n, "overlap/delta": [0.0] * n,
                   "overlap/carried_unfinished_groups": [0.0] * n, "predicted_vs_measured": []})
    wall = np.cumsum(step_s)
    return {"summary": {"run_id": f"r{rng.integers(1 << 30)}", "reward": list(np.linspace(0.2, 0.8, n)),
                        "wall_clock_s": list(wall), "cer_before": 0.3, "cer_after": 0.25, "final_reward": 0.8},
            "series": series}


def test_bench_reports_intervals_and_rerenders_older_jsons(bench, tmp_path):
    rng = np.random.default_rng(6)
    speedups, chunks = {"none": 1.0, "intra": 1.0, "oppo": 1.4}, {"none": 0.0, "intra": 0.0, "oppo": 16.0}
    work = rng.lognormal(0, 0.3, 30)
    runs_by_mode = {m: [bench_run(bench, rng, work * rng.lognormal(0, 0.1, 30) / s, chunks[m]) for _ in range(3)]
                    for m, s in speedups.items()}
    result = bench.report("synthetic", [], runs_by_mode, 3, order_seed=5,
                          orders=bench.mode_orders(list(speedups), 3, 5))
    modes = result["modes"]
    assert modes["none"]["step_speedup_ci"] is None
    assert modes["intra"]["step_speedup_ci"]["method"] == "paired"      # planned serial: the same work
    assert modes["oppo"]["step_speedup_ci"]["method"] == "unpaired"
    assert modes["oppo"]["step_speedup_ci"]["point"] == pytest.approx(modes["oppo"]["step_speedup"])
    assert modes["oppo"]["mean_speedup_ci"]["point"] == pytest.approx(modes["oppo"]["mean_speedup"])
    assert modes["oppo"]["step_speedup_ci"]["verdict"] == "faster"
    assert modes["oppo"]["ttt_speedup_ci"]["n_steps"] == 0               # time to target: over repeats only
    text = bench.markdown([result])
    assert format_speedup(modes["oppo"]["step_speedup_ci"]) in text and "no difference" in text
    # An older JSON: per-run medians only, no steps, no per-run time to target.
    for m in modes.values():
        for k in ("per_run_step_s", "per_run_mean_step_s", "per_run_time_to_target_s", "step_speedup_ci",
                  "mean_speedup_ci", "ttt_speedup_ci"):
            m.pop(k)
    path = tmp_path / "overlap_speedup.json"
    path.write_text(json.dumps([result], indent=1))
    measured = json.loads(path.read_text())
    text = bench.from_json(path, write=True)
    assert "(runs only, n=3)" in text and "x (no interval)" in text
    assert path.with_suffix(".md").read_text() == text
    rewritten = json.loads(path.read_text())[0]
    for mode, m in measured[0]["modes"].items():   # the measured figures stay; intervals are added
        assert {k: rewritten["modes"][mode][k] for k in m} == m
    assert rewritten["modes"]["oppo"]["step_speedup_ci"]["n_steps"] == 0


def test_bench_mode_order_is_random_per_repeat_and_seeded(bench):
    modes = ["none", "intra", "inter", "oppo"]
    orders = bench.mode_orders(modes, 6, seed=3)
    assert all(sorted(o) == sorted(modes) for o in orders) and len({tuple(o) for o in orders}) > 1
    assert orders == bench.mode_orders(modes, 6, seed=3) != bench.mode_orders(modes, 6, seed=4)
