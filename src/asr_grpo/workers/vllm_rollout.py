"""A vLLM rollout engine as a Ray actor (rollout=vllm): the chunked-engine API of every
rollout host, plus joining the weight-sync group and receiving the trainer's weights.

One actor per engine. tensor_parallel_size 1: the actor holds its bundle's GPU share
and vLLM runs in it. Above 1 (see `engine_plan`): the actor takes no GPU and vLLM's
Ray executor starts a worker on each of the engine's bundles.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any

import torch

from asr_grpo.distributed.faults import WorkerRestarted
from asr_grpo.distributed.placement import PlacementPlan, Slot
from asr_grpo.distributed.role_group import DIST_ENV_KEYS
from asr_grpo.distributed.weight_sync import tensor_specs
from asr_grpo.experience.types import SequenceRef
from asr_grpo.rollout import create_vllm_engine
from asr_grpo.workers.base import ModelRole
from asr_grpo.workers.rollout_host import RolloutHost, sampling_params


def engine_plan(plan: PlacementPlan, tensor_parallel_size: int) -> tuple[PlacementPlan, list[list[int]]]:
    """The plan reserves one rollout slot per GPU; an engine spans `tensor_parallel_size`
    consecutive ones. Returns the plan with one slot per engine (on its first bundle,
    with no GPU of its own when its workers take them) and each engine's bundles."""
    slots, tp = plan.ranks("rollout"), int(tensor_parallel_size)
    if len(slots) % tp:
        raise ValueError(f"{len(slots)} rollout slots do not split into engines of rollout.tensor_parallel_size={tp}")
    groups = [slots[i:i + tp] for i in range(0, len(slots), tp)]
    bundles = [[s.bundle_index for s in g] for g in groups]
    if tp == 1:
        return plan, bundles
    engines = tuple(Slot("rollout", e, g[0].bundle_index, 0.0, g[0].num_cpus) for e, g in enumerate(groups))
    return dataclasses.replace(plan, slots={**plan.slots, "rollout": engines}), bundles


def weight_specs(model_path: str) -> list[tuple[str, tuple[int, ...]]]:
    """Names and shapes of the tensors the trainer sends, from the checkpoint's config:
    the same architecture built on the meta device (no weights allocated)."""
    from transformers import Qwen3ASRForConditionalGeneration

    # The model's own config class, not AutoConfig: once vLLM is imported, AutoConfig
    # maps "qwen3_asr" to vLLM's config (the released thinker layout, no audio_config).
    config = Qwen3ASRForConditionalGeneration.config_class.from_pretrained(model_path)
    with torch.device("meta"):
        skeleton = Qwen3ASRForConditionalGeneration(config)
    return tensor_specs(skeleton)


class VLLMRolloutRole(ModelRole, RolloutHost):
    def __init__(self, cfg: Any, bundle_indices: list[list[int]] | None = None):
        super().__init__(cfg)
        from transformers import GenerationConfig

        c = self.cfg
        rank = int(os.environ.get("RANK", 0))
        # The env names this group's torch.distributed rendezvous, which an engine never
        # joins; vLLM sets up its own and must not pick these up.
        for key in DIST_ENV_KEYS:
            os.environ.pop(key, None)
        gen = GenerationConfig.from_pretrained(c.model.path)
        eos = gen.eos_token_id if isinstance(gen.eos_token_id, list) else [gen.eos_token_id]
        self.engine = create_vllm_engine(
            c.rollout, model_path=c.model.path, export_root=c.rollout.export_dir, seed=c.seed + rank,
            sampling=sampling_params(c.algorithm, c.seed), eos_token_ids=eos,
            suppress_token_ids=gen.suppress_tokens or (), max_model_len=c.rollout.max_model_len,
            bundle_indices=bundle_indices[rank] if bundle_indices else (), worker_gpus=c.placement.rollout_gpus)
        self.sync_joined = False

    def weight_sync_ranks(self) -> int:
        return int(self.cfg.rollout.tensor_parallel_size)

    def join_weight_sync(self, master_addr: str, master_port: int, rank: int, world_size: int,
                         backend: str) -> None:
        """This engine's workers take sync ranks rank .. rank + tensor_parallel_size - 1."""
        self.engine.join_weight_sync(master_addr, master_port, rank, world_size, backend,
                                     weight_specs(self.cfg.model.path), self.cfg.rollout.weight_sync_timeout_s)
        self.sync_joined = True

    def receive_weights(self, version: int) -> None:
        if not self.sync_joined:   # restarted (Ray retries a push's call on the new process): no group yet
            raise WorkerRestarted("rollout worker restarted: it has no weight sync group until the driver builds one")
        self.engine.update_weights(version)

    def compute_logprobs(self, seqs: list[SequenceRef], temperature: float | None = None) -> list[torch.Tensor]:
        """The engine's own log-probs of fixed sequences: the sync check. vLLM's prompt
        log-probs are the raw distribution, so only temperature 1 can be asked for."""
        temp = self._temperature(temperature)
        if temp != 1.0:
            raise ValueError(f"a vLLM engine scores fixed sequences at temperature 1 only (asked for {temp}); "
                             "pass temperature=1.0 and compare with the trainer's at 1.0")
        return self.engine.score(seqs)

    def sleep(self) -> None:
        self.engine.sleep(int(self.cfg.rollout.sleep_level))
