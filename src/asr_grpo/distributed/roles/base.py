"""What every model-holding role shares: config, threads, scoring a batch of sequences."""
from __future__ import annotations

import os
import random
from typing import Any, Sequence

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from asr_grpo.config.schema import RunConfig
from asr_grpo.models.kv_batch import causal_lm_forward
from asr_grpo.models.streaming import score_once, token_logprobs
from asr_grpo.tracking import BusyClock


def as_config(cfg: Any) -> RunConfig | DictConfig:
    """Roles receive the run config as a plain dict (Ray pickles it); rebuild the typed node."""
    if isinstance(cfg, DictConfig):
        return cfg
    return OmegaConf.merge(OmegaConf.structured(RunConfig), cfg)


def seed_rngs(seed: int) -> None:
    """Seed the process-wide torch, numpy and Python RNGs (a role's are then the same in
    every run with the same seed, and a resume puts them back from the checkpoint)."""
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)


def rng_state() -> dict:
    """The RNG streams as tensors and plain values only, so the checkpoint loads weights-only."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    return {"torch": torch.get_rng_state(),
            "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(gauss)],
            "python": [version, torch.tensor(internal, dtype=torch.int64), gauss_next]}


def set_rng_state(state: dict | None) -> None:
    if not state:
        return
    torch.set_rng_state(state["torch"])
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(int(x) for x in internal.tolist()), gauss_next))


def role_device() -> torch.device:
    """Where this role's model runs: its GPU when Ray gave it one (Ray sets
    CUDA_VISIBLE_DEVICES to the actor's own devices, so that GPU is index 0), else CPU."""
    return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")


def join_process_group() -> int:
    """Join the role's data-parallel group from the env vars its RoleGroup set; returns the rank."""
    from asr_grpo.distributed.deepspeed_strategy import init_distributed

    rank = int(os.environ["RANK"])
    init_distributed(rank, int(os.environ["WORLD_SIZE"]), os.environ["MASTER_ADDR"],
                     int(os.environ["MASTER_PORT"]), local_rank=int(os.environ.get("LOCAL_RANK", 0)))
    return rank


class ModelRole(BusyClock):
    """Base of the policy, reference, critic and rollout roles."""

    def __init__(self, cfg: Any):
        self.cfg = as_config(cfg)
        seed_rngs(self.cfg.seed + int(os.environ.get("RANK", 0)))
        torch.set_num_threads(max(1, self.cfg.trainer.num_threads))
        # Keep tokenizers from spawning their own pool inside a 1-thread actor.
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        self.pad_id = 0

    def ping(self) -> int:
        return os.getpid()

    @torch.no_grad()
    def _logprobs(self, model, items: Sequence, micro_batch: int) -> list[torch.Tensor]:
        """Per-token log-probs of finished sequences."""
        return self._score_sequences(lambda: causal_lm_forward(model), token_logprobs(self.cfg.algorithm.temperature),
                                     items, micro_batch)

    def _score_sequences(self, forward, score, items: Sequence, micro_batch: int) -> list[torch.Tensor]:
        """Per-token scores of finished sequences (`SequenceRef`s), `micro_batch`
        sequences' KV caches at a time; the samples of one prompt share its prefill."""
        return score_once(forward, self.pad_id, score, [it.uid for it in items], [it.prompt_ids for it in items],
                          [it.features for it in items], [it.response_ids for it in items],
                          max_batch_size=max(micro_batch, 1))
