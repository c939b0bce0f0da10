"""bench/rl_quality.py reads an RL run back from MLflow: the start CER, the mean of the
last evaluations inside the time budget, relative drops, early and late rewards."""
from __future__ import annotations

import pytest
from helpers import load_bench_script
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient


def load_rl_quality():
    return load_bench_script("rl_quality")


def test_the_end_is_the_mean_of_the_last_evaluations_inside_the_budget():
    q = load_rl_quality()
    points = {0: 0.40, 50: 0.38, 100: 0.36, 150: 0.34, 200: 0.32, 250: 0.10}
    minutes = {0: 0.0, 50: 10.0, 100: 20.0, 150: 30.0, 200: 44.9, 250: 45.1}   # 250: past 45 min
    out = q.eval_summary(points, minutes, budget_min=45.0, last=3)
    assert out["steps"] == [100, 150, 200]
    assert out["end"] == pytest.approx(0.34) and out["start"] == 0.40
    assert out["drop"] == pytest.approx(0.15)
    assert q.eval_summary(points, minutes, budget_min=15.0, last=3)["steps"] == [50]
    at_steps = q.eval_summary(points, minutes, budget_min=45.0, last=3, max_step=150)   # a step budget as well
    assert at_steps["steps"] == [50, 100, 150] and at_steps["end"] == pytest.approx(0.36)


def test_a_logged_run_reads_back_per_set_language_and_reward(tmp_path):
    q = load_rl_quality()
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.create_experiment("quality", artifact_location=str(tmp_path / "artifacts"))
    run = client.create_run(experiment, run_name="seed0")
    client.log_param(run.info.run_id, "seed", "0")
    metrics = []
    for step in range(1, 101):
        metrics += [Metric("perf/wall_clock", step * 30.0, 0, step),          # 30 s a step: 50 min
                    Metric("reward/total", 0.5 + step / 1000, 0, step),
                    Metric("reward/keyword", 0.4 if step <= 50 else 0.6, 0, step),
                    Metric("reward/flat_groups/zh", 0.25 if step <= 50 else 0.5, 0, step)]
    for step in range(0, 101, 20):
        metrics += [Metric("eval/cer", 0.30 - step / 1000, 0, step),
                    Metric("eval/cer/zh", 0.40, 0, step),
                    Metric("eval/heldout_voices/cer", 0.50 - step / 2000, 0, step),
                    Metric("eval/heldout_conditions/phone/cer", 0.60 - step / 1000, 0, step),
                    Metric("eval/heldout_conditions/phone/cer/en", 0.9, 0, step)]
    client.log_batch(run.info.run_id, metrics=metrics)
    client.set_terminated(run.info.run_id)
    rows = [q.run_quality(client, r, budget_min=45.0, last=3, window=10)
            for r in client.search_runs([experiment])]
    (row,) = rows
    assert row["seed"] == "0" and row["steps"] == 90 and row["minutes"] == 45.0   # the run went on to 50 min
    assert row["dev"]["steps"] == [40, 60, 80]               # step 100 is at 50 min
    assert row["dev"]["end"] == pytest.approx(0.24) and row["dev"]["drop"] == pytest.approx(0.2)
    assert row["dev/zh"]["drop"] == pytest.approx(0.0) and "dev/en" not in row
    assert row["heldout_voices"]["end"] == pytest.approx(0.47)
    assert row["heldout_conditions/phone"]["end"] == pytest.approx(0.54)   # a condition: overall only
    assert "heldout_conditions/phone/en" not in row and "ema/heldout_conditions/phone" not in row
    assert row["reward/keyword"] == {"first": 0.4, "last": 0.6}
    assert row["reward/total"]["first"] == pytest.approx(0.5055)   # steps 1-10
    assert row["reward/flat_groups/zh"] == {"first": 0.25, "last": 0.5} and "reward/cer/en" not in row
    (by_step,) = [q.run_quality(client, r, budget_min=45.0, last=3, window=10, max_step=50)
                  for r in client.search_runs([experiment])]
    assert by_step["dev"]["steps"] == [20, 40] and by_step["reward/keyword"] == {"first": 0.4, "last": 0.4}
    assert (by_step["steps"], by_step["minutes"]) == (50, 25.0)   # the steps column reads the step budget too
    table = q.table(rows)
    assert "30.0 -> 24.0% (+20.0%)" in table and "0.400 -> 0.600" in table
    assert "heldout_conditions/phone CER: start -> end (drop)" in table and "60.0 -> 54.0% (+10.0%)" in table
    assert "reward/flat_groups/zh: first -> last" in table and "0.250 -> 0.500" in table


def test_runs_are_labelled_by_the_overrides_that_differ():
    q = load_rl_quality()
    rows = [{"overrides": "experiment=grpo_45min,seed=0"}, {"overrides": "experiment=grpo_45min,seed=1,trainer.lr=1e-4"}]
    assert q.labels(rows) == ["seed=0", "seed=1,trainer.lr=1e-4"]
    assert q.labels([rows[0], {"overrides": "experiment=grpo_45min,seed=0,trainer.lr=1e-4"}]) == [
        "defaults", "trainer.lr=1e-4"]
    lone = ("data.corpus.num_rl=8000,experiment=grpo_45min,logger.experiment_name=x,overlap=none,"
            "placement=colocate,seed=0")
    assert q.labels([{"overrides": lone}]) == ["data.corpus.num_rl=8000,seed=0"]
    assert q.labels([{"overrides": "experiment=grpo_45min,overlap=none"}]) == ["defaults"]
    assert q.labels([]) == []
    again = [{"overrides": "seed=0", "run_id": "aaaaaaaa11"}, {"overrides": "seed=0", "run_id": "bbbbbbbb22"},
             {"overrides": "seed=1", "run_id": "cccccccc33"}]
    assert q.labels(again) == ["seed=0 (run aaaaaaaa)", "seed=0 (run bbbbbbbb)", "seed=1"]


def test_kept_runs_join_the_table_once_and_only_if_measured_the_same_way(tmp_path):
    q = load_rl_quality()
    earlier = tmp_path / "quality.json"
    earlier.write_text('{"minutes": 45.0, "last": 3, "runs": [{"run_id": "a", "seed": "0"}, {"run_id": "b"}]}')
    assert q.kept_rows(str(earlier), [{"run_id": "b", "seed": "1"}], 45.0, 3) == [{"run_id": "a", "seed": "0"}]
    with pytest.raises(SystemExit, match="--minutes 45.0 --last 3 --max-step None, not 21.0, 3 and None"):
        q.kept_rows(str(earlier), [], 21.0, 3)
    with pytest.raises(SystemExit, match="not 45.0, 3 and 650"):   # read at other steps
        q.kept_rows(str(earlier), [], 45.0, 3, max_step=650)


def test_each_set_keeps_its_curve_inside_the_budget(tmp_path):
    q = load_rl_quality()
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.create_experiment("curves", artifact_location=str(tmp_path / "artifacts"))
    run = client.create_run(experiment, run_name="seed0")
    metrics = [Metric("perf/wall_clock", step * 60.0, 0, step) for step in range(1, 61)]   # a minute a step
    metrics += [Metric("eval/cer", 0.30 - step / 1000, 0, step) for step in range(0, 61, 20)]
    metrics += [Metric("eval/cer/en", 0.2, 0, step) for step in range(0, 61, 20)]
    client.log_batch(run.info.run_id, metrics=metrics)
    (row,) = [q.run_quality(client, r, budget_min=45.0, last=3, window=10) for r in client.search_runs([experiment])]
    assert row["curves"] == {"dev": {"steps": [0, 20, 40], "minutes": [0.0, 20.0, 40.0],
                                     "cer": pytest.approx([0.30, 0.28, 0.26])}}   # step 60 is at 60 min
    with pytest.raises(SystemExit, match="--also 0123"):
        q.added_runs(client, ["0123"])


def test_runs_that_differ_only_in_seed_are_one_variant():
    q = load_rl_quality()
    rows = [{"overrides": "experiment=grpo_45min,logger.experiment_name=a,seed=0", "run_id": "r0"},
            {"overrides": "experiment=grpo_45min,logger.experiment_name=b,seed=0,algorithm=mwer", "run_id": "r1"},
            {"overrides": "experiment=grpo_45min,logger.experiment_name=b,seed=1", "run_id": "r2"}]
    groups = q.variants(rows)
    assert {k: [r["run_id"] for r in v] for k, v in groups.items()} == {"defaults": ["r0", "r2"], "algorithm=mwer": ["r1"]}
    # the experiment's name alone tells no runs apart
    assert q.labels(rows[:1] + [{**rows[0], "overrides": rows[0]["overrides"].replace("=a", "=b")}])[0] == "defaults (run r0)"


def test_the_plot_shows_the_mean_and_spread_over_the_seeds_every_seed_reached(tmp_path):
    from asr_grpo.tracking.plots import cer_over_minutes, seed_band
    a = {"steps": [0, 50, 100], "minutes": [0.0, 4.0, 8.0], "cer": [0.30, 0.28, 0.26]}
    b = {"steps": [0, 50], "minutes": [0.0, 6.0], "cer": [0.30, 0.24]}
    band = seed_band([a, b])
    assert band["steps"] == [0, 50] and band["minutes"] == [0.0, 5.0]
    assert band["mean"] == pytest.approx([30.0, 26.0]) and band["low"] == pytest.approx([30.0, 24.0])
    assert band["high"] == pytest.approx([30.0, 28.0])
    path = cer_over_minutes({"defaults": [{"curves": {"dev": a}}, {"curves": {"dev": b}}],
                             "algorithm=mwer": [{"curves": {"dev": a, "heldout_voices": b}}]}, tmp_path / "cer.png")
    assert path.stat().st_size > 10_000 and path.read_bytes()[:4] == b"\x89PNG"


def _run(seed: int, start: float, **drops: float) -> dict:
    """A quality row: its seed, and each set's start CER and relative drop."""
    return {"seed": str(seed), **{name.replace("__", "/"): {"start": start, "drop": d} for name, d in drops.items()}}


def test_a_variant_pairs_with_the_baselines_run_of_the_same_seed_and_checkpoint():
    pairs = load_bench_script("rl_pairs")
    base = [_run(0, 0.251, dev=0.044), _run(1, 0.285, dev=0.050)]
    dr = [_run(0, 0.251, dev=0.070), _run(1, 0.285, dev=0.040),
          _run(2, 0.285, dev=0.090)]   # seed 2: the baseline has no run of it
    other_checkpoint = _run(0, 0.300, dev=0.2)   # seed 0, but from another SFT checkpoint
    matched = pairs.pairs({"defaults": base, "dr": dr + [other_checkpoint]}, "defaults")["dr"]
    assert [(b["seed"], r["dev"]["drop"]) for b, r in matched] == [("0", 0.070), ("1", 0.040)]
    assert [pairs.gain(b, r, "dev") for b, r in matched] == pytest.approx([2.6, -1.0])
    assert pairs.gain(base[0], dr[0], "ema/dev") is None   # a set one of them lacks
    with pytest.raises(SystemExit, match="no variant 'grpo'"):
        pairs.pairs({"defaults": base}, "grpo")


def test_the_adoption_rule_needs_three_seeds_a_mean_ahead_and_no_seed_far_behind():
    verdict = load_bench_script("rl_pairs").verdict
    assert verdict([3.0, 2.0], [4.0, 5.0]) == "2 of 3 seeds"
    assert verdict([1.0, -1.5, 0.2], [4.0, 5.0, 6.0]) == "not ahead"   # mean -0.1
    assert verdict([4.0, 2.0, -2.5], [4.0, 5.0, 6.0]).startswith("ahead on the mean, one seed behind")   # spread 2
    assert verdict([4.0, 2.0, -1.5], [4.0, 5.0, 6.0]) == "adopt"


def test_the_paired_table_shows_each_seeds_gain_and_the_mean():
    pairs = load_bench_script("rl_pairs")
    groups = {"defaults": [_run(0, 0.25, dev=0.04, ema__dev=0.05), _run(1, 0.28, dev=0.06, ema__dev=0.06)],
              "dr": [_run(0, 0.25, dev=0.07, ema__dev=0.05), _run(1, 0.28, dev=0.05, ema__dev=0.08)],
              "mwer": [_run(5, 0.25, dev=0.01)]}
    lines = pairs.paired_table(groups, "defaults", sets=("dev", "ema/dev")).splitlines()
    assert lines[2] == "| dr | 0 | 25.0% | +3.0 | +0.0 |"
    assert lines[3] == "| dr | 1 | 28.0% | -1.0 | +2.0 |"
    assert lines[4] == "| dr: mean of 2 seeds (2 of 3 seeds) | | | +1.0 | +1.0 |"
    assert lines[5].startswith("| mwer: no run of a seed and checkpoint defaults has")
