"""A separate rollout worker (placement=separate): its own copy of the policy, decoding
with the HF engine; fresh weights arrive from trainer rank 0 over the sync group.
`rollout_ranks` / `rollout_role_spec` / `sync_backend` pick the workers for the
configured engine (rollout=hf|vllm; vLLM engines: workers/vllm_rollout.py)."""
from __future__ import annotations

from typing import Any

import torch

from asr_grpo.distributed.deepspeed_strategy import backend_for_device
from asr_grpo.distributed.placement import PlacementPlan
from asr_grpo.distributed.weight_sync import WeightSyncGroup
from asr_grpo.experience.types import SequenceRef
from asr_grpo.workers.base import ModelRole
from asr_grpo.workers.rollout_host import RolloutHost, hf_engine


class RolloutRole(ModelRole, RolloutHost):
    def __init__(self, cfg: Any):
        super().__init__(cfg)
        self.model, self.pad_id = self.load_frozen_model()
        self.engine = hf_engine(self.cfg, self.model, self.pad_id)
        self.sync: WeightSyncGroup | None = None

    def join_weight_sync(self, master_addr: str, master_port: int, rank: int, world_size: int,
                         backend: str) -> None:
        self.sync = WeightSyncGroup.create(master_addr, master_port, rank, world_size, backend)

    def weight_sync_ranks(self) -> int:
        return 1

    def receive_weights(self, version: int) -> None:
        self.sync.receive_model(self.model)
        self.engine.policy_version = version

    def compute_logprobs(self, seqs: list[SequenceRef], temperature: float | None = None) -> list[torch.Tensor]:
        """The engine's own view of fixed sequences: the sync check compares it to the trainer's."""
        return self._logprobs(self.model, seqs, self.cfg.trainer.micro_batch_size, temperature)


def rollout_ranks(cfg) -> int:
    """Rollout slots to plan: colocated HF rollout runs on the actor ranks (none); a
    vLLM engine takes rollout.tensor_parallel_size slots, colocated or not."""
    workers = int(cfg.placement.rollout_num_workers)
    if cfg.rollout.engine == "hf":
        return 0 if cfg.placement.colocate else workers
    return workers * int(cfg.rollout.tensor_parallel_size)


def rollout_role_spec(cfg, plan: PlacementPlan) -> tuple[type, PlacementPlan, dict]:
    """(role class, plan for its RoleGroup, extra init kwargs) for rollout.engine."""
    if cfg.rollout.engine == "hf":
        return RolloutRole, plan, {}
    from asr_grpo.workers.vllm_rollout import VLLMRolloutRole, engine_plan

    engines, bundles = engine_plan(plan, cfg.rollout.tensor_parallel_size)
    return VLLMRolloutRole, engines, {"bundle_indices": bundles}


def sync_backend(cfg) -> str:
    """The weight-sync group's backend. Colocated vLLM engines share the trainer's GPU,
    where NCCL refuses two ranks on one device: gloo (through host memory) there."""
    if cfg.rollout.sync_backend != "auto":
        return cfg.rollout.sync_backend
    return "gloo" if cfg.placement.colocate else backend_for_device()
