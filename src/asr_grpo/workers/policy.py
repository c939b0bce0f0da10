"""A policy (actor) rank: DeepSpeed training of LM + adapter, the old log-probs, and,
when colocated, the rollout itself with the actor's own forward."""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import numpy as np
import torch

from asr_grpo.distributed.deepspeed_strategy import TrainingEngine, trained_precision
from asr_grpo.distributed.ema import WeightEma
from asr_grpo.distributed.weight_sync import WeightSyncGroup, broadcast_tensors, model_tensors
from asr_grpo.evaluation import transcribe
from asr_grpo.experience.losses import actor_loss
from asr_grpo.experience.types import ExperienceItem, SequenceRef
from asr_grpo.models import load_model, set_audio_encoder_frozen
from asr_grpo.models.lora import adapter_tensors, apply_lora, merged_tensors, save_model_checkpoint
from asr_grpo.tracking import busy
from asr_grpo.workers.base import ModelRole
from asr_grpo.workers.device import join_process_group
from asr_grpo.workers.rng import rng_state, set_rng_state
from asr_grpo.workers.rollout import ROLLOUT_ENGINES
from asr_grpo.workers.rollout_host import RolloutHost, hf_engine
from asr_grpo.workers.threads import phase
from asr_grpo.workers.training import run_updates


class PolicyRole(ModelRole, RolloutHost):
    def __init__(self, cfg: Any, optimizer_steps: int):
        super().__init__(cfg)
        rank = join_process_group()
        self.rank = rank
        # bfloat16: fp32 weights into DeepSpeed's bf16 mode (bf16 compute, fp32 master weights).
        load_dtype, bf16 = trained_precision(self.cfg.model.dtype)
        model, self.processor = load_model(self.cfg.model.path, load_dtype)
        set_audio_encoder_frozen(model, self.cfg.model.freeze_audio_encoder)
        # model.lora: adapters wrapped into `model` in place (everything else frozen); the
        # PeftModel is kept for switching them off (the reference) and saving them alone.
        self.lora = apply_lora(model, self.cfg.model.lora)
        self.train_engine = TrainingEngine(model, self.engine_trainer_cfg(), lr=self.cfg.trainer.lr,
                                           num_training_steps=optimizer_steps, bf16=bf16)
        tok = self.processor.tokenizer
        self.pad_id = tok.pad_token_id
        self.sync: WeightSyncGroup | None = None
        self.engine = hf_engine(self.cfg, self.train_engine.module, self.pad_id)
        decay = self.cfg.trainer.ema_decay
        self.ema = WeightEma(self.train_engine.module, decay, self.cfg.trainer.ema_warmup) if decay > 0 else None

    @busy
    @phase("shared")
    def compute_logprobs(self, seqs: list[SequenceRef], temperature: float | None = None) -> list[torch.Tensor]:
        with self.train_engine.gathered() as module:
            module.eval()
            return self._logprobs(module, seqs, self.cfg.trainer.micro_batch_size, temperature)

    @busy
    @phase("shared")
    def compute_ref_logprobs(self, seqs: list[SequenceRef]) -> list[torch.Tensor]:
        """The reference policy's log-probs from this rank's own weights with the LoRA
        adapters switched off: the base model, with no second copy of it (LoRA on
        colocated ranks: `models.lora.reference_in_policy`)."""
        if self.lora is None:
            raise ValueError("reference log-probs asked of the policy, but model.lora.rank=0 trains every weight")
        with self.train_engine.gathered() as module, self.lora.disable_adapter():
            module.eval()
            return self._logprobs(module, seqs, self.cfg.trainer.micro_batch_size)

    @busy
    @phase("train")
    def train(self, items: list[ExperienceItem]) -> dict[str, float]:
        cfg = self.cfg
        metrics = run_updates(self.train_engine, items, cfg.trainer,
                              lambda model, mb: actor_loss(model, mb, cfg.algorithm, self.pad_id))
        if self.ema is not None:
            metrics["charts/ema_decay"] = self.ema.update()
        return metrics

    def _weights(self, ema: bool):
        """The averaged weights in place of the policy's (`trainer.ema_decay`), or the policy's own."""
        if not ema:
            return contextlib.nullcontext()
        if self.ema is None:
            raise ValueError("EMA weights asked for, but trainer.ema_decay=0 keeps no average")
        return self.ema.applied()

    @phase("solo")
    def transcribe(self, audios: list[np.ndarray], languages: list[str], ema: bool = False) -> list[str]:
        """Greedy transcripts from the policy, or from its weight average when `ema`."""
        with self._weights(ema), self.train_engine.gathered() as module:
            return transcribe(module, self.processor, audios, languages,
                              batch_size=self.cfg.trainer.rollout_batch_size,
                              max_new_tokens=self.cfg.algorithm.max_new_tokens)

    # ---- checkpoints ----------------------------------------------------------------
    def save(self, directory: str, tag: str, client_state: dict, hf_dir: str | None) -> None:
        """Collective: DeepSpeed state on every rank; rank 0 also writes the HF folder (and,
        with a weight average, `<hf_dir>_ema` beside it); every rank its part of the average."""
        state = dict(client_state, rng=rng_state())
        # With LoRA the frozen base stays out: a resume loads it from model.path again.
        self.train_engine.save_checkpoint(directory, tag, client_state=state, frozen=self.lora is None)
        if self.ema is not None:
            torch.save(self.ema.state_dict(), self._ema_file(directory, tag))
        # Every rank enters each gather (ZeRO-3 collectives); only rank 0 writes.
        copies = [(False, hf_dir)]
        if self.ema is not None:
            copies.append((True, hf_dir and f"{hf_dir}_ema"))
        for ema, folder in copies:
            with self._weights(ema), self.train_engine.gathered() as module:
                if self.rank == 0 and folder:
                    save_model_checkpoint(module, self.processor, folder, {"stage": "rl", "ema": ema, **client_state},
                                          peft_model=self.lora)

    def load(self, directory: str, tag: str) -> dict:
        state = self.train_engine.load_checkpoint(directory, tag, frozen=self.lora is None)
        set_rng_state(state.pop("rng", None))
        if self.ema is not None:
            path = self._ema_file(directory, tag)
            if not path.is_file():
                raise FileNotFoundError(f"{path}: trainer.ema_decay={self.cfg.trainer.ema_decay} but the checkpoint "
                                        "holds no weight average (it was written with trainer.ema_decay=0)")
            self.ema.load_state_dict(torch.load(path, weights_only=True))
        return state

    def _ema_file(self, directory: str, tag: str) -> Path:
        """This rank's part of the weight average, inside DeepSpeed's tag folder."""
        return Path(directory) / tag / f"ema_rank{self.rank:03d}.pt"

    # ---- weight sync to separate rollout workers -------------------------------------
    def join_weight_sync(self, master_addr: str, master_port: int, world_size: int, backend: str) -> None:
        """Only trainer rank 0 is a member of the sync group (rank 0 in it)."""
        if self.rank == 0:
            self.sync = WeightSyncGroup.create(master_addr, master_port, 0, world_size, backend,
                                               timeout_s=self.cfg.rollout.weight_sync_timeout_s)

    def broadcast_weights(self) -> None:
        """Collective over the trainer ranks (ZeRO-3 gathers each parameter); rank 0 sends."""
        tensors, read = self._sync_payload()
        broadcast_tensors(tensors, self.train_engine.zero_stage, self.sync if self.rank == 0 else None, read)

    def _sync_payload(self):
        """(tensors, read) a sync sends: every tensor; with LoRA only the adapters to
        engines that wrap their copy the same way (`EngineSpec.applies_lora`: HF rollout
        workers), else the base layout with the adapters merged in (vLLM)."""
        module = self.train_engine.module
        if self.lora is None:
            return model_tensors(module), None
        if ROLLOUT_ENGINES.get(self.cfg.rollout.engine).applies_lora:
            return adapter_tensors(module), None
        return merged_tensors(module, model_tensors(module))
