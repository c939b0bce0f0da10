"""The model-based reward component (reward.smoothness_scorer=lm): a small text LM,
trained on the corpus text at set-up, scores each transcript's fluency from its
per-token log-likelihood. It is the reward-model prefill OPPO hides: it streams like
the reference and the critic, and returns one fluency score per finished sequence."""
from __future__ import annotations

from typing import Any

import torch

from asr_grpo.experience.types import SequenceRef
from asr_grpo.models import load_processor
from asr_grpo.models.kv_batch import causal_lm_forward
from asr_grpo.models.streaming import token_logprobs
from asr_grpo.models.text_lm import (
    fluency_from_logprobs,
    language_context_ids,
    load_text_lm,
    response_token_logprobs,
    start_token_id,
)
from asr_grpo.tracking import busy
from asr_grpo.workers.base import ModelRole
from asr_grpo.workers.device import role_device
from asr_grpo.workers.streaming import StreamScoringRole
from asr_grpo.workers.threads import phase


class RewardModelRole(ModelRole, StreamScoringRole):
    def __init__(self, cfg: Any):
        super().__init__(cfg)
        self.model = load_text_lm(self.cfg.reward.text_lm_dir, role_device())
        self.tokenizer = load_processor(self.cfg.model.path).tokenizer
        self.pad_id = self.tokenizer.pad_token_id
        self.start_id = start_token_id(self.tokenizer)
        self.reference_nll = float(getattr(self.model.config, "fluency_reference_nll", 0.0))
        self.start_streaming(lambda: causal_lm_forward(self.model), token_logprobs(), use_audio=False)

    def _context(self, language: str | None) -> list[int]:
        if language is None:
            raise ValueError("the LM reward model needs each sequence's language")
        return language_context_ids(self.tokenizer, language)

    # The ASR prompt is audio; the text LM conditions on the declared language only.
    def stream_prompt(self, ref: SequenceRef) -> tuple[list[int], None]:
        return [self.start_id, *self._context(ref.language)], None

    def stream_result(self, scores: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {uid: torch.tensor(fluency_from_logprobs(lp, self.reference_nll)) for uid, lp in scores.items()}

    @busy
    @phase("shared")
    def compute_fluency(self, seqs: list[SequenceRef]) -> list[torch.Tensor]:
        """One-shot scoring of finished sequences (overlap modes without streaming)."""
        logprobs = response_token_logprobs(self.model, [s.response_ids for s in seqs], self.start_id,
                                           [self._context(s.language) for s in seqs],
                                           batch_size=self.cfg.trainer.rollout_batch_size)
        return list(self.stream_result({s.uid: lp for s, lp in zip(seqs, logprobs)}).values())
