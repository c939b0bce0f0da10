"""What every model-holding role shares: its config, seeded RNGs, a thread budget per phase
(`workers/threads.py`), its device, and scoring a batch of sequences."""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from asr_grpo.config.schema import RunConfig
from asr_grpo.models import load_model
from asr_grpo.models.kv_batch import causal_lm_forward
from asr_grpo.models.streaming import score_once, token_logprobs
from asr_grpo.tracking import BusyClock
from asr_grpo.workers.device import role_device
from asr_grpo.workers.rng import seed_rngs
from asr_grpo.workers.threads import phase_threads, reserved_cpus


def as_config(cfg: Any) -> RunConfig | DictConfig:
    """Roles receive the run config as a plain dict (Ray pickles it); rebuild the typed node."""
    if isinstance(cfg, DictConfig):
        return cfg
    return OmegaConf.merge(OmegaConf.structured(RunConfig), cfg)


class ModelRole(BusyClock):
    """Base of the policy, reference, critic and rollout roles."""

    def __init__(self, cfg: Any):
        self.cfg = as_config(cfg)
        seed_rngs(self.cfg.seed + int(os.environ.get("RANK", 0)))
        self.phase_threads = phase_threads(self.cfg, int(os.environ.get("WORLD_SIZE", "1")),
                                           reserved=reserved_cpus(), on_gpu=role_device().type == "cuda")
        # Roles start side by side: load the models on the scoring share.
        torch.set_num_threads(self.phase_threads["shared"])
        # Keep tokenizers from spawning their own pool inside a 1-thread actor.
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        self.pad_id = 0

    @contextlib.contextmanager
    def threads(self, name: str) -> Iterator[int]:
        """torch threads for one phase of the step (`workers.threads.PHASES`); the count
        before is put back after. torch.set_num_threads acts on the calling thread's OpenMP
        pool, so it is set here, in the method, not once at start-up."""
        n = self.phase_threads[name]
        before = torch.get_num_threads()
        torch.set_num_threads(n)
        try:
            yield n
        finally:
            torch.set_num_threads(before)

    def load_frozen_model(self) -> tuple[torch.nn.Module, int]:
        """model.path's model on this role's device, for inference only, and its pad id."""
        model, processor = load_model(self.cfg.model.path, self.cfg.model.dtype)
        return model.to(role_device()).eval().requires_grad_(False), processor.tokenizer.pad_token_id

    def engine_trainer_cfg(self):
        """trainer config for `TrainingEngine`, which wants a thread count: the training
        phase's (the roles' `threads` then set every phase per call)."""
        trainer = self.cfg.trainer.copy()
        trainer.num_threads = self.phase_threads["train"]
        return trainer

    @torch.no_grad()
    def _logprobs(self, model, items: Sequence, micro_batch: int,
                  temperature: float | None = None) -> list[torch.Tensor]:
        """Per-token log-probs of finished sequences, under the sampling temperature
        (`algorithm.temperature`) unless `temperature` is given (the sync check's 1.0)."""
        return self._score_sequences(lambda: causal_lm_forward(model),
                                     token_logprobs(self._temperature(temperature)), items, micro_batch)

    def _temperature(self, temperature: float | None) -> float:
        """The temperature fixed sequences are scored at: the sampling one unless given."""
        return self.cfg.algorithm.temperature if temperature is None else temperature

    def _score_sequences(self, forward, score, items: Sequence, micro_batch: int) -> list[torch.Tensor]:
        """Per-token scores of finished sequences (`SequenceRef`s), `micro_batch`
        sequences' KV caches at a time; the samples of one prompt share its prefill."""
        return score_once(forward, self.pad_id, score, [it.uid for it in items],
                          [it.prompt_ids for it in items], [it.features for it in items],
                          [it.response_ids for it in items],
                          max_batch_size=max(micro_batch, 1))
