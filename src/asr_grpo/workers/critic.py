"""The PPO critic rank: value estimates for GAE and DeepSpeed training of the value model."""
from __future__ import annotations

import contextlib
from typing import Any

import torch

from asr_grpo.distributed.deepspeed_strategy import TrainingEngine, trained_precision
from asr_grpo.experience.losses import critic_loss
from asr_grpo.experience.types import ExperienceItem, SequenceRef
from asr_grpo.models import load_processor
from asr_grpo.models.critic import ValueModel, value_forward
from asr_grpo.models.streaming import identity_score
from asr_grpo.tracking import busy
from asr_grpo.workers.base import ModelRole
from asr_grpo.workers.device import join_process_group
from asr_grpo.workers.rng import rng_state, set_rng_state
from asr_grpo.workers.streaming import StreamScoringRole
from asr_grpo.workers.threads import phase
from asr_grpo.workers.training import run_updates


class CriticRole(ModelRole, StreamScoringRole):
    def __init__(self, cfg: Any, optimizer_steps: int):
        super().__init__(cfg)
        join_process_group()
        model = ValueModel.from_pretrained(self.cfg.model.path, self.cfg.model.freeze_audio_encoder)
        self.pad_id = load_processor(self.cfg.model.path).tokenizer.pad_token_id
        # Loaded in fp32; bfloat16 trains in DeepSpeed's bf16 mode, as the policy does.
        self.train_engine = TrainingEngine(model, self.engine_trainer_cfg(), lr=self.cfg.trainer.critic_lr,
                                           num_training_steps=optimizer_steps,
                                           bf16=trained_precision(self.cfg.model.dtype)[1])
        self.start_streaming(lambda: value_forward(self.train_engine.module), identity_score)

    @contextlib.contextmanager
    def scoring_weights(self):
        with self.train_engine.gathered() as module:
            module.eval()
            yield module

    @busy
    @phase("shared")
    @torch.no_grad()
    def compute_values(self, seqs: list[SequenceRef]) -> list[torch.Tensor]:
        with self.train_engine.gathered() as module:
            module.eval()
            return self._score_sequences(lambda: value_forward(module), identity_score, seqs,
                                         self.cfg.trainer.micro_batch_size)

    @busy
    @phase("train")
    def train(self, items: list[ExperienceItem]) -> dict[str, float]:
        cfg = self.cfg
        return run_updates(self.train_engine, items, cfg.trainer,
                           lambda model, mb: critic_loss(model, mb, cfg.algorithm, self.pad_id))

    def save(self, directory: str, tag: str) -> None:
        self.train_engine.save_checkpoint(directory, tag, client_state={"rng": rng_state()})

    def load(self, directory: str, tag: str) -> None:
        set_rng_state(self.train_engine.load_checkpoint(directory, tag).get("rng"))
