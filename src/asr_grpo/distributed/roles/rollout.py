"""A separate rollout worker (placement=separate): its own copy of the policy, decoding
with the HF engine; fresh weights arrive from trainer rank 0 over the sync group."""
from __future__ import annotations

from typing import Any

import torch

from asr_grpo.distributed.roles.base import ModelRole
from asr_grpo.distributed.roles.rollout_host import RolloutHost, sampling_params
from asr_grpo.distributed.weight_sync import WeightSyncGroup
from asr_grpo.experience.types import SequenceRef
from asr_grpo.models import load_model
from asr_grpo.rollout import HFChunkedEngine


class RolloutRole(ModelRole, RolloutHost):
    def __init__(self, cfg: Any):
        super().__init__(cfg)
        self.model, processor = load_model(self.cfg.model.path, self.cfg.model.dtype)
        self.model.eval().requires_grad_(False)
        self.pad_id = processor.tokenizer.pad_token_id
        self.engine = HFChunkedEngine(self.model, self.model.generation_config.eos_token_id, self.pad_id,
                                      sampling_params(self.cfg.algorithm, self.cfg.seed),
                                      max_batch_size=self.cfg.trainer.rollout_batch_size,
                                      suppress_token_ids=self.model.generation_config.suppress_tokens)
        self.sync: WeightSyncGroup | None = None

    def join_weight_sync(self, master_addr: str, master_port: int, rank: int, world_size: int,
                         backend: str) -> None:
        self.sync = WeightSyncGroup.create(master_addr, master_port, rank, world_size, backend)

    def receive_weights(self, version: int) -> None:
        self.sync.receive_model(self.model)
        self.engine.policy_version = version

    def compute_logprobs(self, seqs: list[SequenceRef]) -> list[torch.Tensor]:
        """The engine's own view of fixed sequences: a sync check compares it to the trainer's."""
        return self._logprobs(self.model, seqs, self.cfg.trainer.micro_batch_size)
