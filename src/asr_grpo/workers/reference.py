"""The frozen reference policy: log-probs for the KL term."""
from __future__ import annotations

from typing import Any

import torch

from asr_grpo.experience.types import SequenceRef
from asr_grpo.models import load_model
from asr_grpo.models.kv_batch import causal_lm_forward
from asr_grpo.models.streaming import StreamingScorer, token_logprobs
from asr_grpo.tracking import busy
from asr_grpo.workers.base import ModelRole, phase, role_device
from asr_grpo.workers.streaming import StreamScoringRole


class ReferenceRole(ModelRole, StreamScoringRole):
    def __init__(self, cfg: Any):
        super().__init__(cfg)
        self.model, processor = load_model(self.cfg.model.path, self.cfg.model.dtype)
        self.model.to(role_device()).eval().requires_grad_(False)
        self.pad_id = processor.tokenizer.pad_token_id
        self.yield_cpu_to_actor(self.cfg.overlap.scorer_nice)
        self.scorer = StreamingScorer(lambda: causal_lm_forward(self.model), self.pad_id,
                                      token_logprobs(self.cfg.algorithm.temperature),
                                      max_batch_size=self.cfg.trainer.rollout_batch_size)

    @busy
    @phase("shared")
    def compute_logprobs(self, seqs: list[SequenceRef]) -> list[torch.Tensor]:
        return self._logprobs(self.model, seqs, self.cfg.trainer.micro_batch_size)
