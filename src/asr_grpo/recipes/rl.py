"""The RL recipe (GRPO / PPO): setup -> train -> save -> cleanup.

One step: rollout (scheduler) -> scoring (old/ref log-probs, values, rewards, run
concurrently in their roles) -> advantages -> policy and critic updates (DeepSpeed) ->
weight sync to separate rollout workers -> metrics to MLflow.
"""
from __future__ import annotations

import contextlib
import logging
import math
import shutil
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import ray
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from asr_grpo.config.errors import DiskFull, first_line
from asr_grpo.config.schema import RunConfig
from asr_grpo.config.validate import validate_config
from asr_grpo.data import AsrDataset, resolve_manifests, skipped_lines
from asr_grpo.data.augment import perturb, used_conditions
from asr_grpo.data.conditions import train_conditions
from asr_grpo.data.dataset import load_first
from asr_grpo.distributed.faults import TrainerDied, is_actor_death, restart_options, trainer_died_message
from asr_grpo.distributed.net import free_port
from asr_grpo.distributed.placement import create_placement_group, plan_placement, role_counts
from asr_grpo.distributed.ray_cluster import shutdown_ray, start_ray
from asr_grpo.distributed.reward_feed import RewardFeed
from asr_grpo.distributed.role_group import RoleGroup
from asr_grpo.evaluation import evaluation_sets, metrics_of_sets
from asr_grpo.experience.maker import ExperienceMaker, samples_trained_per_prompt, split_even
from asr_grpo.experience.prompts import PromptSampler, build_group
from asr_grpo.experience.sync_check import check_sequences, check_weight_sync
from asr_grpo.models import load_processor
from asr_grpo.models import step_checkpoints as ckpt
from asr_grpo.models.lora import reference_in_policy, reference_role_needed
from asr_grpo.overlap.dynamic_sampling import DynamicSampling
from asr_grpo.overlap.planners import MODES, plan_record
from asr_grpo.overlap.scheduler import RolloutScheduler, StepRollout
from asr_grpo.overlap.step_times import StepTimes
from asr_grpo.recipes.protocol import run_recipe
from asr_grpo.recipes.start_checkpoint import check_start_checkpoint, prepare_start_checkpoint
from asr_grpo.recipes.stop import stop_signals
from asr_grpo.recipes.text_lm_cache import ensure_text_lm
from asr_grpo.rewards.text import error_rates_by_language
from asr_grpo.rollout.feed import FeedSink
from asr_grpo.tracking import MlflowRun
from asr_grpo.tracking.plans import log_plans, read_plans
from asr_grpo.tracking.runs import GROUP_LENGTHS
from asr_grpo.workers.critic import CriticRole
from asr_grpo.workers.policy import PolicyRole
from asr_grpo.workers.reference import ReferenceRole
from asr_grpo.workers.remote_reward import RemoteRewardWorker
from asr_grpo.workers.reward import RewardWorker
from asr_grpo.workers.reward_model import RewardModelRole
from asr_grpo.workers.rollout import rollout_ranks, rollout_role_spec, sync_backend

log = logging.getLogger(__name__)


def optimizer_steps_per_rl_step(cfg) -> int:
    per_rank = cfg.trainer.prompts_per_step * samples_trained_per_prompt(cfg.algorithm) // cfg.placement.actor_num_ranks
    micro = math.ceil(per_rank / cfg.trainer.micro_batch_size)
    return max(1, cfg.trainer.train_epochs * micro // cfg.trainer.grad_accum_steps)


@dataclass
class TrainedStep:
    """One finished RL step, as the recipe's step callbacks see it."""
    step: int
    rollout: StepRollout            # the groups trained on (B; fewer where dynamic sampling hit its bound)
    items: list                     # the ExperienceItems the update used (dropped groups left out)
    metrics: dict[str, float]       # what the step logs


class RLRecipe:
    def __init__(self, cfg: RunConfig | DictConfig, run_name: str = "rl", tags: dict | None = None,
                 step_callbacks: list[Callable[[TrainedStep], None]] | None = None, overrides: str = ""):
        self.cfg, self.run_name = cfg, run_name
        self.overrides = overrides   # the command line's, logged as a param (the run name is short)
        self.tags = dict(tags or {})   # extra MLflow tags (a sweep job's sweep and parent run)
        # Called after every step with what it trained on (inspection, custom logging).
        self.step_callbacks = list(step_callbacks or [])
        self.step = 0
        self.weights_version = 0   # the policy version the rollout engines hold
        self.group_lengths: dict[int, list[list[int]]] = {}   # step -> trained groups' response lengths
        self.plans: dict[int, dict] = {}   # step (0-based, the scheduler's) -> its `plan_record`
        # RL on degraded audio (trainer.wave_augment.conditions): their rooms, drawn once
        self.conditions = train_conditions(cfg.data, used_conditions(cfg.trainer.wave_augment))

    # ---- setup ---------------------------------------------------------------------------
    def setup(self) -> None:
        cfg = self.cfg
        validate_config(cfg)
        # overlap.replay_plan: that run's plans, read now so a bad run id fails before Ray starts.
        recorded_plans = read_plans(cfg.logger, cfg.overlap.replay_plan) if cfg.overlap.replay_plan else None
        use_lm = cfg.reward.smoothness_scorer == "lm"
        counts = role_counts(cfg.placement, use_critic=cfg.algorithm.use_critic,
                             use_ref=reference_role_needed(cfg), use_reward_model=use_lm)
        # Colocated HF: the policy ranks roll out with their own weights (no rollout role).
        counts["rollout"] = rollout_ranks(cfg)
        self.separate_rollout = counts["rollout"] > 0
        self.plan = plan_placement(cfg.placement, counts)   # fails here, before Ray starts
        # The user's inputs before anything is built from them (SFT, the text LM, Ray):
        # a bad model.path or manifest fails in seconds and opens no MLflow run.
        check_start_checkpoint(cfg)
        manifests = resolve_manifests(cfg.data, cfg.paths.output_root)
        self.train_set = AsrDataset(manifests.rl_prompts, cfg.data,   # the prompts RL trains on
                                    split="rl" if manifests.rl is not None else "train")
        # dev (+ held-out voices, + each held-out condition)
        self.eval_sets = evaluation_sets(manifests, cfg.data, cfg.paths.output_root)
        self.dev_set = self.eval_sets["dev"]
        cfg.model.path = prepare_start_checkpoint(cfg)   # what every role loads
        if use_lm:
            ensure_text_lm(cfg)   # trained on the corpus text once, then cached
        self.processor = load_processor(cfg.model.path)
        self.sampler = PromptSampler(len(self.train_set), cfg.seed)

        start_ray(cfg.placement)
        self.pg = create_placement_group(self.plan) if self.plan.bundles else None
        cfg_dict = OmegaConf.to_container(cfg, resolve=True)
        opt_steps = cfg.trainer.steps * optimizer_steps_per_rl_step(cfg)
        mk = lambda role, cls, **kw: RoleGroup(role, cls, self.plan, self.pg, init_kwargs=kw,  # noqa: E731
                                               **restart_options(role))
        self.remote_reward = bool(cfg.reward.remote.urls)
        # With `reward.remote.feed` a reward service is asked as sequences finish (under
        # intra/oppo): its wait is on another machine, so it hides under the decode. The
        # rollout hosts then send what finished straight to the reward workers while a
        # decode runs (rollout/feed.py). Otherwise the service is asked after the rollout, as is a
        # local reward file (its work would share the decode's cores) and a reward that
        # takes the LM reward model's scores (they come after the rollout).
        feeds = self.remote_reward and cfg.reward.remote.feed and not use_lm and MODES[cfg.overlap.mode][0]
        self.policy = mk("actor", PolicyRole, cfg=cfg_dict, optimizer_steps=opt_steps)
        self.ref = mk("ref", ReferenceRole, cfg=cfg_dict) if counts["ref"] else None
        self.critic = mk("critic", CriticRole, cfg=cfg_dict, optimizer_steps=opt_steps) if counts["critic"] else None
        if self.remote_reward:
            self.reward = mk("reward", RemoteRewardWorker, remote=cfg_dict["reward"]["remote"],
                             weights=dict(cfg.reward.weights), on_bad_reward=cfg.reward.on_bad_reward, seed=cfg.seed,
                             tokenizer_path=cfg.model.path if feeds else None)
        else:
            self.reward = mk("reward", RewardWorker, reward_file=cfg.reward.reward_file,
                             weights=dict(cfg.reward.weights), timeout_s=cfg.reward.timeout_s,
                             on_bad_reward=cfg.reward.on_bad_reward, hang_retries=cfg.reward.hang_retries)
        self.reward_model = mk("reward_model", RewardModelRole, cfg=cfg_dict) if use_lm else None
        self.rollout_group = None
        if self.separate_rollout:
            rollout_cls, rollout_plan, rollout_kw = rollout_role_spec(cfg, self.plan)
            self.rollout_group = RoleGroup("rollout", rollout_cls, rollout_plan, self.pg,
                                           init_kwargs={"cfg": cfg_dict, **rollout_kw}, **restart_options("rollout"))
        self.groups = [g for g in (self.policy, self.ref, self.critic, self.reward_model, self.reward,
                                   self.rollout_group)
                       if g is not None]
        for g in self.groups:
            g.wait_ready()
        self.push_restores = 0   # weight pushes made again after a rollout worker was lost in one
        if self.rollout_group is not None:
            self._join_weight_sync()
        hosts = self.policy if self.rollout_group is None else self.rollout_group
        scorers = {name: g for name, g in (("ref", self.ref), ("values", self.critic), ("lm", self.reward_model))
                   if g is not None}
        restore = self._restore_rollout_worker if self.rollout_group is not None else None
        # LoRA on colocated ranks: the policy's own weights, adapters off, are the reference
        # (no streaming: they score after the rollout, which they decode).
        ref, ref_method = ((self.policy, "compute_ref_logprobs") if reference_in_policy(cfg)
                           else (self.ref, "compute_logprobs"))
        self.maker = ExperienceMaker(cfg, self.processor.tokenizer, self.policy, ref, self.critic, self.reward,
                                     self.reward_model, ref_method=ref_method)
        self.scheduler = RolloutScheduler(cfg.overlap, cfg.trainer.prompts_per_step, hosts, scorers,
                                          resolve=ray.get, is_death=is_actor_death, restore_host=restore,
                                          frozen_scorers=("ref", "lm"), stream_hidden_prior=stream_hidden_prior(cfg),
                                          on_finished=self.maker.submit_finished if feeds else None,
                                          recorded_plans=recorded_plans,
                                          feed=FeedSink(RewardFeed(self.reward.handles),
                                                        cfg.reward.remote.feed_every_s) if feeds else None,
                                          on_fed=self.maker.adopt_fed if feeds else None, dynamic_sampling=self._dynamic_sampling())
        self.placement = {g.role: g.placement_report() for g in self.groups}
        self._pids = {g.role: g.pids() for g in self.groups if g.restartable}
        self.restarts = {role: 0 for role in self._pids}

    def _dynamic_sampling(self) -> DynamicSampling | None:
        """algorithm.dynamic_sampling: the scheduler asks the experience maker which finished
        groups have equal rewards and draws their replacements from the prompt sampler."""
        ds = self.cfg.algorithm.dynamic_sampling
        if not ds.enabled:
            return None
        return DynamicSampling(self.maker.judge_groups, self._new_groups, ds.max_extra_groups,
                               group_multiple=self.cfg.placement.actor_num_ranks)

    # ---- weight sync (separate HF rollout workers, vLLM engines) ----------------------------
    def _join_weight_sync(self) -> None:
        sizes = ray.get(self.rollout_group.call("weight_sync_ranks"))   # a vLLM engine: one per TP worker
        world = 1 + sum(sizes)
        addr, port = self.policy.master_addr, free_port()
        backend = sync_backend(self.cfg)
        # The remote members first: creating the group blocks until all have joined.
        refs = [h.join_weight_sync.remote(addr, port, 1 + sum(sizes[:i]), world, backend)
                for i, h in enumerate(self.rollout_group.handles)]
        ray.get(refs + self.policy.call("join_weight_sync", addr, port, world, backend))

    def sync_weights(self, version: int) -> float:
        """Push the policy's weights to the rollout workers; returns seconds spent."""
        t0 = time.monotonic()
        self.weights_version = version
        if self.rollout_group is not None:
            self._push_weights(version)
        ray.get(self.policy.call("set_policy_version", version))
        return time.monotonic() - t0

    def _push_weights(self, version: int, tries: int = 2) -> None:
        """One broadcast from trainer rank 0 to every rollout worker. A worker lost during
        it (Ray restarts it): the trainer's send and the other workers' receives end, on
        the closed connection or at `rollout.weight_sync_timeout_s`; then a fresh sync
        group and the push again, `tries` more times at most."""
        receivers = self.rollout_group.call("receive_weights", version)
        sender = self.policy.call("broadcast_weights")
        try:
            ray.get(receivers)
        except Exception as exc:   # noqa: BLE001 - only a worker's death is recovered here
            if not is_actor_death(exc) or tries == 0:
                raise
            log.warning("a rollout worker was lost during the weight push (%s): pushing again", first_line(exc))
            # The rest of the broken push ends (bounded by the timeout); a trainer's death is not
            # recovered here: it raises, and the step's trainer-death handler ends the run.
            for ref in receivers:
                with contextlib.suppress(ray.exceptions.RayTaskError, ray.exceptions.RayActorError):
                    ray.get(ref)
            with contextlib.suppress(ray.exceptions.RayTaskError):
                ray.get(sender)
            self.push_restores += 1
            self.rollout_group.wait_ready()
            self._join_weight_sync()
            return self._push_weights(version, tries - 1)
        ray.get(sender)

    def check_sync(self, version: int, items: list) -> dict[str, float]:
        """`rollout.sync_check_every`: after this sync, every engine's log-probs of a few
        just-trained samples against the trainer's (temperature 1); `WeightSyncMismatch`
        above `rollout.sync_check_tol`. Engines in workers of their own only: colocated
        HF rollout decodes with the trainer's own weights."""
        ro = self.cfg.rollout
        if self.rollout_group is None or not ro.sync_check_every or version % ro.sync_check_every:
            return {}
        refs = check_sequences(items, ro.sync_check_sequences)
        if not refs:
            return {}
        t0 = time.monotonic()
        trainer = ray.get(self.policy.call_rank(0, "compute_logprobs", refs, 1.0))
        engines = ray.get(self.rollout_group.call("compute_logprobs", refs, 1.0))
        result = check_weight_sync(trainer, engines, ro.sync_check_tol, version)
        return {**result.metrics(), "perf/time/sync_check": time.monotonic() - t0}

    # ---- faults ------------------------------------------------------------------------
    def _restore_rollout_worker(self, rank: int) -> None:
        """A rollout worker restarted by Ray has the SFT weights and no sync group: wait
        for it, build a fresh sync group (the old one lost a member) and push the weights
        it decoded with; the scheduler then gives it its sequences back."""
        self.rollout_group.wait_ready()
        self._join_weight_sync()
        self.sync_weights(self.weights_version)

    def fault_metrics(self) -> dict[str, float]:
        """faults/*: restarts seen per restartable role (its process changed), rollout
        workers restored mid-step, and bad-data lines skipped so far (data/skipped)."""
        for g in self.groups:
            if g.role in self._pids:
                pids = g.pids()
                self.restarts[g.role] += sum(a != b for a, b in zip(pids, self._pids[g.role]))
                self._pids[g.role] = pids
        return {**{f"faults/restarts/{role}": float(n) for role, n in self.restarts.items()},
                "faults/rollout_restores": float(self.scheduler.host_restarts),
                "faults/weight_push_restores": float(self.push_restores),
                "data/skipped": float(skipped_lines([self.train_set, *self.eval_sets.values()]))}

    @contextlib.contextmanager
    def _trainer_deaths_end_the_run(self, step: int):
        """An actor death that gets here (what Ray restarts is recovered below) is a
        trainer's: raise `TrainerDied` naming it and the checkpoint to resume from."""
        try:
            yield
        except Exception as exc:
            if not is_actor_death(exc):
                raise
            role, rank = "?", -1
            for g in self.groups:
                found = g.rank_of(getattr(exc, "actor_id", None) or "")
                if found is not None:
                    role, rank = g.role, found
            latest = ckpt.latest_checkpoint(self.cfg.trainer.output_dir)
            raise TrainerDied(trainer_died_message(role, rank, step, exc, str(latest) if latest else None,
                                                   ckpt.read_driver_state(latest)["step"] if latest else None)) from exc

    # ---- one step ---------------------------------------------------------------------
    def _group(self, index: int, step: int, item: dict | None = None, uid: str | None = None):
        uid = uid or f"s{step}:{self.train_set.utterances[index].id}"
        item = self._perturbed(index, self.train_set[index] if item is None else item, uid)
        return build_group(self.processor, item, self.cfg.algorithm.n_samples_per_prompt, uid, step, index)

    def _perturbed(self, index: int, item: dict, uid: str) -> dict:
        """The prompt with its audio perturbed (trainer.wave_augment), once for the whole
        group. Seeded by the group's uid, babble drawn from the RL prompts: a group rebuilt
        on resume hears what it heard in the uninterrupted run."""
        wave = self.cfg.trainer.wave_augment
        if wave.speed_prob == 0 and wave.babble_prob == 0 and not self.conditions:
            return item
        rng = np.random.default_rng([self.cfg.seed, zlib.crc32(uid.encode())])
        others = []
        if wave.babble_prob > 0 and len(self.train_set) > 1:
            picks = rng.choice(len(self.train_set) - 1, size=min(wave.babble_talkers, len(self.train_set) - 1),
                               replace=False)
            loaded = (self.train_set.load(int(j + (j >= index))) for j in picks)   # any prompt but this one
            others = [o["audio"] for o in loaded if o is not None]
        return {**item, "audio": perturb(item["audio"], others, wave, rng, self.conditions, self.cfg.data.sample_rate)}

    def _new_groups(self, k: int, step: int) -> list:
        """k prompt groups; with data.on_bad_audio=skip an utterance whose audio fails to
        load is skipped (and counted) and the next one drawn."""
        groups = []
        while len(groups) < k:
            for epoch, i in self.sampler.draw(k - len(groups)):
                item = self.train_set.load(i)
                if item is not None:
                    # The sampler epoch keeps uids unique when a prompt set smaller than
                    # the buffer wraps inside one step (or a step is run again).
                    uid = f"s{step}:e{epoch}:{self.train_set.utterances[i].id}"
                    groups.append(self._group(i, step, item, uid))
        return groups

    def train_step(self, step: int) -> dict[str, float]:
        t0 = time.monotonic()
        rollout = self.scheduler.rollout(step, self._new_groups(self.scheduler.groups_wanted(step), step))
        self.group_lengths[step + 1] = rollout.lengths
        self.plans[step] = plan_record(step, rollout.plan, rollout.admitted)
        if self.rollout_group is not None and self.cfg.rollout.sleep_level:
            ray.get(self.rollout_group.call("sleep"))   # colocated vLLM frees the GPU for training
        t_score = time.monotonic()
        items, metrics = self.maker.make(rollout.groups, rollout.results, rollout.streamed,
                                         version=self.weights_version)
        metrics.update(rollout.metrics)
        t_train = time.monotonic()
        trainers = [g for g in (self.policy, self.critic) if g is not None]
        pending = [g.call_split("train", split_even(items, g.world_size)) for g in trainers]
        for refs in pending:
            metrics.update(mean_over_ranks(ray.get(refs)))
        t_sync = time.monotonic()
        sync_s = self.sync_weights(step + 1)
        t_end = time.monotonic()
        times = StepTimes(step_s=t_end - t0, rollout_s=t_score - t0, scoring_s=t_train - t_score,
                          training_s=t_sync - t_train, sync_s=sync_s, reward_wait_s=self.maker.reward_wait_s,
                          mean_reward=metrics["reward/total"])
        metrics.update(self.check_sync(step + 1, items))   # not in the step's time: a check, not work
        metrics.update({**times.metrics(), "charts/num_sequences": float(len(items)),
                        **self.utilization(times.step_s), **self.fault_metrics()})
        metrics.update(self.scheduler.end_step(step, times))
        for callback in self.step_callbacks:
            callback(TrainedStep(step, rollout, items, metrics))
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
        """Greedy CER/WER on the first `trainer.eval_max_utterances` utterances of dev
        and, under `heldout_voices/`, of the held-out-voice split when there is one; with
        `trainer.ema_decay` the policy's weight average again, under `ema/`."""
        out = metrics_of_sets(lambda _, dataset: self._error_rates(dataset), self.eval_sets)
        if self.cfg.trainer.ema_decay > 0:
            ema = metrics_of_sets(lambda _, dataset: self._error_rates(dataset, ema=True), self.eval_sets)
            out.update({f"ema/{k}": v for k, v in ema.items()})
        return out

    def _error_rates(self, dataset: AsrDataset, ema: bool = False) -> dict[str, float]:
        """One set's CER/WER, overall and per language, sharded over the policy ranks."""
        items = load_first(dataset, self.cfg.trainer.eval_max_utterances)
        shards = split_even(items, self.policy.world_size)
        refs = [h.transcribe.remote([it["audio"] for it in s], [it["language"] for it in s], ema)
                for h, s in zip(self.policy.handles, shards)]
        hyps = [h for part in ray.get(refs) for h in part]
        return error_rates_by_language(hyps, [it["text"] for it in items], [it["language"] for it in items])

    # ---- checkpoints ----------------------------------------------------------------------
    def save(self, step: int, run_id: str) -> Path:
        out = self.cfg.trainer.output_dir
        state = {"step": step, "sampler": self.sampler.state_dict(), "mlflow_run_id": run_id,
                 "scheduler": self.scheduler.state_dict(), "group_lengths": self.group_lengths,
                 "plans": self.plans}
        staging = None
        try:
            staging = ckpt.staging_dir(out, step)
            refs = self.policy.call("save", str(staging / "policy_ds"), "state", {"step": step}, str(staging / "hf"))
            if self.critic is not None:
                refs += self.critic.call("save", str(staging / "critic_ds"), "state")
            ray.get(refs)
            return ckpt.commit(out, staging, step, state, keep_last=self.cfg.trainer.keep_last)
        except Exception as exc:
            full = ckpt.disk_full_reason(exc, out)
            if staging is not None:   # the partial copy goes: its space may be what the next write needs
                shutil.rmtree(staging, ignore_errors=True)
            if full is None:
                raise
            latest = ckpt.latest_checkpoint(out)
            kept = (f"{latest} (step {ckpt.read_driver_state(latest)['step']}) is intact: make room, then resume "
                    f"with trainer.resume=true trainer.output_dir={out}" if latest else "no earlier checkpoint")
            raise DiskFull(f"the checkpoint of step {step} could not be written to {out} ({full}); {kept}") from exc

    def resume(self) -> dict | None:
        if Path(self.cfg.trainer.output_dir).is_dir():
            for name in ckpt.discard_partials(self.cfg.trainer.output_dir):
                log.warning("removed %s: a checkpoint whose writing was interrupted", name)
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
        self.group_lengths = {int(k): v for k, v in state.get("group_lengths", {}).items()}
        # The resumed run's plans.jsonl is rewritten from these: steps the stopped process
        # ran past its checkpoint are replaced by the ones run again.
        self.plans = {int(k): v for k, v in state.get("plans", {}).items()}
        self.scheduler.load_state_dict(state["scheduler"],
                                       lambda e: self._group(e["item_index"], e["entered_step"], uid=e["uid"]))
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
                             "algorithm": cfg.algorithm.name, **self.tags}) as tracker:
            if not resumed:
                tracker.log_summary(self.placement, "placement.json")
                tracker.log_params({**placement_params(self.placement), "overrides": self.overrides})
                first = self.evaluate()
                tracker.log_metrics({f"eval/{k}": v for k, v in first.items()}, step=0)
                summary["eval_before"] = first
            t_start = time.monotonic()
            bar = tqdm(range(start, cfg.trainer.steps), desc="rl", dynamic_ncols=True,
                       initial=start, total=cfg.trainer.steps)
            last_eval: dict[str, float] = {}
            shown = summary.get("eval_before", {})   # the bar's CER: the last evaluated, or none yet
            stop = stop_signals()
            # SIGTERM / SIGINT (recipes/stop.py): between steps a signal is noted, and the loop
            # ends at the next step boundary; the step in flight gets the grace period.
            with stop.deferred():
                for step in bar:
                    with self._trainer_deaths_end_the_run(step):
                        with stop.grace(cfg.trainer.stop_grace_s):   # the step in flight: finished or abandoned
                            metrics = self.train_step(step)
                            done = step + 1
                            last = done == cfg.trainer.steps or out_of_time(cfg.trainer.max_minutes, t_start)
                            if cfg.trainer.eval_every and (done % cfg.trainer.eval_every == 0 or last):
                                last_eval = shown = self.evaluate()
                                metrics.update({f"eval/{k}": v for k, v in last_eval.items()})
                                # An evaluation that used up the budget is the run's last: another step
                                # would end in a second evaluation of nearly the same weights.
                                last = last or out_of_time(cfg.trainer.max_minutes, t_start)
                            metrics["perf/wall_clock"] = time.monotonic() - t_start
                            tracker.log_metrics(metrics, step=done)
                            # An artifact is sent synchronously: to a tracking server, which may be away
                            # for a while, the plans go only with the checkpoints and at the end.
                            if tracker.synchronous:
                                log_plans(self.plans)
                        # Read once: a signal after this is seen at the next step's end.
                        stopping = stop.requested and not last
                        # A stop checkpoints the step it let finish, save_every or not: resuming needs it.
                        if stopping or cfg.trainer.save_every and (done % cfg.trainer.save_every == 0 or last):
                            path = self.save(done, tracker.run_id)
                            tracker.log_summary({"steps": self.group_lengths}, GROUP_LENGTHS)
                            log_plans(self.plans)
                    bar.set_postfix(reward=f"{metrics.get('reward/total', float('nan')):.3f}",
                                    **({"cer": f"{shown['cer']:.3f}"} if "cer" in shown else {}),
                                    step_s=f"{metrics['perf/time/step']:.1f}")
                    self.step = done
                    if stopping:
                        raise stop.stopped(f"after step {done} (checkpoint {path.name})")
                    if last:
                        break
                summary.update({"steps": self.step, "train_seconds": time.monotonic() - t_start,
                                "eval_after": last_eval, "mlflow_run_id": tracker.run_id})
                tracker.log_summary({"steps": self.group_lengths}, GROUP_LENGTHS)
                log_plans(self.plans)
                tracker.log_summary(summary)
        return summary

    def cleanup(self) -> None:
        with stop_signals().deferred():   # a signal now must not leave actors or a local Ray behind
            for g in getattr(self, "groups", []):
                g.kill()
            if getattr(self, "pg", None) is not None:   # a shared cluster outlives the run: free its bundles
                from ray.util.placement_group import remove_placement_group

                remove_placement_group(self.pg)
            shutdown_ray()


def out_of_time(max_minutes: float | None, t_start: float) -> bool:
    """Whether the loop has used its wall-clock budget (none: never)."""
    return max_minutes is not None and time.monotonic() - t_start >= 60 * max_minutes


def stream_hidden_prior(cfg) -> float:
    """The cost model's first guess at how much streamed scoring the decode hides: none
    where the scorers share the actor's CPU cores, half on a shared GPU, all where the
    scorers have GPUs of their own. The run's own streaming steps refine it."""
    import torch

    if not torch.cuda.is_available():
        return 0.0
    return 0.5 if cfg.placement.colocate else 1.0


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


def run_rl(cfg: RunConfig | DictConfig, run_name: str = "rl", tags: dict | None = None,
           step_callbacks: list[Callable[[TrainedStep], None]] | None = None, overrides: str = "") -> dict:
    return run_recipe(RLRecipe(cfg, run_name, tags, step_callbacks, overrides))
