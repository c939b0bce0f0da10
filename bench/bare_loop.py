"""The serial GRPO step (`overlap=none`) in one process, without Ray or DeepSpeed: the
lower bound the Ray + DeepSpeed serial baseline is measured against.

    .venv/bin/python bench/bare_loop.py             # -> bench/results/cpu_2core_serial_step/bare_loop.json
    .venv/bin/python bench/bare_loop.py debug=fast paths.output_root=/tmp/bare_dbg --steps 2 --warmup 1 \
        --out /tmp/bare_dbg/bare_loop.json

Same config (composed as `python -m asr_grpo.run overlap=none` composes it, Hydra
overrides after the options), same pieces, called directly: the prompt sampler and
groups (`RLRecipe._new_groups`), the HF chunked engine decoding every sequence to its
end, the reward file through `RewardWorker.score`, old and reference log-probs through
`score_once` (shared prompt prefill, `trainer.micro_batch_size` sequences a batch),
`estimate_advantages`, and `actor_loss` through the trainer's own `run_updates` loop
over plain torch AdamW (same parameter groups, LR schedule, clipping, accumulation and
micro-batch order as the DeepSpeed engine). torch uses every core. The engine's sampler
is a hashed (seed, uid, position) draw, so the same weights and prompts sample the same
tokens as the Ray run: compare the per-step mean reward and response length with its
MLflow `reward/total` and `charts/response_length`.

Writes per-step times (the first `--warmup` steps are recorded but left out of the
summary), the phase split (rollout, scoring, training, sync), per-step rewards, response
lengths and a CRC of the sampled tokens.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import zlib
from pathlib import Path

import torch

from portable import portable

REPO = Path(__file__).resolve().parents[1]
PHASES = ("rollout", "scoring", "training", "sync")


# ---- the optimizer DeepSpeed would run ---------------------------------------------------
class PlainEngine:
    """What `run_updates` drives (the `TrainingEngine` interface) over plain torch AdamW:
    the loss scaled by 1 / grad_accum_steps, and at each accumulation boundary the global
    grad norm clipped to `grad_clip`, an optimizer step, then a scheduler step, as DeepSpeed does."""

    def __init__(self, model: torch.nn.Module, trainer, num_training_steps: int):
        from transformers import get_scheduler

        from asr_grpo.distributed.deepspeed_strategy import _param_groups

        self.module = model
        self.optimizer = torch.optim.AdamW(_param_groups(model, trainer.weight_decay), lr=trainer.lr)
        self.scheduler = get_scheduler(trainer.lr_scheduler, self.optimizer, num_warmup_steps=trainer.lr_warmup_steps,
                                       num_training_steps=num_training_steps)
        self.accum, self.clip = trainer.grad_accum_steps, trainer.grad_clip
        self.micro_steps = self.global_steps = 0
        self.global_grad_norm: float | None = None

    def __call__(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def parameters(self, recurse: bool = True):
        return self.module.parameters(recurse)

    def train(self, mode: bool = True) -> "PlainEngine":
        self.module.train(mode)
        return self

    def backward(self, loss: torch.Tensor) -> None:
        (loss / self.accum).backward()

    def step(self) -> bool:
        self.micro_steps += 1
        if self.micro_steps % self.accum:
            return False
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        # max_norm=inf only measures the norm: grad_clip=0 disables clipping.
        norm = torch.nn.utils.clip_grad_norm_(params, self.clip if self.clip > 0 else float("inf"))
        self.global_grad_norm = float(norm)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.global_steps += 1
        return True

    @property
    def lr(self) -> float:
        return self.optimizer.param_groups[0]["lr"]


# ---- set-up ----------------------------------------------------------------------------------
def compose(overrides: list[str]):
    """The serial step with the overlap benchmark's sampling, then the caller's overrides:
    the full override list and the config it composes."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from overlap_speedup import BENCH_SAMPLING, compose_run

    full = ["overlap=none", *BENCH_SAMPLING, *overrides]
    return full, compose_run(full)


def check_supported(cfg) -> None:
    """The GRPO serial step only: no critic, no LM reward model, colocated HF rollout."""
    unsupported = {"algorithm.use_critic": cfg.algorithm.use_critic, "overlap.mode": cfg.overlap.mode != "none",
                   "reward.smoothness_scorer=lm": cfg.reward.smoothness_scorer == "lm",
                   "rollout.engine": cfg.rollout.engine != "hf",
                   "placement.actor_num_ranks": cfg.placement.actor_num_ranks != 1}
    bad = [k for k, v in unsupported.items() if v]
    if bad:
        raise SystemExit(f"bare_loop reproduces the serial GRPO step on one rank; unsupported here: {bad}")


class BareStep:
    """The policy, the frozen reference, the engine, the reward function and the prompt
    source of one run, in this process."""

    def __init__(self, cfg):
        from asr_grpo.config.validate import validate_config
        from asr_grpo.data import AsrDataset, resolve_manifests
        from asr_grpo.experience.maker import ExperienceMaker
        from asr_grpo.experience.prompts import PromptSampler
        from asr_grpo.models import load_model, set_audio_encoder_frozen
        from asr_grpo.recipes.rl import RLRecipe, optimizer_steps_per_rl_step
        from asr_grpo.recipes.start_checkpoint import prepare_start_checkpoint
        from asr_grpo.rollout import HFChunkedEngine
        from asr_grpo.workers.reward import RewardWorker
        from asr_grpo.workers.rng import seed_rngs
        from asr_grpo.workers.rollout_host import sampling_params

        validate_config(cfg)
        check_supported(cfg)
        cfg.model.path = prepare_start_checkpoint(cfg)
        self.cfg = cfg
        seed_rngs(cfg.seed)   # what the policy rank (rank 0) seeds
        model, processor = load_model(cfg.model.path, cfg.model.dtype)
        set_audio_encoder_frozen(model, cfg.model.freeze_audio_encoder)
        self.pad_id = processor.tokenizer.pad_token_id
        self.trainer = PlainEngine(model, cfg.trainer, cfg.trainer.steps * optimizer_steps_per_rl_step(cfg))
        self.engine = HFChunkedEngine(model, model.generation_config.eos_token_id, self.pad_id,
                                      sampling_params(cfg.algorithm, cfg.seed),
                                      max_batch_size=cfg.trainer.rollout_batch_size,
                                      suppress_token_ids=model.generation_config.suppress_tokens)
        self.ref = None
        if cfg.algorithm.kl_coef > 0:
            self.ref, _ = load_model(cfg.model.path, cfg.model.dtype)
            self.ref.eval().requires_grad_(False)
        self.reward = RewardWorker(cfg.reward.reward_file, dict(cfg.reward.weights), cfg.reward.timeout_s,
                                   cfg.reward.on_bad_reward)
        # The recipe's own prompt drawing (`_new_groups`), without its Ray set-up.
        self.prompts = RLRecipe(cfg)
        self.prompts.processor = processor
        self.prompts.train_set = AsrDataset(resolve_manifests(cfg.data, cfg.paths.output_root).rl_prompts, cfg.data)
        self.prompts.sampler = PromptSampler(len(self.prompts.train_set), cfg.seed)
        # Its reward batch and old-log-prob reuse need no role; the rest of `make` waits on Ray.
        self.maker = ExperienceMaker(cfg, processor.tokenizer, None, None, None, None)

    # ---- phases --------------------------------------------------------------------------
    def rollout(self, step: int):
        groups = self.prompts._new_groups(self.cfg.trainer.prompts_per_step, step)
        self.engine.add_requests([r for g in groups for r in g.requests()])
        self.engine.model.eval()
        self.engine.decode(None)   # overlap=none: every sequence to its end in one call
        done = {s.request.uid: s.result() for s in self.engine.pop_finished()}
        return groups, {g.uid: [done[r.uid] for r in g.requests()] for g in groups}

    def logprobs(self, model, refs) -> list[torch.Tensor]:
        """What `ModelRole._logprobs` computes (policy: old, reference: ref)."""
        from asr_grpo.models.kv_batch import causal_lm_forward
        from asr_grpo.models.streaming import score_once, token_logprobs

        model.eval()
        with torch.no_grad():
            return score_once(lambda: causal_lm_forward(model), self.pad_id,
                              token_logprobs(self.cfg.algorithm.temperature), [r.uid for r in refs],
                              [r.prompt_ids for r in refs], [r.features for r in refs],
                              [r.response_ids for r in refs], max_batch_size=max(self.cfg.trainer.micro_batch_size, 1))

    def score(self, groups, results, version: int):
        """`ExperienceMaker.make` without Ray: old and ref log-probs, rewards, advantages."""
        from asr_grpo.experience.types import SequenceRef
        from asr_grpo.rewards.combine import RewardResult

        by_uid = {g.uid: g for g in groups}
        seqs = [s for g in groups for s in results[g.uid]]
        refs = [SequenceRef(s.uid, by_uid[s.group].prompt_ids, s.tokens, by_uid[s.group].features,
                            by_uid[s.group].utterance["language"]) for s in seqs]
        t = {"start": time.monotonic()}
        # algorithm.recompute_old_logprobs=false: the rollout's own log-probs where they can stand in.
        old = self.maker._reusable_old_logprobs(seqs, version)
        missing = [r for r in refs if r.uid not in old]
        old.update(zip((r.uid for r in missing), self.logprobs(self.trainer.module, missing) if missing else []))
        old = [old[r.uid] for r in refs]
        t["old"] = time.monotonic()
        ref = self.logprobs(self.ref, refs) if self.ref is not None else None
        t["ref"] = time.monotonic()
        reward = RewardResult.from_dict(self.reward.score(self.maker.reward_batch(groups, seqs)))
        if reward.num_dropped:
            raise SystemExit("bare_loop: reward.on_bad_reward=drop dropped samples; not reproduced here")
        t["reward"] = time.monotonic()
        items, metrics = experience(self.cfg, seqs, refs, old, ref, reward)
        metrics.update({"time/old_logprobs": t["old"] - t["start"], "time/ref_logprobs": t["ref"] - t["old"],
                        "time/reward": t["reward"] - t["ref"]})
        return items, metrics

    def train(self, items) -> dict[str, float]:
        from asr_grpo.experience.losses import actor_loss
        from asr_grpo.workers.training import run_updates

        cfg = self.cfg
        return run_updates(self.trainer, items, cfg.trainer,
                           lambda model, mb: actor_loss(model, mb, cfg.algorithm, self.pad_id))

    def step(self, step: int) -> dict:
        t0 = time.monotonic()
        groups, results = self.rollout(step)
        t1 = time.monotonic()
        items, metrics = self.score(groups, results, version=self.engine.policy_version)
        t2 = time.monotonic()
        metrics.update(self.train(items))
        t3 = time.monotonic()
        self.engine.policy_version = step + 1   # colocated: the engine decodes with the trained module
        t4 = time.monotonic()
        tokens = [s.tokens for g in groups for s in results[g.uid]]
        return {"step": step, "step_s": t4 - t0, "rollout_s": t1 - t0, "scoring_s": t2 - t1, "training_s": t3 - t2,
                "sync_s": t4 - t3, "reward": metrics["reward/total"],
                "response_length": metrics["charts/response_length"],
                "tokens_crc32": zlib.crc32(json.dumps(tokens).encode()),
                "response_lengths": [len(t) for t in tokens],
                "metrics": {k: float(v) for k, v in sorted(metrics.items())}}


def experience(cfg, seqs, refs, old, ref, reward):
    """`ExperienceMaker.make` from the scores on: advantages, items, metrics."""
    from asr_grpo.experience.maker import experience_items

    items, adv = experience_items(cfg.algorithm, seqs, refs, old, ref, None, reward.total,
                                  cfg.algorithm.n_samples_per_prompt)
    lengths = torch.tensor([len(s.tokens) for s in seqs], dtype=torch.float32)
    return items, {**reward.log("reward/"), **adv.metrics, "charts/response_length": float(lengths.mean())}


# ---- the loop --------------------------------------------------------------------------------
def summarize(rows: list[dict], warmup: int) -> dict:
    measured = rows[warmup:] or rows
    med = {p: statistics.median(r[f"{p}_s"] for r in measured) for p in PHASES}
    mean_step = statistics.mean(r["step_s"] for r in measured)
    return {"measured_steps": len(measured), "median_step_s": statistics.median(r["step_s"] for r in measured),
            "mean_step_s": mean_step, "phases_median_s": med,
            "phase_split": {p: statistics.mean(r[f"{p}_s"] for r in measured) / mean_step for p in PHASES},
            "mean_reward": statistics.mean(r["reward"] for r in measured),
            "mean_response_length": statistics.mean(r["response_length"] for r in measured)}


def run_bare_loop(cfg, steps: int, warmup: int, threads: int | None = None, log=print) -> dict:
    """`warmup + steps` serial GRPO steps; returns the JSON-ready result."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads or os.cpu_count() or 1)
    try:
        t0 = time.monotonic()
        bare = BareStep(cfg)
        setup_s = time.monotonic() - t0
        rows = []
        for step in range(warmup + steps):
            rows.append(bare.step(step))
            r = rows[-1]
            log(f"step {step}: {r['step_s']:.2f} s (rollout {r['rollout_s']:.2f}, scoring {r['scoring_s']:.2f}, "
                f"training {r['training_s']:.2f}) reward {r['reward']:.4f} length {r['response_length']:.1f}")
        return {"threads": torch.get_num_threads(), "warmup_steps": warmup, "setup_s": setup_s,
                "model_path": str(cfg.model.path), "summary": summarize(rows, warmup),
                "per_step": [{k: v for k, v in r.items() if k != "response_lengths"} for r in rows],
                "response_lengths": [r["response_lengths"] for r in rows]}
    finally:
        torch.set_num_threads(before)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=30, help="measured steps")
    ap.add_argument("--warmup", type=int, default=3, help="steps run first and left out of the summary")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: every core)")
    ap.add_argument("--out", type=Path,
                    default=REPO / "bench" / "results" / "cpu_2core_serial_step" / "bare_loop.json")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides, as for `python -m asr_grpo.run`")
    args = ap.parse_intermixed_args(argv)   # overrides before or after the options
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    overrides, cfg = compose(args.overrides)
    load_before = os.getloadavg()
    command = " ".join(["python", "bench/bare_loop.py", *(argv if argv is not None else sys.argv[1:])])
    result = {"command": portable(command),
              "overrides": overrides,
              **run_bare_loop(cfg, args.steps, args.warmup, args.threads)}
    # Other processes on these cores inflate the times: the 1-min load average says how much.
    result["load_average_1min"] = {"before": load_before[0], "after": os.getloadavg()[0]}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["summary"], indent=1))
    return result


if __name__ == "__main__":
    main()
