"""The three sources of a forecast's costs, each giving a `SimProfile` and the workload
it is simulated on:

- `roofline`: a GPU's datasheet (conf/forecast_gpu) and model shapes (conf/forecast_model),
  placed as conf/forecast_placement says;
- `run`: fitted from an `overlap=none` MLflow run (or a benchmark's summary of one): the
  run's own batch, lengths and phase timings;
- `file`: a cost table measured on a real machine (`bench/gpu_profile.sh` writes one;
  format in `read_cost_table`), placed as conf/forecast_placement says.
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

from asr_grpo.forecast import roofline
from asr_grpo.forecast.costs import DecodeCost, Forward, RoleCost, SimProfile
from asr_grpo.forecast.runfit import (
    RunFacts,
    fit,
    from_mlflow,
    from_summary,
    run_length_components,
    trained_per_prompt,
)
from asr_grpo.forecast.workload import Component, Workload, histogram, lognormal_mixture, read_histogram

COST_TABLE_FORMAT = "asr-grpo-cost-table/1"
SCORING_ROLES = ("ref", "critic", "reward_model")
# Relative cost of each scorer's forward in a serial run's measured scoring wall (profile=run):
# actor (old log-probs), reference and critic run the same backbone; the LM reward model
# (reward=asr_lm) is the project's small text LM.
SCORING_WEIGHTS = {"actor": 1.0, "ref": 1.0, "critic": 1.0, "reward_model": 0.25}


def length_model(lc):
    if lc.kind == "lognormal":
        return lognormal_mixture([Component(c.weight, c.median, c.sigma) for c in lc.components], lc.sample_sigma)
    if lc.kind == "histogram":
        if not lc.path:
            raise ValueError("lengths.kind=histogram needs lengths.path (a JSON list of lengths, or one per line)")
        return histogram(read_histogram(lc.path))
    raise ValueError(f"lengths.kind={lc.kind!r}: expected lognormal or histogram")


def workload_from(cfg) -> Workload:
    w = cfg.workload
    return Workload(length_model(cfg.lengths), int(w.prompts_per_step), int(w.n_samples), int(w.max_new_tokens),
                    int(w.prompt_text_tokens), float(w.audio_tokens_per_token), int(cfg.seed), w.train_samples)


def token_mix(workload: Workload) -> tuple[roofline.Mix, roofline.Mix]:
    """Response and audio shares of the tokens a step forwards, from 1,000 drawn prompts:
    for scoring (a group's n responses and its prompt once) and for training (every
    sequence with its prompt)."""
    groups = [f"p-{i}" for i in range(1000)]
    resp = statistics.fmean(statistics.fmean(min(workload.max_new_tokens, x) for x in workload._group(g)[0])
                            for g in groups)
    prompt = statistics.fmean(workload.prompt_tokens(g) for g in groups)
    audio = max(0.0, prompt - workload.prompt_text_tokens)
    n = workload.n
    score = roofline.Mix(n * resp / (n * resp + prompt), audio / (n * resp + prompt))
    return score, roofline.Mix(resp / (resp + prompt), audio / (resp + prompt))


def stream_hidden(placement, default: float = 0.5) -> float:
    return default if placement.stream_hidden is None else float(placement.stream_hidden)


def placed_roles(placement) -> dict[str, str]:
    """role -> device group, for the roles this placement has."""
    roles = {"actor": placement.actor}
    roles.update({r: getattr(placement, r) for r in SCORING_ROLES if getattr(placement, r)})
    unknown = {d for d in [*roles.values(), placement.rollout] if d not in placement.devices}
    if unknown:
        raise ValueError(f"placement {placement.name!r} puts roles on {', '.join(sorted(unknown))}, "
                         f"which placement.devices ({', '.join(placement.devices)}) does not have")
    return roles


def engines(placement) -> int:
    gpus = int(placement.devices[placement.rollout])
    if gpus % placement.engine_gpus:
        raise ValueError(f"{gpus} rollout GPUs do not split into engines of {placement.engine_gpus}")
    return gpus // int(placement.engine_gpus)


# ---- roofline ---------------------------------------------------------------------------------
def roofline_profile(cfg, workload: Workload) -> SimProfile:
    pl, gpu = cfg.placement, cfg.gpu
    actor, rm = roofline.shape_of(cfg.model), roofline.shape_of(cfg.reward_model)
    mix, train_mix = token_mix(workload)
    epochs = int(cfg.workload.train_epochs)
    roles = {}
    for role, device in placed_roles(pl).items():
        shape = rm if role == "reward_model" else actor
        roles[role] = roofline.role_costs(role, device, int(pl.devices[device]), shape, gpu, mix, train_mix, epochs,
                                          trains=role in ("actor", "critic"))
    tp = int(pl.engine_gpus)
    prefill_flops = roofline.forward_flops_per_token(actor, roofline.Mix(0.0, mix.audio_share), head=False)
    prefill = roofline.forward_cost(actor, gpu, 1, prefill_flops)
    prefill.mem_s /= tp
    prefill.per_token_s /= tp
    hybrid = pl.rollout == pl.actor
    bw = gpu.hbm_bandwidth_GBps * 1e9 * gpu.mem_efficiency
    sync = actor.weight_bytes / bw if hybrid else actor.weight_bytes / (gpu.interconnect_GBps * 1e9)
    notes = [f"roofline: {gpu.name} ({gpu.hbm_bandwidth_GBps:.0f} GB/s x {gpu.mem_efficiency}, "
             f"{gpu.bf16_dense_tflops:.0f} TFLOP/s x {gpu.flop_efficiency} / train x {gpu.train_efficiency}, "
             f"{1e3 * gpu.round_overhead_s:.1f} ms per round), {cfg.model.name} ({actor.total / 1e9:.2f}B params)"
             + (f", reward model {cfg.reward_model.name}" if "reward_model" in roles else ""),
             f"tokens scored: {mix.response_share:.0%} response, {mix.audio_share:.0%} audio (a prompt once per "
             f"group); trained: {train_mix.response_share:.0%} response, {train_mix.audio_share:.0%} audio",
             "weight sync: " + ("device copy (hybrid engine)" if hybrid else "NVLink broadcast")]
    dec = roofline.decode_cost(actor, gpu, tp)
    notes.append(f"decode round: memory {1e3 * dec.mem_s:.2f} ms, compute {1e6 * dec.flop_s:.1f} us/row: "
                 f"compute-bound from {int(dec.mem_s / dec.flop_s) + 1} live rows (more with long contexts: KV reads)")
    weights_gb = actor.total * actor.dtype_bytes / 1e9
    if weights_gb * 1.1 > gpu.memory_GB * tp:
        notes.append(f"WARNING: {weights_gb:.0f} GB of weights on a {gpu.memory_GB:.0f} GB GPU")
    return SimProfile("roofline", engines(pl), pl.rollout, dec, prefill, roles,
                      [r for r in pl.stream if r in roles], stream_hidden(pl), float(pl.decode_call_s), 0.0,
                      float(pl.reward_per_sample_s), sync, float(pl.step_fixed_s), epochs,
                      bool(cfg.workload.recompute_old_logprobs), notes)


# ---- a measured cost table ------------------------------------------------------------------
def read_cost_table(path: str) -> dict:
    """A JSON cost table measured on one GPU (`bench/gpu_profile.sh`):

        {"format": "asr-grpo-cost-table/1", "device": "NVIDIA H200", "gpus": 1, "dtype": "bfloat16",
         "model": {...shape...},
         "decode_round_s": {"1": 0.011, "8": 0.012, "64": 0.014, "256": 0.022},  # rows -> s per round
         "decode_context_tokens": 192,            # context per row when those rounds were timed
         "forward_call_s": 0.012,                 # a forward over a few tokens (weights read once)
         "prefill_tokens_per_s": 120000.0,        # forward over many tokens
         "train_tokens_per_s": {"actor": 40000.0, "critic": 45000.0},   # forward + backward + step
         "train_step_fixed_s": 0.03,              # the optimizer step alone
         "weight_sync_s": 0.02}                   # pushing the weights to an engine
    """
    table = json.loads(Path(path).read_text())
    if table.get("format") != COST_TABLE_FORMAT:
        raise ValueError(f"{path}: not a cost table (format {table.get('format')!r}, expected {COST_TABLE_FORMAT!r})")
    missing = [k for k in ("decode_round_s", "prefill_tokens_per_s", "train_tokens_per_s", "weight_sync_s")
               if k not in table]
    if missing:
        raise ValueError(f"{path}: cost table without {', '.join(missing)}")
    return table


def file_profile(cfg, workload: Workload) -> SimProfile:
    table, pl = read_cost_table(cfg.cost_file), cfg.placement
    rows = sorted((float(r), float(s)) for r, s in table["decode_round_s"].items())
    per_token = 1.0 / float(table["prefill_tokens_per_s"])
    call = float(table.get("forward_call_s", 0.0))
    # The reward model's forward scales with its share of the actor's parameters.
    rm_scale = roofline.shape_of(cfg.reward_model).total / roofline.shape_of(cfg.model).total
    roles = {}
    for role, device in placed_roles(pl).items():
        g = int(pl.devices[device])
        scale = rm_scale if role == "reward_model" else 1.0
        cost = RoleCost(device, Forward(0.0, call * scale, per_token * scale / g))
        if role in ("actor", "critic"):
            tps = table["train_tokens_per_s"].get(role) or table["train_tokens_per_s"]["actor"]
            cost.train_per_token_s = 1.0 / (float(tps) * g)
            cost.train_fixed_s = float(table.get("train_step_fixed_s", 0.0)) * int(cfg.workload.train_epochs)
        roles[role] = cost
    decode = DecodeCost(table_rows=[r for r, _ in rows], table_s=[s for _, s in rows])
    notes = [f"measured table {cfg.cost_file} ({table.get('device', '?')}, model "
             f"{table.get('model', {}).get('name', '?')}): decode {1e3 * rows[0][1]:.2f} ms at {rows[0][0]:.0f} rows, "
             f"{1e3 * rows[-1][1]:.2f} ms at {rows[-1][0]:.0f}; prefill {table['prefill_tokens_per_s']:.0f} tok/s",
             "the table's context per row is in its round times; the per-GPU rates divide over each device group"]
    if "reward_model" in roles:
        notes.append(f"reward model: the actor's forward scaled by the parameter ratio {rm_scale:.2f}")
    return SimProfile("file", engines(pl), pl.rollout, decode, Forward(call, 0.0, per_token), roles,
                      [r for r in pl.stream if r in roles], stream_hidden(pl), float(pl.decode_call_s), 0.0,
                      float(pl.reward_per_sample_s), float(table["weight_sync_s"]), float(pl.step_fixed_s),
                      int(cfg.workload.train_epochs), bool(cfg.workload.recompute_old_logprobs), notes)


# ---- a serial run ---------------------------------------------------------------------------
def run_facts(cfg) -> RunFacts:
    src = cfg.run
    if src.summary_json:
        return from_summary(src.summary_json, src.workload)
    if not src.run_id:
        raise ValueError("profile=run needs run.run_id=<MLflow run of overlap=none> (or run.summary_json=<bench JSON>)")
    return from_mlflow(src.run_id, src.tracking_uri, int(src.skip_steps))


def run_profile(cfg, facts: RunFacts, round_costs: dict | None = None) -> tuple[SimProfile, Workload]:
    """`round_costs` (round_fixed_s, round_per_row_s, rebuild_s) replaces the run's own decode
    fit: e.g. one fitted over several serial runs of the same machine and model."""
    src = cfg.run
    f = fit(facts, float(src.round_fixed_share), int(src.prompt_tokens))
    if round_costs is not None:
        f.round_fixed_s, f.round_per_row_s = round_costs["round_fixed_s"], round_costs["round_per_row_s"]
        f.rebuild_s = round_costs.get("rebuild_s", 0.0)
        f.notes.append(f"decode round costs given: {1e3 * f.round_fixed_s:.3f} ms + {1e3 * f.round_per_row_s:.4f} "
                       f"ms/row, rebuild {1e3 * f.rebuild_s:.1f} ms/step ({round_costs.get('source', 'given')})")
    B, n = facts.get("trainer.prompts_per_step", int), facts.get("algorithm.n_samples_per_prompt", int)
    max_new = facts.get("algorithm.max_new_tokens", int)
    use_critic = facts.get("algorithm.name") == "ppo" or facts.get("algorithm.use_critic", bool)
    use_lm = facts.get("reward.smoothness_scorer") == "lm"
    recompute = facts.get("algorithm.recompute_old_logprobs", bool)
    gpu = facts.gpu if src.device == "auto" else src.device == "gpu"
    colocate = facts.get("placement.colocate", bool)
    roles_here = ["actor", "ref"] + (["critic"] if use_critic else []) + (["reward_model"] if use_lm else [])
    weights = {r: SCORING_WEIGHTS[r] for r in roles_here if r != "actor" or recompute}
    device = "gpu" if gpu else "cpu"
    roles = {r: RoleCost(device, Forward(0.0, 0.0, f.score_per_token_s * weights.get(r, 0.0) / sum(weights.values())))
             for r in roles_here}
    roles["actor"].train_per_token_s, roles["actor"].train_fixed_s = f.train_per_token_s, f.train_fixed_s
    hidden = 0.0 if not gpu else stream_hidden(cfg.placement, 0.5 if colocate else 1.0)
    prompt = int(src.prompt_tokens)
    prefill = Forward(0.0, 0.0, f.rebuild_s / max(1, B * prompt))
    lengths = facts.lengths
    notes = [f"fitted from {facts.source}", *facts.notes, *f.notes,
             f"scoring split over {', '.join(f'{r} {w / sum(weights.values()):.0%}' for r, w in weights.items())} "
             "(same backbone; the LM reward model a quarter), taking turns on one "
             + ("GPU" if gpu else "CPU"),
             f"streamed work hidden by the decode: {hidden:.0%} ("
             + ("GPU, " + ("colocated" if colocate else "separate") if gpu else "CPU: scorers share the cores") + ")",
             f"carried tokens re-prefill at the run's rebuild cost per prompt token ({prompt} tokens a prompt)",
             f"every decode and streaming call beyond the serial step's one: {1e3 * src.stream_call_s:.0f} ms "
             "(an actor call; not in a serial run)"]
    if f.remote_per_seq_s and use_lm:
        notes.append("the reward takes the LM reward model's scores: the service is asked after them, in every "
                     "mode (the recipe streams only rewards that need nothing but the text)")
    profile = SimProfile("run", 1, device, DecodeCost(overhead_s=f.round_fixed_s, row_s=f.round_per_row_s), prefill,
                         roles, [r for r in roles_here if r != "actor"], hidden, float(src.stream_call_s),
                         float(src.stream_call_s),
                         0.0, f.sync_s, f.other_s + f.score_fixed_s, 1, recompute, notes, f.remote_per_seq_s,
                         facts.get("reward.remote.feed", bool))
    lc = cfg.lengths
    if lc.from_run and facts.groups:
        model = histogram(facts.groups)
        flat = sorted(x for g in facts.groups for x in g)
        notes.append(f"lengths: the run's own {len(facts.groups)} trained groups, drawn whole (p50 "
                     f"{flat[len(flat) // 2]}, p90 {flat[int(0.9 * (len(flat) - 1))]}, longest {flat[-1]})")
    elif lc.from_run and {"p50", "p90"} <= set(lengths):
        comps, how = run_length_components(lengths, B, n, lc.sample_sigma)
        model = lognormal_mixture([Component(*c) for c in comps], lc.sample_sigma)
        notes.append(f"lengths: the run's own (p50 {lengths['p50']:.1f}, p90 {lengths['p90']:.1f}, longest per step "
                     f"{lengths.get('max', float('nan')):.0f}): {how}; log-sd {lc.sample_sigma:.2f} within a prompt")
    else:
        model = length_model(lc)
        notes.append(f"lengths: {lc.name}")
    workload = Workload(model, B, n, max_new, prompt, 0.0, int(cfg.seed), trained_per_prompt(facts))
    return profile, workload


def build(cfg) -> tuple[SimProfile, Workload]:
    """The profile and workload a forecast config asks for."""
    if cfg.profile == "run":
        return run_profile(cfg, run_facts(cfg))
    workload = workload_from(cfg)
    if cfg.profile == "roofline":
        return roofline_profile(cfg, workload), workload
    if cfg.profile == "file":
        if not cfg.cost_file:
            raise ValueError("profile=file needs cost_file=<JSON cost table> (bench/gpu_profile.sh writes one)")
        return file_profile(cfg, workload), workload
    raise ValueError(f"profile={cfg.profile!r}: expected roofline, run or file")
