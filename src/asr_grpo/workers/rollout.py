"""The rollout engines a run can use (`rollout.engine=<name>`, `ROLLOUT_ENGINES`), and the
HF one's worker for placement=separate: its own copy of the policy, decoding with the HF
engine; fresh weights arrive from trainer rank 0 over the sync group.
`rollout_ranks` / `rollout_role_spec` / `sync_backend` pick the workers for the
configured engine (vLLM engines: workers/vllm_rollout.py)."""
from __future__ import annotations

from typing import Any

import torch

from asr_grpo.config.registry import Registry
from asr_grpo.distributed.deepspeed_strategy import backend_for_device
from asr_grpo.distributed.faults import WorkerRestarted
from asr_grpo.distributed.placement import PlacementPlan
from asr_grpo.distributed.weight_sync import WeightSyncGroup, model_tensors
from asr_grpo.experience.types import SequenceRef
from asr_grpo.models.lora import adapter_tensors, apply_lora
from asr_grpo.rollout import vllm_unavailable_reason
from asr_grpo.workers.base import ModelRole
from asr_grpo.workers.rollout_host import RolloutHost, hf_engine


class RolloutRole(ModelRole, RolloutHost):
    def __init__(self, cfg: Any):
        super().__init__(cfg)
        self.model, self.pad_id = self.load_frozen_model()
        # model.lora: the same adapters on this copy (in place), so a sync sends only them.
        self.lora = apply_lora(self.model, self.cfg.model.lora)
        self.model.requires_grad_(False)
        self.engine = hf_engine(self.cfg, self.model, self.pad_id)
        self.sync: WeightSyncGroup | None = None

    def join_weight_sync(self, master_addr: str, master_port: int, rank: int, world_size: int,
                         backend: str) -> None:
        self.sync = WeightSyncGroup.create(master_addr, master_port, rank, world_size, backend,
                                           timeout_s=self.cfg.rollout.weight_sync_timeout_s)

    def weight_sync_ranks(self) -> int:
        return 1

    def receive_weights(self, version: int) -> None:
        if self.sync is None:   # restarted (Ray retries a push's call on the new process): no group yet
            raise WorkerRestarted("rollout worker restarted: it has no weight sync group until the driver builds one")
        self.sync.receive_into(adapter_tensors(self.model) if self.lora is not None else model_tensors(self.model))
        self.engine.policy_version = version

    def compute_logprobs(self, seqs: list[SequenceRef], temperature: float | None = None) -> list[torch.Tensor]:
        """The engine's own view of fixed sequences: the sync check compares it to the trainer's."""
        return self._logprobs(self.model, seqs, self.cfg.trainer.micro_batch_size, temperature)


class EngineSpec:
    """What `@ROLLOUT_ENGINES.register("<name>")` registers: a subclass naming the actor
    class that hosts the engine in workers of its own (`role`, or `role_spec` where the
    plan or the init arguments differ) and, where the defaults do not fit, whether the
    engine can run here and how many rollout slots it takes. The actor builds its engine
    from the run config and serves `RolloutHost`'s calls, plus what the recipe asks of a
    rollout worker: `weight_sync_ranks`, `join_weight_sync`, `receive_weights`,
    `compute_logprobs` (the sync check) and, with rollout.sleep_level, `sleep`."""

    role: type
    # With model.lora: whether the engine's workers wrap their copy with the same LoRA
    # adapters and take only the adapters' tensors at a sync; else they get the weights
    # with the adapters merged in, in the plain model's layout.
    applies_lora: bool = False

    @classmethod
    def unavailable_reason(cls) -> str | None:
        """None when the engine can run here, else why not (cheap: checked at validation)."""
        return None

    @classmethod
    def rollout_ranks(cls, cfg) -> int:
        """Rollout slots to plan (0: the policy ranks decode themselves)."""
        return int(cfg.placement.rollout_num_workers)

    @classmethod
    def role_spec(cls, cfg, plan: PlacementPlan) -> tuple[type, PlacementPlan, dict]:
        """(role class, plan for its RoleGroup, extra init kwargs)."""
        return cls.role, plan, {}


ROLLOUT_ENGINES: Registry[type[EngineSpec]] = Registry("rollout.engine")


@ROLLOUT_ENGINES.register("hf")
class HFEngine(EngineSpec):
    """The policy's own forward: colocated, the actor ranks decode (no rollout role)."""
    role = RolloutRole
    applies_lora = True

    @classmethod
    def rollout_ranks(cls, cfg) -> int:
        return 0 if cfg.placement.colocate else int(cfg.placement.rollout_num_workers)


@ROLLOUT_ENGINES.register("vllm")
class VLLMEngine(EngineSpec):
    """vLLM engines as Ray actors, each on rollout.tensor_parallel_size slots, colocated or not.
    With LoRA they get merged weights (`applies_lora` False): vLLM's own LoRA serving would
    need a LoRA request per update and is untried with Qwen3-ASR."""

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return vllm_unavailable_reason()

    @classmethod
    def rollout_ranks(cls, cfg) -> int:
        return int(cfg.placement.rollout_num_workers) * int(cfg.rollout.tensor_parallel_size)

    @classmethod
    def role_spec(cls, cfg, plan: PlacementPlan) -> tuple[type, PlacementPlan, dict]:
        from asr_grpo.workers.vllm_rollout import VLLMRolloutRole, engine_plan

        engines, bundles = engine_plan(plan, cfg.rollout.tensor_parallel_size)
        return VLLMRolloutRole, engines, {"bundle_indices": bundles}


def rollout_ranks(cfg) -> int:
    """Rollout slots the configured engine needs (0: colocated HF, the actor ranks decode)."""
    return ROLLOUT_ENGINES.get(cfg.rollout.engine).rollout_ranks(cfg)


def rollout_role_spec(cfg, plan: PlacementPlan) -> tuple[type, PlacementPlan, dict]:
    """(role class, plan for its RoleGroup, extra init kwargs) for rollout.engine."""
    return ROLLOUT_ENGINES.get(cfg.rollout.engine).role_spec(cfg, plan)


def sync_backend(cfg) -> str:
    """The weight-sync group's backend. Colocated vLLM engines share the trainer's GPU,
    where NCCL refuses two ranks on one device: gloo (through host memory) there."""
    if cfg.rollout.sync_backend != "auto":
        return cfg.rollout.sync_backend
    return "gloo" if cfg.placement.colocate else backend_for_device()
