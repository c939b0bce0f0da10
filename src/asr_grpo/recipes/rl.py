"""The RL recipe (GRPO / PPO): setup -> train -> save -> cleanup.

One step: rollout (scheduler) -> scoring (old/ref log-probs, values, rewards, run
concurrently in their roles) -> advantages -> policy and critic updates (DeepSpeed) ->
weight sync to separate rollout workers -> metrics to MLflow.
"""
from __future__ import annotations

import logging
import math
import time
from pathlib import Path

import numpy as np
import ray
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from asr_grpo.config.schema import RunConfig
from asr_grpo.config.validate import validate_config
from asr_grpo.data import AsrDataset, resolve_manifests
from asr_grpo.distributed.deepspeed_strategy import backend_for_device
from asr_grpo.distributed.net import free_port
from asr_grpo.distributed.placement import create_placement_group, plan_placement, role_counts
from asr_grpo.distributed.ray_cluster import shutdown_ray, start_ray
from asr_grpo.distributed.role_group import RoleGroup
from asr_grpo.distributed.roles.critic import CriticRole
from asr_grpo.distributed.roles.policy import PolicyRole
from asr_grpo.distributed.roles.reference import ReferenceRole
from asr_grpo.distributed.roles.reward_model import RewardModelRole
from asr_grpo.distributed.roles.rollout import RolloutRole
from asr_grpo.experience.maker import ExperienceMaker, split_even
from asr_grpo.experience.prompts import PromptSampler, build_group
from asr_grpo.models import is_complete_checkpoint, load_processor
from asr_grpo.models.text_lm import ensure_text_lm
from asr_grpo.overlap.scheduler import RolloutScheduler
from asr_grpo.recipes import checkpointing as ckpt
from asr_grpo.rewards.text import error_rates_by_language
from asr_grpo.rewards.worker import RewardWorker
from asr_grpo.tracking import MlflowRun

log = logging.getLogger(__name__)


def ensure_sft_checkpoint(cfg: RunConfig | DictConfig) -> None:
    """The default model.path is the SFT checkpoint: build it (corpus + SFT) when missing."""
    if is_complete_checkpoint(cfg.model.path):
        return
    if Path(cfg.model.path).resolve() != Path(cfg.sft.output_dir).resolve():
        raise FileNotFoundError(f"model.path={cfg.model.path} is not a complete HF checkpoint folder")
    log.info("no SFT checkpoint at %s: building the corpus and running SFT first", cfg.model.path)
    from asr_grpo.recipes.sft import run_sft

    run_sft(cfg)


def optimizer_steps_per_rl_step(cfg) -> int:
    per_rank = cfg.trainer.prompts_per_step * cfg.algorithm.n_samples_per_prompt // cfg.placement.actor_num_ranks
    micro = math.ceil(per_rank / cfg.trainer.micro_batch_size)
    return max(1, cfg.trainer.train_epochs * micro // cfg.trainer.grad_accum_steps)


class RLRecipe:
    def __init__(self, cfg: RunConfig | DictConfig, run_name: str = "rl"):
        self.cfg, self.run_name = cfg, run_name
        self.step = 0

    # ---- setup ---------------------------------------------------------------------------
    def setup(self) -> None:
        cfg = self.cfg
        validate_config(cfg)
        use_lm = cfg.reward.smoothness_scorer == "lm"
        counts = role_counts(cfg.placement, use_critic=cfg.algorithm.use_critic,
                             use_ref=cfg.algorithm.kl_coef > 0, use_reward_model=use_lm)
        if cfg.placement.colocate:
            counts["rollout"] = 0   # the policy ranks roll out with their own weights
        self.separate_rollout = counts["rollout"] > 0
        self.plan = plan_placement(cfg.placement, counts)   # fails here, before Ray starts
        ensure_sft_checkpoint(cfg)
        if use_lm:
            ensure_text_lm(cfg)   # trained on the corpus text once, then cached
        self.processor = load_processor(cfg.model.path)
        manifests = resolve_manifests(cfg.data, cfg.paths.output_root)
        self.train_set = AsrDataset(manifests.train, cfg.data)
        self.dev_set = AsrDataset(manifests.dev, cfg.data)
        self.sampler = PromptSampler(len(self.train_set), cfg.seed)

        start_ray(cfg.placement)
        self.pg = create_placement_group(self.plan) if self.plan.bundles else None
        cfg_dict = OmegaConf.to_container(cfg, resolve=True)
        opt_steps = cfg.trainer.steps * optimizer_steps_per_rl_step(cfg)
        mk = lambda role, cls, **kw: RoleGroup(role, cls, self.plan, self.pg, init_kwargs=kw)  # noqa: E731
        self.policy = mk("actor", PolicyRole, cfg=cfg_dict, optimizer_steps=opt_steps)
        self.ref = mk("ref", ReferenceRole, cfg=cfg_dict) if counts["ref"] else None
        self.critic = mk("critic", CriticRole, cfg=cfg_dict, optimizer_steps=opt_steps) if counts["critic"] else None
        self.reward = mk("reward", RewardWorker, reward_file=cfg.reward.reward_file,
                         weights=dict(cfg.reward.weights), timeout_s=cfg.reward.timeout_s,
                         on_bad_reward=cfg.reward.on_bad_reward)
        self.reward_model = mk("reward_model", RewardModelRole, cfg=cfg_dict) if use_lm else None
        self.rollout_group = mk("rollout", RolloutRole, cfg=cfg_dict) if self.separate_rollout else None
        self.groups = [g for g in (self.policy, self.ref, self.critic, self.reward_model, self.reward,
                                   self.rollout_group)
                       if g is not None]
        for g in self.groups:
            g.wait_ready()
        if self.rollout_group is not None:
            self._join_weight_sync()
        hosts = self.policy if self.rollout_group is None else self.rollout_group
        scorers = {name: g for name, g in (("ref", self.ref), ("values", self.critic), ("lm", self.reward_model))
                   if g is not None}
        self.scheduler = RolloutScheduler(cfg.overlap, cfg.trainer.prompts_per_step, hosts, scorers)
        self.maker = ExperienceMaker(cfg, self.processor.tokenizer, self.policy, self.ref, self.critic, self.reward,
                                     self.reward_model)
        self.placement = {g.role: g.placement_report() for g in self.groups}

    # ---- weight sync (placement=separate) ------------------------------------------------
    def _join_weight_sync(self) -> None:
        world = 1 + self.rollout_group.world_size
        addr, port = self.policy.master_addr, free_port()
        backend = backend_for_device()
        # The remote members first: creating the group blocks until all have joined.
        refs = [h.join_weight_sync.remote(addr, port, i + 1, world, backend)
                for i, h in enumerate(self.rollout_group.handles)]
        ray.get(refs + self.policy.call("join_weight_sync", addr, port, world, backend))

    def sync_weights(self, version: int) -> float:
        """Push the policy's weights to the rollout workers; returns seconds spent."""
        t0 = time.monotonic()
        if self.rollout_group is not None:
            ray.get(self.rollout_group.call("receive_weights", version) + self.policy.call("broadcast_weights"))
        ray.get(self.policy.call("set_policy_version", version))
        return time.monotonic() - t0

    # ---- one step ---------------------------------------------------------------------
    def _group(self, index: int, step: int):
        uid = f"s{step}:{self.train_set.utterances[index].id}"
        return build_group(self.processor, self.train_set[index], self.cfg.algorithm.n_samples_per_prompt,
                           uid, step, index)

    def train_step(self, step: int) -> dict[str, float]:
        t0 = time.monotonic()
        chunk = self.scheduler.chunk_for(step)
        rollout = self.scheduler.rollout(step, lambda k: [self._group(i, step) for i in self.sampler.next(k)])
        t_score = time.monotonic()
        self.last_rollout = rollout   # kept for inspection (tests, debugging)
        items, metrics = self.maker.make(rollout.groups, rollout.results, rollout.streamed)
        metrics.update(rollout.metrics)
        t_train = time.monotonic()
        trainers = [g for g in (self.policy, self.critic) if g is not None]
        pending = [g.call_split("train", split_even(items, g.world_size)) for g in trainers]
        for refs in pending:
            metrics.update(mean_over_ranks(ray.get(refs)))
        t_sync = time.monotonic()
        sync_s = self.sync_weights(step + 1)
        t_end = time.monotonic()
        step_s = t_end - t0
        metrics.update({"perf/time/rollout": t_score - t0,
                        "perf/time/scoring_wall": t_train - t_score, "perf/time/training": t_sync - t_train,
                        "perf/time/sync": sync_s,
                        "perf/time/step": step_s, "charts/num_sequences": float(len(items)),
                        **self.utilization(step_s)})
        self.scheduler.end_step(step, chunk, step_s, metrics.get("reward/total", float("nan")))
        return metrics

    def utilization(self, wall_s: float) -> dict[str, float]:
        """perf/util/<role>: busy seconds over wall seconds, averaged over the role's ranks;
        perf/idle/<role>: the seconds of the step it waited (what overlap can take away)."""
        out = {}
        for g in self.groups:
            busy = ray.get(g.call("take_busy_seconds"))
            out[f"perf/util/{g.role}"] = sum(busy) / (len(busy) * wall_s) if busy and wall_s > 0 else 0.0
            out[f"perf/busy/{g.role}"] = sum(busy) / max(1, len(busy))
            out[f"perf/idle/{g.role}"] = max(0.0, wall_s - out[f"perf/busy/{g.role}"])
        return out

    # ---- evaluation ---------------------------------------------------------------------
    def evaluate(self) -> dict[str, float]:
        """Greedy CER/WER on the first `trainer.eval_max_utterances` dev utterances,
        sharded over the policy ranks."""
        n = min(len(self.dev_set), self.cfg.trainer.eval_max_utterances)
        items = [self.dev_set[i] for i in range(n)]
        shards = split_even(items, self.policy.world_size)
        refs = [h.transcribe.remote([it["audio"] for it in s], [it["language"] for it in s])
                for h, s in zip(self.policy.handles, shards)]
        hyps = [h for part in ray.get(refs) for h in part]
        return error_rates_by_language(hyps, [it["text"] for it in items], [it["language"] for it in items])

    # ---- checkpoints ----------------------------------------------------------------------
    def save(self, step: int, run_id: str) -> Path:
        out = self.cfg.trainer.output_dir
        staging = ckpt.staging_dir(out, step)
        state = {"step": step, "sampler": self.sampler.state_dict(), "mlflow_run_id": run_id,
                 "scheduler": self.scheduler.state_dict()}
        refs = self.policy.call("save", str(staging / "policy_ds"), "state", {"step": step}, str(staging / "hf"))
        if self.critic is not None:
            refs += self.critic.call("save", str(staging / "critic_ds"), "state")
        ray.get(refs)
        return ckpt.commit(out, staging, step, state)

    def resume(self) -> dict | None:
        path = ckpt.latest_checkpoint(self.cfg.trainer.output_dir)
        if path is None:
            log.warning("trainer.resume=true but no checkpoint in %s: starting fresh", self.cfg.trainer.output_dir)
            return None
        state = ckpt.read_driver_state(path)
        refs = self.policy.call("load", str(path / "policy_ds"), "state")
        if self.critic is not None:
            refs += self.critic.call("load", str(path / "critic_ds"), "state")
        ray.get(refs)
        self.sync_weights(state["step"])
        self.sampler.load_state_dict(state["sampler"])
        self.scheduler.load_state_dict(state["scheduler"],
                                       lambda e: self._group(e["item_index"], e["entered_step"]))
        log.info("resumed from %s (step %d)", path, state["step"])
        return state

    # ---- the loop -----------------------------------------------------------------------
    def train(self) -> dict:
        cfg = self.cfg
        resumed = self.resume() if cfg.trainer.resume else None
        start = resumed["step"] if resumed else 0
        run_id = resumed["mlflow_run_id"] if resumed else None
        summary: dict = {}
        with MlflowRun(cfg.logger, self.run_name, config=cfg, resume_run_id=run_id,
                       tags={"stage": "rl", "overlap": cfg.overlap.mode, "placement": cfg.placement.name,
                             "algorithm": cfg.algorithm.name}) as tracker:
            if not resumed:
                tracker.log_summary(self.placement, "placement.json")
                tracker.log_params(placement_params(self.placement))
                first = self.evaluate()
                tracker.log_metrics({f"eval/{k}": v for k, v in first.items()}, step=0)
                summary["eval_before"] = first
            t_start = time.monotonic()
            bar = tqdm(range(start, cfg.trainer.steps), desc="rl", dynamic_ncols=True,
                       initial=start, total=cfg.trainer.steps)
            last_eval: dict[str, float] = {}
            for step in bar:
                metrics = self.train_step(step)
                done = step + 1
                if cfg.trainer.eval_every and (done % cfg.trainer.eval_every == 0 or done == cfg.trainer.steps):
                    last_eval = self.evaluate()
                    metrics.update({f"eval/{k}": v for k, v in last_eval.items()})
                metrics["perf/wall_clock"] = time.monotonic() - t_start
                tracker.log_metrics(metrics, step=done)
                if cfg.trainer.save_every and (done % cfg.trainer.save_every == 0 or done == cfg.trainer.steps):
                    self.save(done, tracker.run_id)
                bar.set_postfix(reward=f"{metrics.get('reward/total', float('nan')):.3f}",
                                cer=f"{last_eval.get('cer', float('nan')):.3f}",
                                step_s=f"{metrics['perf/time/step']:.1f}")
                self.step = done
            summary.update({"steps": self.step, "train_seconds": time.monotonic() - t_start,
                            "eval_after": last_eval, "mlflow_run_id": tracker.run_id})
            tracker.log_summary(summary)
        return summary

    def cleanup(self) -> None:
        for g in getattr(self, "groups", []):
            g.kill()
        shutdown_ray()


def mean_over_ranks(outs: list[dict[str, float]]) -> dict[str, float]:
    keys = {k for o in outs for k in o}
    return {k: float(np.mean([o[k] for o in outs if k in o])) for k in keys}


def placement_params(report: dict) -> dict[str, str]:
    """Where each role rank landed (read back from Ray), as MLflow params."""
    out = {}
    for role, ranks in report.items():
        for r in ranks:
            node = str(r.get("node_id", ""))[:8]
            out[f"placement.{role}.{r.get('rank', 0)}"] = f"bundle={r.get('bundle_index')} node={node}"
    return out


def run_rl(cfg: RunConfig | DictConfig, run_name: str = "rl") -> dict:
    recipe = RLRecipe(cfg, run_name)
    try:
        recipe.setup()
        return recipe.train()
    finally:
        recipe.cleanup()
