"""The three profile sources: a serial run's per-step totals fitted back to its costs; the
roofline reading the datasheet and the shape (memory- or compute-bound as the numbers
say); the least-squares pieces they share with the cost model."""
from __future__ import annotations

import json
import random

import mlflow
import pytest
from omegaconf import OmegaConf

from asr_grpo.forecast import simulate
from asr_grpo.forecast.profiles import build
from asr_grpo.forecast.roofline import shape_of
from asr_grpo.overlap.cost_model import fit_round_costs, nonneg_least_squares
from asr_grpo.tracking.runs import GROUP_LENGTHS

A, B_ROW, REBUILD = 0.002, 0.0005, 0.02          # decode: 2 ms a round + 0.5 ms a row, 20 ms a step
S0, S, T0, T = 0.01, 0.0004, 0.05, 0.001         # scoring and training: fixed + per token of prompt + response
PROMPT = 64                                      # run.prompt_tokens: tokens per prompt


def log_serial_run(uri: str, steps: int = 12, timed: bool = False, trained: int | None = None) -> str:
    """An overlap=none run as the recipe logs it, its times made from the costs above;
    `trained` of each group's 4 samples scored (after the rewards) and trained."""
    rng = random.Random(0)
    client = mlflow.MlflowClient(uri)
    exp = client.create_experiment("asr-grpo")
    run = client.create_run(exp, tags={"overlap": "none"})
    rid = run.info.run_id
    for k, v in {"overlap.mode": "none", "trainer.prompts_per_step": 8, "algorithm.n_samples_per_prompt": 4,
                 "algorithm.max_new_tokens": 64, "algorithm.name": "ppo", "reward.smoothness_scorer": "lm",
                 "placement.colocate": True, "algorithm.recompute_old_logprobs": True,
                 "algorithm.train_samples_per_prompt": trained}.items():
        client.log_param(rid, k, str(v))
    for step in range(1, steps + 1):
        rounds, rows = rng.randint(20, 45), rng.randint(300, 520)
        # Two steps hit by a machine hiccup: the same work, 2.5x the time.
        hiccup = 2.5 if step in (4, 9) else 1.0
        decode = hiccup * (A * rounds + B_ROW * rows + REBUILD)
        # Scorers forward the responses and each prompt once; training every sequence whole;
        # both only for the share of the samples that train.
        share = (trained or 4) / 4
        score, sync = S0 + S * (share * rows + 8 * PROMPT), 0.005
        train = hiccup * (T0 + T * share * (rows + 8 * 4 * PROMPT))
        m = {"perf/time/rollout_decode": decode, "perf/time/rollout": decode, "overlap/decode_rounds": rounds,
             "overlap/rows_decoded": rows, "perf/time/scoring_wall": score, "perf/time/training": train,
             "perf/time/sync": sync, "perf/time/step": decode + score + train + sync + 0.01,
             "charts/response_length": rows / 32, "charts/response_length_p50": 12.0,
             "charts/response_length_p90": 20.0, "charts/response_length_max": rounds}
        if timed:   # the engines' own per-step fit of their rounds (noisy around the truth)
            m.update({"perf/decode/round_fixed_ms": 1e3 * A * (1 + 0.1 * (step % 3 - 1)),
                      "perf/decode/round_per_row_ms": 1e3 * B_ROW * (1 + 0.1 * (step % 3 - 1))})
        for key, value in m.items():
            client.log_metric(rid, key, float(value), step=step)
    client.set_terminated(rid)
    return rid


@pytest.mark.parametrize("timed,trained", [(False, None), (True, None), (False, 2)])
def test_profile_run_fits_a_round_s_fixed_and_per_row_cost_from_per_step_totals(tmp_path, forecast_cfg, timed,
                                                                               trained):
    # Exact costs back, although two steps took 2.5x longer: the fit leaves hiccups out.
    # timed: the run logged each step's round costs (their median is taken as they are).
    # trained: a down-sampling run, half of each group scored and trained.
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    rid = log_serial_run(uri, timed=timed, trained=trained)
    cfg = forecast_cfg("profile=run", f"run.run_id={rid}", f"run.tracking_uri={uri}", "run.skip_steps=0",
                       f"run.prompt_tokens={PROMPT}", "steps=10", "warmup=3")
    profile, workload = build(cfg)
    assert profile.decode.overhead_s == pytest.approx(A, rel=1e-6)
    assert profile.decode.row_s == pytest.approx(B_ROW, rel=1e-6)
    assert profile.prefill.per_token_s * 8 * PROMPT == pytest.approx(REBUILD, rel=1e-6)
    assert profile.roles["actor"].train_per_token_s == pytest.approx(T, rel=1e-6)
    assert profile.roles["actor"].train_fixed_s == pytest.approx(T0, rel=1e-6)
    # The scoring wall's per-token cost is split over the forwards that make it.
    per_token = sum(r.forward.per_token_s for r in profile.roles.values())
    assert per_token == pytest.approx(S, rel=1e-6)
    assert set(profile.roles) == {"actor", "ref", "critic", "reward_model"}
    assert profile.stream_hidden == 0.0            # a CPU run: the scorers share the cores
    assert (workload.B, workload.n, workload.max_new_tokens, workload.train_samples) == (8, 4, 64, trained)
    lengths = sorted(x for g in workload.sample_lengths(400) for x in g)
    assert lengths[len(lengths) // 2] == pytest.approx(12, abs=1.5)   # the run's own p50
    res = simulate(profile, workload, cfg.overlap, ("none", "intra"), steps=10, warmup=3)
    assert res["none"].summary()["step_s"] > 0


def test_profile_run_refuses_a_run_that_overlapped(tmp_path, forecast_cfg):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = mlflow.MlflowClient(uri)
    rid = client.create_run(client.create_experiment("x")).info.run_id
    client.log_param(rid, "overlap.mode", "oppo")
    with pytest.raises(ValueError, match="fits a serial"):
        build(forecast_cfg("profile=run", f"run.run_id={rid}", f"run.tracking_uri={uri}"))


def test_roofline_rounds_are_memory_or_compute_bound_as_the_numbers_say(forecast_cfg):
    cfg = forecast_cfg("forecast_scenario=paper_ppo_7b", "gpu.round_overhead_s=0")
    profile, _ = build(cfg)
    d = profile.decode
    weights = shape_of(cfg.model).weight_bytes
    bw = cfg.gpu.hbm_bandwidth_GBps * 1e9 * cfg.gpu.mem_efficiency
    flops_per_row = 2 * (shape_of(cfg.model).body + shape_of(cfg.model).vocab_matrix)
    peak = cfg.gpu.bf16_dense_tflops * 1e12 * cfg.gpu.flop_efficiency
    assert d.round_s(16, 0) == pytest.approx(weights / bw)                     # a few rows: read the weights
    assert d.round_s(4096, 0) == pytest.approx(4096 * flops_per_row / peak)    # many rows: the FLOPs
    assert d.round_s(16, 16 * 2000) > d.round_s(16, 0)                         # long contexts read their KV
    assert profile.hosts == 7 and profile.roles["reward_model"].device == "score"


@pytest.mark.parametrize("name,text_params", [("qwen3_asr_0p6b", 0.60e9), ("qwen3_asr_1p7b", 1.72e9),
                                              ("qwen2p5_7b", 7.62e9)])
def test_model_shapes_give_the_published_parameter_counts(name, text_params):
    from pathlib import Path

    m = OmegaConf.load(Path(__file__).resolve().parents[2] / "conf" / "forecast_model" / f"{name}.yaml")
    s = shape_of(m)
    assert s.total - s.encoder == pytest.approx(text_params, rel=0.02)


def test_nonneg_least_squares_and_the_per_step_round_fit():
    assert nonneg_least_squares([[1, 1], [1, 2], [1, 3]], [4, 3, 2]) == pytest.approx([3.0, 0.0])
    rounds, rows = [10, 20, 15, 30], [100, 150, 400, 260]
    fit = fit_round_costs([0.5 * r + 0.01 * w + 0.2 for r, w in zip(rounds, rows)], rounds, rows, [1] * 4)
    assert (fit["round_fixed_s"], fit["round_per_row_s"], fit["per_call_s"]) == pytest.approx((0.5, 0.01, 0.2))


def _options(group: str) -> list[str]:
    from pathlib import Path

    from asr_grpo.config.store import CONF_DIR

    return sorted(p.stem for p in (Path(CONF_DIR) / group).glob("*.yaml"))


@pytest.mark.parametrize("group,option", [(g, o) for g in ("forecast_gpu", "forecast_model", "forecast_placement",
                                                           "forecast_workload", "forecast_lengths", "forecast_scenario")
                                          for o in _options(g)])
def test_every_forecast_group_option_composes_and_builds_a_profile(group, option, forecast_cfg):
    cfg = forecast_cfg(f"{group}={option}")
    profile, workload = build(cfg)
    assert profile.hosts >= 1 and profile.decode.round_s(1, 0) > 0
    assert workload.target_length("p-0#0") >= 1


def test_a_misspelt_forecast_key_fails_naming_it(forecast_cfg):
    with pytest.raises(Exception, match="hbm_bandwith"):
        forecast_cfg("gpu.hbm_bandwith_GBps=1")


def test_a_profile_survives_its_json(forecast_cfg):
    import json

    from asr_grpo.forecast import SimProfile

    profile, _ = build(forecast_cfg("forecast_scenario=paper_ppo_7b"))
    assert SimProfile.from_dict(json.loads(json.dumps(profile.as_dict()))) == profile


def test_profile_run_draws_the_runs_own_trained_groups(tmp_path, forecast_cfg):
    # Long-form audio makes lengths bimodal (1 group in 8 runs to ~200 tokens), which a
    # lognormal through p50/p90 cannot hold: with the run's group lengths logged, the
    # simulated workload draws those groups whole.
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    rid = log_serial_run(uri)
    short, long = [5, 6, 5, 7], [200, 210, 190, 205]
    steps = {s: [short] * 7 + [long] for s in range(1, 13)}
    mlflow.MlflowClient(uri).log_text(rid, json.dumps({"steps": steps}), GROUP_LENGTHS)
    cfg = forecast_cfg("profile=run", f"run.run_id={rid}", f"run.tracking_uri={uri}", "run.skip_steps=0")
    _, workload = build(cfg)
    groups = workload.sample_lengths(800)   # capped at the run's algorithm.max_new_tokens (64)
    capped = [min(x, 64) for x in long]
    assert {tuple(g) for g in groups} == {tuple(short), tuple(capped)}
    assert sum(g == capped for g in groups) / len(groups) == pytest.approx(1 / 8, abs=0.04)


def test_a_run_that_logged_no_setting_is_read_with_the_shipped_recipe():
    """Older runs lack some params: they read as the shipped config (conf/), not as a
    number written into the forecast."""
    from asr_grpo.config.store import CONF_DIR
    from asr_grpo.forecast.runfit import RunFacts, trained_per_prompt

    shipped = OmegaConf.load(f"{CONF_DIR}/algorithm/grpo.yaml")
    bare = RunFacts("no params", {}, [], {})
    assert bare.get("algorithm.n_samples_per_prompt", int) == shipped.n_samples_per_prompt
    assert trained_per_prompt(bare) == shipped.train_samples_per_prompt < shipped.n_samples_per_prompt
    assert bare.get("algorithm.recompute_old_logprobs", bool) is shipped.recompute_old_logprobs
    logged = RunFacts("logged", {"algorithm.n_samples_per_prompt": "4", "algorithm.train_samples_per_prompt": "None"},
                      [], {})
    assert (logged.get("algorithm.n_samples_per_prompt", int), trained_per_prompt(logged)) == (4, None)


def test_the_recipes_step_times_are_logged_under_the_names_the_run_fit_reads():
    """`profile=run` reads a run's phase times back by metric name: `StepTimes` logs every
    one of them under the name the fit reads, each with its own value."""
    from asr_grpo.forecast.runfit import SERIES
    from asr_grpo.overlap.step_times import StepTimes

    logged = StepTimes(step_s=9.0, rollout_s=4.0, scoring_s=3.0, training_s=1.5, sync_s=0.5,
                       reward_wait_s=0.25, mean_reward=0.75).metrics()
    assert set(logged) <= set(SERIES.values())
    assert {name: logged[key] for name, key in SERIES.items() if key in logged} == {
        "step_s": 9.0, "rollout_s": 4.0, "scoring_s": 3.0, "training_s": 1.5, "sync_s": 0.5,
        "reward_wait_s": 0.25}
