"""The frozen reference policy: log-probs for the KL term."""
from __future__ import annotations

from typing import Any

import torch

from asr_grpo.experience.types import SequenceRef
from asr_grpo.models.kv_batch import causal_lm_forward
from asr_grpo.models.streaming import token_logprobs
from asr_grpo.tracking import busy
from asr_grpo.workers.base import ModelRole
from asr_grpo.workers.streaming import StreamScoringRole
from asr_grpo.workers.threads import phase


class ReferenceRole(ModelRole, StreamScoringRole):
    def __init__(self, cfg: Any):
        super().__init__(cfg)
        self.model, self.pad_id = self.load_frozen_model()
        self.start_streaming(lambda: causal_lm_forward(self.model), token_logprobs(self.cfg.algorithm.temperature))

    @busy
    @phase("shared")
    def compute_logprobs(self, seqs: list[SequenceRef]) -> list[torch.Tensor]:
        return self._logprobs(self.model, seqs, self.cfg.trainer.micro_batch_size)
