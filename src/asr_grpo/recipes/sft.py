"""SFT warm start: train the tiny Qwen3-ASR on the corpus, save an HF checkpoint with
its dev CER/WER. Lifecycle: setup -> train -> evaluate -> save."""
from __future__ import annotations

import json
import logging
import random
import time
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig
from tqdm import tqdm
from transformers import get_cosine_with_min_lr_schedule_with_warmup

from asr_grpo.config.errors import ConfigError
from asr_grpo.config.schema import RunConfig
from asr_grpo.data import AsrDataset, resolve_manifests, skipped_lines
from asr_grpo.data.augment import perturb_batch, spec_augment, used_conditions
from asr_grpo.data.conditions import train_conditions
from asr_grpo.data.manifest import manifest_digest
from asr_grpo.distributed.deepspeed_strategy import trained_precision
from asr_grpo.evaluation import evaluate_dataset, evaluation_sets, metrics_of_sets
from asr_grpo.models import (
    IGNORE_INDEX,
    audio_encoder,
    encode_supervised,
    fresh_model,
    load_model,
    parameter_counts,
    set_audio_encoder_frozen,
)
from asr_grpo.models.ctc import CTCHead
from asr_grpo.models.lora import apply_lora, save_model_checkpoint
from asr_grpo.recipes.batching import length_grouped_batches
from asr_grpo.recipes.sft_start import (
    check_lora_start,
    check_model_path,
    profile_problem,
    starts_from_checkpoint,
)
from asr_grpo.tracking import MlflowRun

log = logging.getLogger(__name__)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def corrupt_transcript_inputs(input_ids: torch.Tensor, labels: torch.Tensor, rate: float,
                              generator: torch.Generator) -> torch.Tensor:
    """`input_ids` with a `rate` fraction of the transcript positions (those with a label)
    holding another transcript token of the batch instead; prompt and audio untouched."""
    is_text = labels != IGNORE_INDEX
    if rate <= 0 or not bool(is_text.any()):
        return input_ids
    pool = input_ids[is_text]
    hit = is_text & (torch.rand(input_ids.shape, generator=generator) < rate)
    out = input_ids.clone()
    out[hit] = pool[torch.randint(len(pool), (int(hit.sum()),), generator=generator)]
    return out


def set_frontend_memory_format(model, memory_format: torch.memory_format) -> None:
    """Channels-last weights make the encoder's conv stack about 30% faster to train on
    CPU (oneDNN); safetensors saves only contiguous tensors, so saving turns them back."""
    enc = audio_encoder(model)
    for conv in (enc.conv2d1, enc.conv2d2, enc.conv2d3):
        conv.to(memory_format=memory_format)


class SFTRecipe:
    def __init__(self, cfg: RunConfig | DictConfig):
        self.cfg = cfg
        self.output_root = Path(cfg.paths.output_root)

    # ---- setup -------------------------------------------------------------------------
    def setup(self) -> None:
        cfg = self.cfg
        seed_everything(cfg.sft.seed)
        torch.set_num_threads(cfg.sft.num_threads)
        check_lora_start(cfg)
        if starts_from_checkpoint(cfg):   # before the corpus is built: a wrong path fails at once
            check_model_path(cfg)
        if (problem := profile_problem(cfg)) is not None:
            raise ConfigError(problem)
        manifests = resolve_manifests(cfg.data, self.output_root)
        self.train_set = AsrDataset(manifests.train, cfg.data, split="train")
        # dev (+ held-out voices, + each held-out condition)
        self.eval_sets = evaluation_sets(manifests, cfg.data, self.output_root)
        self.dev_set = self.eval_sets["dev"]
        # model.dtype=bfloat16 trains as RL does: fp32 weights and optimizer, bf16 compute.
        weights_dtype, self.bf16_compute = trained_precision(cfg.model.dtype)
        if starts_from_checkpoint(cfg):   # fine-tune a checkpoint, tokenizer included
            self.model, self.processor = load_model(cfg.model.path, weights_dtype)
        else:
            utts = self.train_set.utterances
            self.model, self.processor = fresh_model(cfg.model, [u.text for u in utts], seed=cfg.sft.seed,
                                                     languages=[u.language for u in utts])
        self.model.to(getattr(torch, weights_dtype))
        self.tokenizer = self.processor.tokenizer
        # model.lora: adapters wrapped into the model in place, everything else frozen.
        self.lora = apply_lora(self.model, cfg.model.lora)
        self.model.train()
        set_frontend_memory_format(self.model, torch.channels_last)
        # LoRA froze every base weight, the encoder's included; otherwise the profile decides.
        self.counts = (parameter_counts(self.model) if self.lora is not None
                       else set_audio_encoder_frozen(self.model, not cfg.sft.train_audio_encoder))
        self.eos_id = self.tokenizer.eos_token_id
        needs_ctc = cfg.sft.ctc_weight > 0 or cfg.sft.ctc_warmup_steps > 0
        frame_dim = self.model.config.audio_config.output_dim   # the adapter's output: the LM's width
        self.ctc = CTCHead(frame_dim, len(self.tokenizer)) if needs_ctc else None
        self.params = [p for p in self.model.parameters() if p.requires_grad] + (
            list(self.ctc.parameters()) if self.ctc else [])
        self.optimizer = torch.optim.AdamW(self.params, lr=cfg.sft.lr, weight_decay=cfg.sft.weight_decay)
        self.scheduler = get_cosine_with_min_lr_schedule_with_warmup(
            self.optimizer, num_warmup_steps=cfg.sft.warmup_steps, num_training_steps=cfg.sft.max_steps,
            min_lr_rate=cfg.sft.min_lr_ratio)
        self._audio_cache: dict[int, dict] = {}
        self.token_rng = torch.Generator().manual_seed(cfg.sft.seed)
        self.augment_rng = torch.Generator().manual_seed(cfg.sft.seed + 1)
        self.wave_rng = np.random.default_rng([cfg.sft.seed, 2])
        self.conditions = train_conditions(cfg.data, used_conditions(cfg.sft.wave_augment))
        log.info("model parameters: %s", self.counts)

    def _item(self, i: int) -> dict | None:
        # Audio is decoded once and kept: the corpus is small and epochs repeat it. None:
        # its audio failed to load under data.on_bad_audio=skip (counted in data/skipped).
        if i not in self._audio_cache:
            self._audio_cache[i] = self.train_set.load(i)
        return self._audio_cache[i]

    # ---- one step ------------------------------------------------------------------------
    def _conditions_at(self, step: int) -> dict:
        """The acoustic conditions step `step` may draw: none before sft.conditions_from_step."""
        return self.conditions if step >= self.cfg.sft.conditions_from_step else {}

    def _loss(self, items: list[dict], ctc_only: bool = False,
              step: int | None = None) -> tuple[torch.Tensor, dict[str, float]]:
        conditions = self.conditions if step is None else self._conditions_at(step)
        audios = perturb_batch([it["audio"] for it in items], self.cfg.sft.wave_augment, self.wave_rng,
                               conditions, self.cfg.data.sample_rate)
        batch = encode_supervised(self.processor, audios,
                                  [it["language"] for it in items], [it["text"] for it in items])
        # the model's compute only: the processor's feature extraction stays fp32 (numpy)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.bf16_compute):
            return self._model_loss(batch, ctc_only)

    def _model_loss(self, batch: dict, ctc_only: bool) -> tuple[torch.Tensor, dict[str, float]]:
        model = self.model
        features = spec_augment(batch["input_features"], batch["input_features_mask"],
                                self.cfg.sft.spec_augment, self.augment_rng)
        frames = model.get_audio_features(features, batch["input_features_mask"],
                                          return_dict=True).pooler_output
        audio_mask = batch["input_ids"] == model.config.audio_token_id
        ctc = (self.ctc.loss(frames, audio_mask.sum(dim=1), batch["labels"], self.eos_id)
               if ctc_only or self.cfg.sft.ctc_weight > 0 else None)
        if ctc_only:
            return ctc, {"loss/ctc": ctc.item(), "loss/total": ctc.item()}
        embeds = model.get_input_embeddings()(corrupt_transcript_inputs(
            batch["input_ids"], batch["labels"], self.cfg.sft.input_token_dropout, self.token_rng))
        embeds = embeds.masked_scatter(audio_mask.unsqueeze(-1), frames.to(embeds.dtype))
        out = model(inputs_embeds=embeds, attention_mask=batch["attention_mask"], labels=batch["labels"])
        metrics = {"loss/lm": out.loss.item()}
        loss = out.loss
        if ctc is not None:
            loss = loss + self.cfg.sft.ctc_weight * ctc
            metrics["loss/ctc"] = ctc.item()
        metrics["loss/total"] = loss.item()
        return loss, metrics

    # ---- train ---------------------------------------------------------------------------
    def train(self, tracker: MlflowRun) -> dict[str, float]:
        cfg = self.cfg.sft
        rng = np.random.default_rng(cfg.seed)
        durations = [u.duration for u in self.train_set.utterances]
        deadline = time.monotonic() + cfg.max_minutes * 60
        start = time.monotonic()
        step, epoch = 0, 0
        bar = tqdm(total=cfg.max_steps, desc="sft", dynamic_ncols=True)
        last_eval: dict[str, float] = {}
        while step < cfg.max_steps and time.monotonic() < deadline:
            for idx in length_grouped_batches(durations, cfg.batch_size, cfg.max_batch_seconds, rng,
                                              shortest_first=epoch == 0 and cfg.shortest_first_epoch):
                items = [it for it in map(self._item, idx) if it is not None]
                if not items:
                    continue
                loss, metrics = self._loss(items, ctc_only=step < cfg.ctc_warmup_steps, step=step)
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                grad_norm = torch.nn.utils.clip_grad_norm_(self.params, cfg.grad_clip)
                self.optimizer.step()
                self.scheduler.step()
                step += 1
                skipped = skipped_lines([self.train_set, *self.eval_sets.values()])
                metrics.update({"charts/lr": self.scheduler.get_last_lr()[0], "charts/epoch": epoch,
                                "data/skipped": float(skipped),
                                "charts/grad_norm": float(grad_norm),
                                "perf/steps_per_s": step / (time.monotonic() - start)})
                tracker.log_metrics(metrics, step=step)
                bar.update(1)
                # dev CER appears once evaluated (sft.eval_every_steps), then holds its last value
                bar.set_postfix(loss=f"{metrics['loss/total']:.3f}",
                                **({"dev_cer": f"{last_eval['cer']:.3f}"} if "cer" in last_eval else {}))
                if cfg.eval_every_steps and step % cfg.eval_every_steps == 0:
                    last_eval = self.evaluate(max_utterances=cfg.eval_max_utterances)
                    tracker.log_metrics({f"eval/{k}": v for k, v in last_eval.items()}, step=step)
                if step >= cfg.max_steps or time.monotonic() >= deadline:
                    break
            epoch += 1
        bar.close()
        if 0 < step <= cfg.ctc_warmup_steps:   # sft.max_minutes ended it: nothing would train the LM
            raise ConfigError(f"SFT stopped at step {step} of its {cfg.ctc_warmup_steps}-step CTC warm-up "
                              f"(sft.max_minutes={cfg.max_minutes:g}): the language model never trained and "
                              f"no checkpoint was saved; raise sft.max_minutes or lower sft.ctc_warmup_steps")
        self.steps_done = step
        self.train_seconds = time.monotonic() - start
        return {"steps": step, "train_seconds": self.train_seconds}

    def evaluate(self, max_utterances: int | None = None) -> dict[str, float]:
        """CER/WER of dev and, under `heldout_voices/`, of the held-out-voice split when
        there is one; each set's transcripts are kept for `save`."""
        self.last_eval_rows: dict[str, list[dict]] = {}

        def score(name: str, dataset: AsrDataset) -> dict[str, float]:
            metrics, self.last_eval_rows[name] = evaluate_dataset(
                self.model, self.processor, dataset, max_utterances=max_utterances,
                batch_size=self.cfg.sft.eval_batch_size, max_new_tokens=self.cfg.sft.max_new_tokens)
            return metrics

        return metrics_of_sets(score, self.eval_sets)

    # ---- save ----------------------------------------------------------------------------
    def save(self, dev_metrics: dict[str, float]) -> Path:
        meta = {"stage": "sft", "steps": self.steps_done, "train_seconds": round(self.train_seconds, 1),
                "dev": dev_metrics, **self.counts.as_dict()}
        # RL warns when its training manifest is no longer this one (e.g. a new corpus).
        meta["train_manifest_sha256"] = manifest_digest(self.train_set.manifest_path)
        set_frontend_memory_format(self.model, torch.contiguous_format)
        # With LoRA: the merged weights (RL and from_pretrained load them) and the adapter.
        path = save_model_checkpoint(self.model, self.processor, self.cfg.sft.output_dir, meta, peft_model=self.lora)
        for name, rows in self.last_eval_rows.items():   # dev_transcripts.jsonl, ...
            (path / f"{name.replace('/', '_')}_transcripts.jsonl").write_text(
                "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
        return path


def run_sft(cfg: RunConfig | DictConfig) -> dict:
    """Full SFT stage; returns the summary (dev metrics, timings, checkpoint path)."""
    recipe = SFTRecipe(cfg)
    t0 = time.monotonic()
    recipe.setup()   # data and model checked before the MLflow run opens: a bad input leaves no FAILED run
    with MlflowRun(cfg.logger, run_name=f"sft-{cfg.sft.profile}", config=cfg,
                   tags={"stage": "sft", "sft_profile": str(cfg.sft.profile)}) as tracker:
        tracker.log_metrics({k: float(v) for k, v in recipe.counts.as_dict().items()}, step=0)
        before = {}
        if str(cfg.sft.profile) == "finetune":   # what the start already reads, to compare with
            before = recipe.evaluate()
            tracker.log_metrics({f"eval/{k}": v for k, v in before.items()}, step=0)
        timings = recipe.train(tracker)
        dev = recipe.evaluate()
        tracker.log_metrics({f"eval/{k}": v for k, v in dev.items()}, step=recipe.steps_done)
        path = recipe.save(dev)
        summary = {"checkpoint": str(path), "profile": str(cfg.sft.profile), "dev": dev,
                   **({"dev_before": before} if before else {}), **timings, **recipe.counts.as_dict(),
                   "total_seconds": time.monotonic() - t0, "mlflow_run_id": tracker.run_id}
        tracker.log_summary(summary)
    return summary
