"""What a finished `overlap=none` run says about its machine (profile=run).

Read back per step: decode time (`perf/time/rollout_decode`), decode rounds and rows
decoded (`overlap/decode_rounds`, `overlap/rows_decoded`), the scoring wall, training,
sync and step times, and the response-length quantiles; from the run's params, the
batch and model settings; from its `rollout/group_lengths.json`, the response lengths
of every group it trained (older runs: the quantiles only). A round's fixed and per-row
cost are the medians of the per-step fits the run logged (`perf/decode/*`); a run
without them has them fitted over the steps, decode = a·rounds + b·rows + c·calls (c: the
step's rebuild and call overhead), by non-negative least squares. Steps that all decode
alike cannot tell a from b: then a `round_fixed_share` of the mean round is taken as
fixed (a stated prior). A benchmark summary (bench/overlap_speedup.py's JSON: phase
means and length quantiles, no per-step series) gives one such step.

A run that asked a reward service (`reward.remote.urls`) and logged the driver's wait on
it (`perf/time/reward_wait`) has that wait fitted on its own: seconds per sequence
sampled (the service's throughput, `cost_model.CostProfile.remote_per_seq_s`), the
local scoring being the scoring wall less the wait. Any other run (a local reward file,
whose wait is local work; an older run) keeps the wait inside the scoring, as before.
"""
from __future__ import annotations

import functools
import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from asr_grpo.config.schema import trained_per_group
from asr_grpo.overlap.cost_model import fit_round_costs, nonneg_least_squares

SERIES = {"decode_s": "perf/time/rollout_decode", "rounds": "overlap/decode_rounds", "rows": "overlap/rows_decoded",
          "scoring_s": "perf/time/scoring_wall", "training_s": "perf/time/training", "sync_s": "perf/time/sync",
          "step_s": "perf/time/step", "rollout_s": "perf/time/rollout",
          "round_fixed_ms": "perf/decode/round_fixed_ms", "round_per_row_ms": "perf/decode/round_per_row_ms",
          "reward_wait_s": "perf/time/reward_wait"}
OPTIONAL = ("rollout_s", "sync_s", "round_fixed_ms", "round_per_row_ms", "reward_wait_s")   # not logged by older runs
LENGTHS = {"mean": "charts/response_length", "p50": "charts/response_length_p50",
           "p90": "charts/response_length_p90", "max": "charts/response_length_max"}
Z90 = 1.2815515655446004   # standard normal 90th percentile


@dataclass
class RunFacts:
    """A serial run, as the fit needs it."""
    source: str
    config: dict                       # flattened run config (MLflow params)
    steps: list[dict]                  # per step: SERIES keys
    lengths: dict[str, float]          # mean, p50, p90, max over steps
    gpu: bool = False
    notes: list[str] = field(default_factory=list)
    groups: list[list[int]] = field(default_factory=list)   # trained groups' response lengths (the run's own)

    def raw(self, key: str):
        """The run's setting `key` as logged; a run that did not log it (an older one) gets
        the shipped default, what `python -m asr_grpo.run` composes without overrides."""
        return self.config[key] if key in self.config else shipped_defaults()[key]

    def get(self, key: str, kind: type = str):
        value = self.raw(key)
        return str(value).lower() == "true" if kind is bool else kind(value)

    @property
    def remote_reward(self) -> bool:
        """Whether the run asked a reward service (its wait is another machine's, which
        streaming can hide) and logged how long it waited on it."""
        return any(s.get("reward_wait_s", 0.0) > 0 for s in self.steps) \
            and str(self.raw("reward.remote.urls")).strip() not in ("", "[]", "None", "null")

    def get_optional_int(self, key: str) -> int | None:
        """An integer setting whose null means "no limit" (logged as None)."""
        value = self.raw(key)
        return None if value in (None, "None", "null", "") else int(value)


def from_mlflow(run_id: str, tracking_uri: str, skip_steps: int = 1) -> RunFacts:
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import RESOURCE_DOES_NOT_EXIST, ErrorCode
    from mlflow.tracking import MlflowClient

    from asr_grpo.tracking import absolute_tracking_uri
    from asr_grpo.tracking.runs import group_lengths, history

    uri = absolute_tracking_uri(tracking_uri)
    client = MlflowClient(uri)
    try:
        run = client.get_run(run_id)
    except MlflowException as e:   # a mistyped id or the wrong store: one line, not MLflow's traceback
        if e.error_code != ErrorCode.Name(RESOURCE_DOES_NOT_EXIST):
            raise
        raise ValueError(f"run {run_id} not found in {uri}") from None
    mode = run.data.params.get("overlap.mode", run.data.tags.get("overlap", "none"))
    if mode != "none":
        raise ValueError(f"run {run_id} ran overlap={mode}: profile=run fits a serial (overlap=none) run")
    series = {k: history(client, run_id, key) for k, key in SERIES.items()}
    missing = [SERIES[k] for k, h in series.items() if not h and k not in OPTIONAL]
    if missing:
        raise ValueError(f"run {run_id} has no {', '.join(missing)}: not an RL run of this project, or too old")
    numbers = sorted(s for s in series["step_s"] if s > skip_steps) or sorted(series["step_s"])
    steps = [{k: h.get(s, 0.0) for k, h in series.items()} for s in numbers]
    lengths = {}
    for q, key in LENGTHS.items():
        h = history(client, run_id, key)
        if h:
            lengths[q] = statistics.fmean(h[s] for s in numbers if s in h) if any(s in h for s in numbers) \
                else statistics.fmean(h.values())
    gpu = any(k.startswith("system/gpu") for k in run.data.metrics)
    by_step = group_lengths(client, run_id)
    groups = [g for s in numbers for g in by_step.get(s, [])]
    return RunFacts(f"mlflow run {run_id}", dict(run.data.params), steps, lengths, gpu, groups=groups)


def from_summary(path: str, workload: str = "", overrides: list[str] | None = None) -> RunFacts:
    """The `none` run of a benchmark JSON (bench/overlap_speedup.py, bench/results/gpu_h200/):
    one mean step, the run config composed from the workload's overrides."""
    data = json.loads(Path(path).read_text())
    entries = data if isinstance(data, list) else [data]
    entry = next((e for e in entries if not workload or e.get("workload") == workload), None)
    if entry is None:
        raise ValueError(f"{path}: no workload {workload!r} (has {', '.join(e.get('workload', '?') for e in entries)})")
    summary = entry.get("runs", {}).get("none")
    if summary is None:
        raise ValueError(f"{path}: workload {entry.get('workload')!r} has no per-run summary of its `none` run")
    cfg = compose_run_config(list(entry.get("overrides", [])) + list(overrides or []))
    B, n = int(cfg["trainer.prompts_per_step"]), int(cfg["algorithm.n_samples_per_prompt"])
    rl = summary["response_length"]
    ph = summary["phases_s"]
    step = {"decode_s": ph.get("rollout_decode", ph["rollout"]), "rounds": rl["_max"], "rows": B * n * rl[""],
            "scoring_s": ph["scoring_wall"], "training_s": ph["training"], "sync_s": ph.get("sync", 0.0),
            "step_s": summary["mean_step_s"], "rollout_s": ph["rollout"], "reward_wait_s": ph.get("reward_wait", 0.0)}
    lengths = {"mean": rl[""], "p50": rl["_p50"], "p90": rl["_p90"], "max": rl["_max"]}
    gpu = any("gpu" in k for k in summary.get("system", {}))
    return RunFacts(f"{path} ({entry.get('workload')}, run {summary.get('run_id', '?')})", cfg, [step], lengths, gpu,
                    ["decode rounds per step taken as the mean longest response (a serial step decodes to it)"])


@functools.cache
def shipped_defaults() -> dict:
    return compose_run_config([])


def compose_run_config(overrides: list[str]) -> dict:
    """The run config a benchmark composed from its overrides, flattened like MLflow params."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from asr_grpo.config import register_configs
    from asr_grpo.config.store import CONF_DIR
    from asr_grpo.tracking import flatten_config

    register_configs()
    gh = GlobalHydra.instance()
    outer = gh.hydra if gh.is_initialized() else None   # inside a Hydra app (the forecast CLI)
    gh.clear()
    try:
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            cfg = compose("config", overrides=[o for o in overrides if not o.startswith("hydra.")])
    finally:
        gh = GlobalHydra.instance()
        gh.clear()
        if outer is not None:
            gh.initialize(outer)
    return flatten_config(cfg)


@dataclass
class Fit:
    round_fixed_s: float
    round_per_row_s: float
    rebuild_s: float                   # per step: prompts' prefill and call overhead
    score_fixed_s: float
    score_per_token_s: float
    train_fixed_s: float
    train_per_token_s: float
    sync_s: float
    other_s: float
    notes: list[str]
    remote_per_seq_s: float = 0.0      # a reward service's seconds per sequence (0: no service)


def trained_per_prompt(facts: RunFacts) -> int | None:
    """The run's `algorithm.train_samples_per_prompt` where it trained fewer than it sampled
    (None: all samples train)."""
    n = facts.get("algorithm.n_samples_per_prompt", int)
    m = trained_per_group(n, facts.get_optional_int("algorithm.train_samples_per_prompt"))
    return m if m < n else None


def fit(facts: RunFacts, round_fixed_share: float = 0.12, prompt_tokens: int = 64) -> Fit:
    """Scoring and training per token, as the simulator charges them: a scorer forwards the
    responses and each group's prompt once; training runs every sequence whole. Each
    phase is fitted over its typical steps (`typical`), fixed parts are medians: the fit
    describes the run's median step, which is what the benchmark compares."""
    steps, notes = facts.steps, []
    col = lambda k: [s[k] for s in steps]  # noqa: E731
    decode, rounds, rows = col("decode_s"), col("rounds"), col("rows")
    groups, n = facts.get("trainer.prompts_per_step", int), facts.get("algorithm.n_samples_per_prompt", int)
    share = (trained_per_prompt(facts) or n) / n   # down-sampling: only the kept samples score and train
    scored = [share * w + groups * prompt_tokens for w in rows]
    trained = [share * (w + groups * n * prompt_tokens) for w in rows]
    keep = typical(decode, rows)
    decode, rounds, rows = ([v[i] for i in keep] for v in (decode, rounds, rows))
    timed = [steps[i] for i in keep if steps[i].get("round_per_row_ms", 0.0) > 0]
    if timed:
        # The engines timed every round: each step logged its own a + b·rows fit.
        a = statistics.median(s["round_fixed_ms"] for s in timed) / 1e3
        b = statistics.median(s["round_per_row_ms"] for s in timed) / 1e3
        c = statistics.median(max(0.0, d - a * k - b * w) for d, k, w in zip(decode, rounds, rows))
        notes.append(f"decode rounds: timed by the engines in {len(timed)} steps (medians of their fits); the "
                     "rest of the decode time is the step's rebuild and call overhead")
    else:
        r = fit_round_costs(decode, rounds, rows, [1.0] * len(keep)) if len(keep) >= 3 else None
        a, b, c, spread = (r["round_fixed_s"], r["round_per_row_s"], r["per_call_s"], r["spread"]) if r \
            else (0.0, 0.0, 0.0, 0.0)
        if r is None or spread < 0.05 or a + b == 0:
            d, k, w = statistics.median(decode), statistics.median(rounds), statistics.median(rows)
            a, b, c = round_fixed_share * d / k, (1 - round_fixed_share) * d / w, 0.0
            notes.append(f"decode rounds: the steps decode alike (rows per round spread {spread:.0%}); a = "
                         f"{round_fixed_share:.0%} of the median round (stated prior), b the rest per row")
    # A reward service's wait is fitted per sequence sampled (it answers every sample,
    # before any down-sampling), the local scoring on what is left of the wall: the split
    # `CostFitter.observe_step` makes in a run, so a streaming plan can hide the one part.
    waits = [s.get("reward_wait_s", 0.0) if facts.remote_reward else 0.0 for s in steps]
    remote = statistics.median(w / (groups * n) for w in waits)
    s0, s = linear([max(0.0, sc - w) for sc, w in zip(col("scoring_s"), waits)], scored)
    t0, t = linear(col("training_s"), trained)
    other = statistics.median(max(0.0, st["step_s"] - st.get("rollout_s", st["decode_s"]) - st["scoring_s"]
                                  - st["training_s"] - st["sync_s"]) for st in steps)
    if remote:
        notes.append(f"reward service: {1e3 * remote:.2f} ms a sequence (median perf/time/reward_wait "
                     f"{statistics.median(waits):.3f} s over {groups * n} sequences sampled a step), apart from "
                     "the local scoring; streaming plans send each sequence when the decode call it finished in ends")
    dropped = len(steps) - len(keep)
    notes.append(f"decode round = {1e3 * a:.3f} ms + {1e3 * b:.4f} ms/row; rebuild {1e3 * c:.1f} ms/step; "
                 f"scoring {1e3 * s0:.1f} ms + {1e6 * s:.1f} us/token; training {1e3 * t0:.1f} ms + "
                 f"{1e6 * t:.1f} us/token, tokens of prompt ({prompt_tokens}) + response ({len(steps)} step(s)"
                 + (f"; the decode of {dropped} slow step(s) left out" if dropped else "") + ")")
    return Fit(a, b, c, s0, s, t0, t, statistics.median(col("sync_s")), other, notes, remote)


# A step whose phase took this much longer per unit of work than the run's median is a
# hiccup of the machine, not its cost: on a shared 2-core machine the same work now and
# then takes up to 2.7x longer.
SLOW = 1.25


def typical(y: list[float], x: list[float]) -> list[int]:
    """The steps whose y per unit of x is within `SLOW` of the median one."""
    ratios = [yi / xi if xi > 0 else 0.0 for yi, xi in zip(y, x)]
    if not ratios:
        return []
    mid = statistics.median(ratios)
    return [i for i, r in enumerate(ratios) if r <= SLOW * mid]


def linear(y: list[float], x: list[float]) -> tuple[float, float]:
    """y = c0 + c1·x, non-negative, over the typical steps; one point (or no spread in x):
    all of it per unit of x."""
    keep = typical(y, x)
    y, x = [y[i] for i in keep], [x[i] for i in keep]
    if len(y) >= 3 and max(x) > min(x) * 1.02:
        c0, c1 = nonneg_least_squares([[1.0, xi] for xi in x], y)
        if c1 > 0:
            return c0, c1
    return 0.0, statistics.median(y) / max(1e-9, statistics.median(x))


def run_length_components(lengths: dict[str, float], prompts: int, samples: int, sample_sigma: float,
                          tail_sigma: float = 0.15) -> tuple[list[tuple[float, float, float]], str]:
    """(weight, median, log-sd) components for a run's logged length quantiles: a lognormal
    through p50 and p90; where the run's longest response per step lies well beyond what
    that body gives for `prompts` x `samples` draws (run-on samples), a straggler component
    of one sequence per step on average at that length stands for it."""
    median, sigma = lognormal_from_quantiles(lengths["p50"], lengths["p90"], sample_sigma)
    comps, note = [(1.0, median, sigma)], f"lognormal median {median:.1f}, log-sd {sigma:.2f}"
    n = prompts * samples
    z = statistics.NormalDist().inv_cdf((n - 0.375) / (n + 0.25))   # expected max of n normals (Blom)
    body_max = median * math.exp(z * math.hypot(sigma, sample_sigma))
    longest = lengths.get("max", 0.0)
    if longest > 1.25 * body_max:
        w = 1.0 / n
        comps = [(1.0 - w, median, sigma), (w, longest, tail_sigma)]
        note += (f", + stragglers (weight 1/{n}) at {longest:.0f} tokens: the body's longest of {n} would be "
                 f"~{body_max:.0f}")
    return comps, note


def lognormal_from_quantiles(p50: float, p90: float, sample_sigma: float) -> tuple[float, float]:
    """(median, log-sd across prompts) of a lognormal with these pooled quantiles, the
    within-prompt spread taken out of the pooled one."""
    total = math.log(max(p90, p50 * 1.0001) / max(1.0, p50)) / Z90
    return max(1.0, p50), math.sqrt(max(0.0, total ** 2 - sample_sigma ** 2))
