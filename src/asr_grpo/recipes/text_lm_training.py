"""Training the text LM reward model (models/text_lm.py) on the corpus transcripts: a few
hundred AdamW steps with warm-up and cosine decay, then the fluency calibration on held-out
sentences (`reference_nll`, the FLUENCY_QUANTILE quantile of their per-sentence mean NLL)."""
from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from transformers import Qwen3ForCausalLM

from asr_grpo.models.text_lm import (
    TextLMSettings,
    build_text_lm,
    encode_training_sequence,
    language_context_ids,
    next_token_logprobs,
    pad_right,
    response_ids,
    response_token_logprobs,
    start_token_id,
)

log = logging.getLogger(__name__)

FLUENCY_QUANTILE = 0.9        # reference_nll: this quantile of held-out sentence NLLs
HOLDOUT_FRACTION = 0.05       # train sentences kept out of training for calibration
MAX_HOLDOUT = 200
MIN_TEXTS_FOR_HOLDOUT = 40    # below this every text trains and calibration reuses them
MAX_TRAIN_TOKENS = 192        # longer training sequences are cut (the corpus' are < 100)
WARMUP_FRACTION = 0.05
MIN_LR_RATIO = 0.1


@dataclass
class TextLMTrainResult:
    model: Qwen3ForCausalLM
    losses: list[float]               # training loss (mean token NLL) per step
    reference_nll: float              # calibration for fluency_from_logprobs
    heldout_nll: float                # mean token NLL on the held-out sentences
    num_train_texts: int
    num_heldout_texts: int
    seconds: float

    def metadata(self) -> dict[str, Any]:
        first = float(np.mean(self.losses[:10])) if self.losses else float("nan")
        last = float(np.mean(self.losses[-10:])) if self.losses else float("nan")
        return {"reference_nll": self.reference_nll, "heldout_nll": self.heldout_nll,
                "heldout_ppl": math.exp(self.heldout_nll), "loss_first10": first,
                "loss_last10": last, "num_train_texts": self.num_train_texts,
                "num_heldout_texts": self.num_heldout_texts, "train_seconds": self.seconds,
                "parameters": sum(p.numel() for p in self.model.parameters())}


def _lr_at(step: int, settings: TextLMSettings) -> float:
    warmup = max(1, int(WARMUP_FRACTION * settings.steps))
    if step < warmup:
        return settings.lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, settings.steps - warmup)
    cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return settings.lr * (MIN_LR_RATIO + (1 - MIN_LR_RATIO) * cosine)


def _split_holdout(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    order = np.random.default_rng([seed, 1]).permutation(n)
    if n < MIN_TEXTS_FOR_HOLDOUT:
        return order, order
    k = min(MAX_HOLDOUT, max(1, round(HOLDOUT_FRACTION * n)))
    return order[k:], order[:k]


def train_text_lm(tokenizer, texts: Sequence[str], languages: Sequence[str],
                  settings: TextLMSettings = TextLMSettings(), log_every: int = 0,
                  num_threads: int | None = 1) -> TextLMTrainResult:
    """Train the LM on (text, language) pairs; deterministic given settings.seed (CPU).

    A HOLDOUT_FRACTION slice of the texts is kept out of training to calibrate
    `reference_nll` (all texts are used for both when fewer than MIN_TEXTS_FOR_HOLDOUT).
    Runs on CPU with `num_threads` torch threads (restored afterwards; None: leave the
    process' setting): the matrices are so small that one thread is fastest, and on a
    busy 2-core host several threads were 6-9x slower (spinning on each other).
    """
    saved_threads = torch.get_num_threads()
    if num_threads is not None:
        torch.set_num_threads(num_threads)
    try:
        return _train(tokenizer, texts, languages, settings, log_every)
    finally:
        torch.set_num_threads(saved_threads)


def _train(tokenizer, texts: Sequence[str], languages: Sequence[str],
           settings: TextLMSettings, log_every: int) -> TextLMTrainResult:
    if len(texts) != len(languages):
        raise ValueError(f"{len(texts)} texts but {len(languages)} languages")
    if not texts:
        raise ValueError("no texts to train the text LM on")
    t0 = time.monotonic()
    seqs = [encode_training_sequence(tokenizer, t, lang)[:MAX_TRAIN_TOKENS]
            for t, lang in zip(texts, languages)]
    train_idx, held_idx = _split_holdout(len(seqs), settings.seed)
    model = build_text_lm(tokenizer, settings)
    model.train()
    pad_id = model.config.pad_token_id
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "norm" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and "norm" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": settings.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=settings.lr, betas=(0.9, 0.98), eps=1e-8)
    rng = np.random.default_rng([settings.seed, 2])
    order, pos = rng.permutation(train_idx), 0
    losses: list[float] = []
    for step in range(settings.steps):
        batch = []
        while len(batch) < settings.batch_size:
            if pos == len(order):
                order, pos = rng.permutation(train_idx), 0
            batch.append(seqs[order[pos]])
            pos += 1
        ids = pad_right(batch, pad_id)
        lengths = torch.tensor([len(s) for s in batch])
        # Targets are tokens 1..len-1 of each row (everything after the start token).
        valid = torch.arange(ids.shape[1] - 1).unsqueeze(0) < (lengths - 1).unsqueeze(1)
        for group in opt.param_groups:
            group["lr"] = _lr_at(step, settings)
        loss = -(next_token_logprobs(model, ids) * valid).sum() / valid.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), settings.grad_clip)
        opt.step()
        losses.append(loss.item())
        if log_every and (step % log_every == 0 or step == settings.steps - 1):
            log.info("text LM step %d/%d loss %.3f", step + 1, settings.steps, losses[-1])
    model.eval()

    # Calibration on the held-out sentences, scored as the RL case is: tag as context.
    held_resp = [response_ids(tokenizer, texts[i]) for i in held_idx]
    held_ctx = [language_context_ids(tokenizer, languages[i]) for i in held_idx]
    lps = response_token_logprobs(model, held_resp, start_token_id(tokenizer), held_ctx)
    sentence_nll = np.array([-float(lp.mean()) for lp in lps])
    reference_nll = float(np.quantile(sentence_nll, FLUENCY_QUANTILE))
    heldout_nll = -float(torch.cat(lps).mean())
    model.config.fluency_reference_nll = reference_nll
    return TextLMTrainResult(model=model, losses=losses, reference_nll=reference_nll,
                             heldout_nll=heldout_nll, num_train_texts=len(train_idx),
                             num_heldout_texts=len(held_idx), seconds=time.monotonic() - t0)
