"""Turn finished prompt groups into experience: score every sequence (old and reference
log-probs, critic values, rewards: the scorers run concurrently), then advantages.

Faults met here: a reward file's error reaches the caller as `RewardFunctionError`
(file, cause, samples) before any update; a reward worker left with a hung
`reward_func` is restarted; sequences a restarted streaming scorer lost are scored
again in one shot; and no non-finite number leaves as experience (`check_finite`).
"""
from __future__ import annotations

import itertools
import logging
import time
from typing import Sequence

import ray
import torch

from asr_grpo.algorithms import downsample_groups
from asr_grpo.algorithms.group_spread import flat_groups, group_members, is_flat
from asr_grpo.config.errors import ConfigError
from asr_grpo.config.schema import RunConfig, trained_per_group
from asr_grpo.experience.advantages import estimate_advantages
from asr_grpo.experience.types import ExperienceItem, PromptGroup, SequenceRef, check_finite
from asr_grpo.rewards.combine import RewardResult
from asr_grpo.rewards.loader import RewardFunctionError
from asr_grpo.rewards.request import reward_request
from asr_grpo.rollout.types import SequenceResult

log = logging.getLogger(__name__)


def split_even(items: Sequence, parts: int) -> list[list]:
    """Contiguous, near-equal shards (order preserved when concatenated back)."""
    size, extra = divmod(len(items), parts)
    out, start = [], 0
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        out.append(list(items[start:end]))
        start = end
    return out


def samples_trained_per_prompt(algo) -> int:
    """How many samples of each prompt group an update trains on."""
    return trained_per_group(algo.n_samples_per_prompt, algo.train_samples_per_prompt)


def training_scores(reward: RewardResult, component: str | None) -> torch.Tensor:
    """What the advantages and the down-sampling read: the reward's total, or the component
    `algorithm.score_component` names (MWER's `cer`: one minus the sample's error)."""
    if component is None:
        return reward.total
    if component not in reward.components:
        raise ConfigError(f"algorithm.score_component={component}: the reward reported no such component "
                          f"(it reported: {', '.join(reward.components) or 'none'})")
    return reward.components[component]


def experience_items(algo, seqs: list[SequenceResult], refs: list[SequenceRef], old, ref, values,
                     rewards: torch.Tensor, group_size: int) -> tuple[list[ExperienceItem], object]:
    """Scored sequences (`group_size` consecutive ones per prompt) -> advantages and the
    experience items an update takes (checked finite); returns (items, the advantage
    estimate with its metrics)."""
    adv = estimate_advantages(algo, rewards, [len(s.tokens) for s in seqs], old, ref, values, group_size)
    items = [ExperienceItem(uid=s.uid, group=s.group, prompt_ids=r.prompt_ids, response_ids=s.tokens,
                            features=r.features, advantages=adv.advantages[i], old_logprobs=old[i],
                            behaviour_logprobs=torch.tensor(s.logprobs), versions=list(s.versions),
                            ref_logprobs=None if ref is None else ref[i],
                            returns=None if adv.returns is None else adv.returns[i],
                            old_values=None if values is None else values[i])
             for i, (s, r) in enumerate(zip(seqs, refs))]
    check_finite(items, "experience")
    return items, adv


def flat_group_shares(rewards: torch.Tensor, groups: Sequence[str], labels: Sequence[str],
                      prefix: str = "reward/flat_groups") -> dict[str, float]:
    """The share of groups (samples listed group by group) whose rewards are all equal,
    overall and per label (a group's label: its first sample's). Under a group baseline
    such a group gives every sample a zero advantage: it teaches nothing."""
    flat: dict[str, list[bool]] = {}
    for _, idx in group_members(groups):
        flat.setdefault(labels[idx[0]], []).append(is_flat(rewards[idx]))
    every = [f for fs in flat.values() for f in fs]
    out = {prefix: sum(every) / len(every)} if every else {}
    out.update({f"{prefix}/{label}": sum(fs) / len(fs) for label, fs in flat.items()})
    return out


def sequence_refs(groups: list[PromptGroup], seqs: list[SequenceResult]) -> list[SequenceRef]:
    """What a scorer needs of each sequence: its group's prompt and audio, its tokens."""
    by_uid = {g.uid: g for g in groups}
    return [SequenceRef(s.uid, by_uid[s.group].prompt_ids, s.tokens, by_uid[s.group].features,
                        by_uid[s.group].utterance["language"]) for s in seqs]


class KnownScores:
    """Scores the driver already holds, shaped like the scheduler's `StreamedScores`
    (covered uids + `get()`), so `ExperienceMaker._launch` computes only the rest."""

    def __init__(self, scores: dict[str, torch.Tensor]):
        self.uids, self._scores = set(scores), scores

    def get(self) -> dict[str, torch.Tensor]:
        return self._scores


class ExperienceMaker:
    def __init__(self, cfg: RunConfig, tokenizer, policy, ref, critic, reward, reward_model=None,
                 ref_method: str = "compute_logprobs"):
        self.cfg, self.tokenizer = cfg, tokenizer
        self.policy, self.ref, self.critic, self.reward = policy, ref, critic, reward
        self.ref_method = ref_method   # the policy's "compute_ref_logprobs" where it is the reference (LoRA)
        self.reward_model = reward_model
        self.rescored = 0          # sequences scored again after a streaming scorer restarted
        self.reward_restarts = 0   # reward workers restarted to reclaim a hung reward_func
        self.reward_wait_s = 0.0   # this step's time blocked on reward results
        # Streamed rewards: uid -> its call; call -> (worker, pending result, uids); uid -> result.
        self._early: dict[str, int] = {}
        self._early_calls: dict[int, tuple] = {}
        self._resolved: dict[str, RewardResult] = {}
        self._call_ids = itertools.count()
        # Dynamic sampling (`judge_groups`): the rewards of the samples of groups that stay,
        # kept for `make`; and the groups dropped for equal rewards since the last `make`
        # (rewards, group and language per sample), logged with its step, never trained.
        self._judged: dict[str, RewardResult] = {}
        self._dropped_flat: list[tuple[RewardResult, list[str], list[str]]] = []

    def _launch(self, group, method: str, refs: list[SequenceRef], streamed=None):
        """Score the sequences `streamed` does not cover on the role's ranks; returns a
        waiter that gives the scores of all `refs` in order."""
        covered = streamed.uids if streamed is not None else set()
        missing = [r for r in refs if r.uid not in covered]
        waiting = group.call_split(method, split_even(missing, group.world_size)) if missing else []

        def scores(seqs: list[SequenceRef], pending: list) -> dict[str, torch.Tensor]:
            return dict(zip((r.uid for r in seqs), (x for part in ray.get(pending) for x in part)))

        def wait() -> list[torch.Tensor]:
            have = streamed.get() if streamed is not None else {}
            fresh = scores(missing, waiting)
            lost = [r for r in refs if r.uid in covered and r.uid not in have]
            if lost:   # the scorer restarted mid-stream: score what its caches held in one shot
                self.rescored += len(lost)
                fresh.update(scores(lost, group.call_split(method, split_even(lost, group.world_size))))
            return [have[r.uid] if r.uid in have else fresh[r.uid] for r in refs]
        return wait

    def _reusable_old_logprobs(self, seqs: list[SequenceResult], version: int | None) -> dict[str, torch.Tensor]:
        """The behaviour log-probs that can stand in for the old ones
        (`algorithm.recompute_old_logprobs=false`): sequences every token of which the
        current weights sampled. Unknown version: none."""
        if self.cfg.algorithm.recompute_old_logprobs or version is None:
            return {}
        return {s.uid: torch.tensor(s.logprobs, dtype=torch.float32) for s in seqs
                if s.versions and min(s.versions) == version}

    def _reward_calls(self, batch: dict, n: int) -> list[tuple]:
        """Send a batch to the reward workers, one shard each; returns (worker, call,
        the batch rows it scores) per shard, without waiting."""
        shards = split_even(list(range(n)), self.reward.world_size)
        return [(w, w.score.remote({k: [v[i] for i in idx] for k, v in batch.items()}),
                 idx) for w, idx in zip(self.reward.handles, shards) if idx]

    def _collect(self, calls: list[tuple]) -> RewardResult:
        """The reward workers' results, in shard order. A reward file's error is raised
        as itself (not wrapped in Ray's task error); a worker left with a hung call is
        restarted (Ray re-runs its constructor) so the stuck thread goes with it."""
        parts = []
        t0 = time.monotonic()
        for worker, ref, _ in calls:
            try:
                out = ray.get(ref)
            except RewardFunctionError as exc:
                raise type(exc.cause)(str(exc.cause)) from exc
            if out.get("hung_calls"):
                log.warning("reward worker has %d hung reward_func calls: restarting it", out["hung_calls"])
                ray.kill(worker, no_restart=False)
                self.reward_restarts += 1
            parts.append(RewardResult.from_dict(out))
        self.reward_wait_s += time.monotonic() - t0
        return RewardResult.cat(parts)

    def _rewards(self, batch: dict, n: int) -> RewardResult:
        return self._collect(self._reward_calls(batch, n))

    def submit_finished(self, groups: list[PromptGroup], seqs: list[SequenceResult]) -> None:
        """Streamed rewards: send sequences to the reward workers as soon as they finish
        (the scheduler calls this for what a decode call's end brought), so a reward
        service's wait runs under the decode; `make` then collects what is already there.
        The reward of a sequence depends only on its text, so it is the one the serial
        step gets."""
        batch = self.reward_batch(groups, seqs)
        for worker, ref, idx in self._reward_calls(batch, len(seqs)):
            self._adopt(worker, ref, [seqs[i].uid for i in idx])

    def adopt_fed(self, call: tuple, uids: list[str]) -> None:
        """A reward call a rollout host's feed made while it decoded (rollout/feed.py):
        `call` is (reward worker rank, its pending result) for `uids`; `make` collects
        it as one of its own."""
        rank, ref = call
        self._adopt(self.reward.handles[rank], ref, uids)

    def _adopt(self, worker, ref, uids: list[str]) -> None:
        key = next(self._call_ids)
        self._early_calls[key] = (worker, ref, uids)
        self._early.update({u: key for u in uids})

    def _take_early(self, seqs: list[SequenceResult]) -> dict[str, RewardResult]:
        """The streamed rewards of `seqs` (one row each); a call's other rows (groups
        still waiting in the overcommit buffer) are kept for the step that trains them.
        A fed call whose maker died with it (a restarted rollout worker) is lost: its
        sequences are scored again with the rest."""
        for key in sorted({self._early[s.uid] for s in seqs if s.uid in self._early}):
            worker, ref, uids = self._early_calls.pop(key)
            for uid in uids:
                self._early.pop(uid, None)
            try:
                result = self._collect([(worker, ref, uids)])
            except ray.exceptions.ObjectLostError as exc:
                log.warning("a fed reward call was lost with the host that made it (%s): scoring its %d "
                            "sequences again", type(exc).__name__, len(uids))
                continue
            for pos, uid in enumerate(uids):
                self._resolved[uid] = result.select([pos])
        return {s.uid: self._resolved.pop(s.uid) for s in seqs if s.uid in self._resolved}

    def _request_stats(self) -> dict[str, float]:
        """reward/remote/*: what a reward service's client saw this step (requests,
        retries, failures, round trips); nothing for a local reward file."""
        if not self.cfg.reward.remote.urls:
            return {}
        merged: dict[str, float] = {}
        for worker in ray.get(self.reward.call("take_request_stats")):
            for k, v in worker.items():   # counts add up over workers; round trips: the slowest
                merged[k] = max(merged.get(k, v), v) if k.endswith(("_p50", "_max")) else merged.get(k, 0.0) + v
        return merged

    def reward_batch(self, groups: list[PromptGroup], seqs: list[SequenceResult]) -> dict:
        by_uid = {g.uid: g for g in groups}
        responses = self.tokenizer.batch_decode([s.tokens for s in seqs], skip_special_tokens=True)
        return reward_request(responses, [by_uid[s.group].utterance for s in seqs], seqs)

    def judge_groups(self, groups: list[PromptGroup], results: dict[str, list[SequenceResult]]) -> set[str]:
        """Dynamic sampling, asked by the scheduler as groups finish: the rewards of these
        finished groups, now; returns the uids of those whose rewards do not spread. The
        others' rewards are kept for `make`. A group with a sample that
        `reward.on_bad_reward=drop` removed is left to that drop."""
        seqs = [s for g in groups for s in results[g.uid]]
        reward = self._score_rewards(groups, seqs, sequence_refs(groups, seqs), {})
        bad = {s.group for s, k in zip(seqs, reward.keep.tolist()) if not k}
        # Judged on what the advantages read: MWER's error, not the whole reward.
        score = training_scores(reward, self.cfg.algorithm.score_component)
        flat = flat_groups(score, [s.group for s in seqs]) - bad
        dropped = [i for i, s in enumerate(seqs) if s.group in flat]
        if dropped:
            language = {g.uid: g.utterance["language"] or "unknown" for g in groups}
            self._dropped_flat.append((reward.select(dropped), [seqs[i].group for i in dropped],
                                       [language[seqs[i].group] for i in dropped]))
        self._judged.update({s.uid: reward.select([i]) for i, s in enumerate(seqs) if s.group not in flat})
        return flat

    def _score_rewards(self, groups: list[PromptGroup], seqs: list[SequenceResult], refs: list[SequenceRef],
                       streamed: dict) -> RewardResult:
        """The rewards of `seqs`, in order: those `judge_groups` computed already, the rest now."""
        known = {s.uid: self._judged.pop(s.uid) for s in seqs if s.uid in self._judged}
        rest = [i for i, s in enumerate(seqs) if s.uid not in known]
        if rest:
            fresh = self._score_fresh_rewards(groups, [seqs[i] for i in rest], [refs[i] for i in rest], streamed)
            if not known:
                return fresh
            known.update({seqs[i].uid: fresh.select([j]) for j, i in enumerate(rest)})
        return RewardResult.cat([known[s.uid] for s in seqs])

    def _score_fresh_rewards(self, groups: list[PromptGroup], seqs: list[SequenceResult], refs: list[SequenceRef],
                             streamed: dict) -> RewardResult:
        if self.reward_model is not None:
            # The reward function takes the model-based component as an input.
            batch = self.reward_batch(groups, seqs)
            lm = self._launch(self.reward_model, "compute_fluency", refs, streamed.get("lm"))()
            batch["lm_scores"] = [float(x) for x in lm]
            return self._rewards(batch, len(seqs))
        early = self._take_early(seqs)
        rest = [s for s in seqs if s.uid not in early]
        if rest:
            fresh = self._rewards(self.reward_batch(groups, rest), len(rest))
            if not early:
                return fresh
            early.update({s.uid: fresh.select([i]) for i, s in enumerate(rest)})
        return RewardResult.cat([early[s.uid] for s in seqs])

    def _sampled_log(self, sampled: RewardResult | None, groups: list[str], languages: list[str]) -> dict[str, float]:
        """reward/*: over every sampled transcript of the step, those of the groups
        dynamic sampling dropped included (what the policy does, and why: the flat share)."""
        parts = [(sampled, groups, languages)] if sampled is not None else []
        parts += self._dropped_flat
        self._dropped_flat = []
        if not parts:
            return {}
        reward = RewardResult.cat([p[0] for p in parts])
        groups, languages = [g for p in parts for g in p[1]], [x for p in parts for x in p[2]]
        return {**reward.log("reward/", languages), **flat_group_shares(reward.total, groups, languages)}

    def make(self, groups: list[PromptGroup], results: dict[str, list[SequenceResult]],
             streamed: dict | None = None, version: int | None = None
             ) -> tuple[list[ExperienceItem], dict[str, float]]:
        """`streamed` (scorer -> `StreamedScores`) holds what the streaming scorers made
        during the rollout; only what it does not cover is computed here. The actor's
        old log-probs are launched first, so they run while the scorers drain. `version`
        is the weights version that sampled this step's fresh tokens (the step).
        With `algorithm.train_samples_per_prompt` the rewards come first: they choose
        the samples that train, and only those are scored."""
        algo = self.cfg.algorithm
        streamed = streamed or {}
        if not groups:   # dynamic sampling dropped every group and reached its bound
            log.warning("every finished group had equal rewards and algorithm.dynamic_sampling.max_extra_groups "
                        "was reached: no update this step")
            return [], {**self._sampled_log(None, [], []), "perf/time/scoring": 0.0}
        seqs = [s for g in groups for s in results[g.uid]]
        refs = sequence_refs(groups, seqs)
        t0 = time.monotonic()
        self.reward_wait_s = 0.0
        num_sampled, sampled_seqs, sampled_refs = len(seqs), seqs, refs
        sampled = reward = None
        per_prompt = samples_trained_per_prompt(algo)
        if per_prompt < algo.n_samples_per_prompt:
            sampled = self._score_rewards(groups, seqs, refs, streamed)
            # A group with a dropped sample stays whole: the drop below removes it whole.
            bad = {s.group for s, k in zip(seqs, sampled.keep.tolist()) if not k}
            keep = downsample_groups(training_scores(sampled, algo.score_component), [s.group for s in seqs],
                                     per_prompt, bad)
            seqs, refs, reward = [seqs[i] for i in keep], [refs[i] for i in keep], sampled.select(keep)
        # Launch every scorer before waiting on any: they live in different actors.
        reused = self._reusable_old_logprobs(seqs, version)
        pending = {"old": self._launch(self.policy, "compute_logprobs", refs, KnownScores(reused) if reused else None)}
        if self.ref is not None:
            pending["ref"] = self._launch(self.ref, self.ref_method, refs, streamed.get("ref"))
        if self.critic is not None:
            pending["values"] = self._launch(self.critic, "compute_values", refs, streamed.get("values"))
        if reward is None:
            reward = sampled = self._score_rewards(groups, seqs, refs, streamed)
        got = {k: v() for k, v in pending.items()}
        score_s = time.monotonic() - t0
        old, ref, values = got["old"], got.get("ref"), got.get("values")
        dropped_groups, dropped = 0, reward.num_dropped
        if dropped:
            # reward.on_bad_reward=drop: a group with a bad sample leaves whole, so group
            # statistics (GRPO baselines) never see a hole.
            bad = {s.group for s, k in zip(seqs, reward.keep.tolist()) if not k}
            keep = [i for i, s in enumerate(seqs) if s.group not in bad]
            dropped_groups = len(bad)
            seqs, refs, old = [seqs[i] for i in keep], [refs[i] for i in keep], [old[i] for i in keep]
            ref = None if ref is None else [ref[i] for i in keep]
            values = None if values is None else [values[i] for i in keep]
            reward = reward.select(keep)
        faults = {"reward/dropped": float(dropped), "reward/dropped_groups": float(dropped_groups),
                  "perf/time/reward_wait": self.reward_wait_s, **self._request_stats(),
                  "faults/rescored_sequences": float(self.rescored),
                  "faults/reward_worker_restarts": float(self.reward_restarts)}
        # The reward logged is every sampled transcript's: what the policy does, whether
        # or not down-sampling trains on all of them; per language too, and the groups
        # too uniform to teach anything (where one language's learning stalls, these say why).
        sampled_log = self._sampled_log(sampled, [s.group for s in sampled_seqs],
                                        [r.language or "unknown" for r in sampled_refs])
        if not seqs:   # every group dropped: nothing to train on this step
            log.warning("every sampled group was dropped by reward.on_bad_reward=drop: no update this step")
            return [], {**sampled_log, **faults, "perf/time/scoring": score_s}
        items, adv = experience_items(algo, seqs, refs, old, ref, values,
                                      training_scores(reward, algo.score_component), per_prompt)
        lengths = torch.tensor([len(s.tokens) for s in seqs], dtype=torch.float32)
        metrics = {**sampled_log, **adv.metrics, **faults, "perf/time/scoring": score_s,
                   "charts/response_length": float(lengths.mean()),
                   "charts/response_length_p50": float(lengths.quantile(0.5)),
                   "charts/response_length_p90": float(lengths.quantile(0.9)),
                   "charts/response_length_max": float(lengths.max()),
                   "experience/old_logprobs_reused_frac": sum(s.uid in reused for s in seqs) / len(seqs),
                   "overlap/streamed_frac": sum(len(v.uids) for v in streamed.values())
                   / (num_sampled * len(streamed)) if streamed else 0.0,
                   "charts/truncated_frac": sum(s.finish_reason == "length" for s in seqs) / len(seqs),
                   "charts/advantage_abs": float(torch.cat(adv.advantages).abs().mean()),
                   "charts/trained_reward": float(reward.total.mean())}   # the drop above left only kept samples
        return items, metrics
