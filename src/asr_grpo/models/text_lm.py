"""A tiny text LM over the ASR tokenizer, used as the `lm` smoothness (fluency) scorer.

`Qwen3ForCausalLM` with a few hundred K parameters, trained at set-up on the TRAIN
split's transcripts (a few hundred AdamW steps, well under a minute on CPU) and cached
as a normal HF folder. It shares the ASR model's tokenizer, so the ASR model's response
token ids are scored as they are, with no decode / re-encode.

Sequence format. The ASR model's response is `language <Name><asr_text><transcript>`
then EOS (`<|im_end|>`); the RL prompts prefill the `language <Name><asr_text>` part,
so a rollout's response ids are the bare transcript + EOS. The LM is trained on

    <|im_start|> language <Name><asr_text> <transcript> <|im_end|>

(loss on every token after the start token) and so can score either form:

- a bare response (forced language, the RL case): context = the language tag
  (`language_context_ids`), scored = the response ids;
- a full response that declares its own language: no context, scored = all of it.

The start token is fixed (`<|im_start|>`, kept in `config.bos_token_id`); context
tokens condition the scores but are not scored.

Fluency. `fluency_from_logprobs` = exp(-max(0, mean_nll - reference_nll)), mean_nll
the per-token negative log-likelihood of the scored tokens. With reference_nll = 0
this is plain inverse perplexity (the geometric-mean token probability: length
independent, 1 only for a text the LM is certain of). Training records a calibrated
reference_nll, the FLUENCY_QUANTILE quantile of the per-sentence mean NLL on held-out
train sentences (in `config.fluency_reference_nll` and the checkpoint metadata): with
it, a transcript as predictable as a typical corpus sentence scores 1 and one whose
perplexity is k times higher scores ~1/k. Like the rule scorer, it then scores
degeneration (loops, word salad, broken character sequences), not accuracy.

Everything here is plain torch / transformers (no Ray): roles wrap it.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import math
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from asr_grpo.data.languages import LANGUAGE_NAMES
from asr_grpo.models.checkpoint import (
    checkpoint_metadata,
    is_complete_checkpoint,
    save_hf_checkpoint,
)
from asr_grpo.models.tokenizer import ASR_TEXT, IM_END, IM_START, PAD_TOKEN

log = logging.getLogger(__name__)

# Bump when the sequence format or the training recipe changes: cached LMs rebuild.
TEXT_LM_FORMAT_VERSION = 1
START_TOKEN = IM_START
FLUENCY_QUANTILE = 0.9        # reference_nll: this quantile of held-out sentence NLLs
HOLDOUT_FRACTION = 0.05       # train sentences kept out of training for calibration
MAX_HOLDOUT = 200
MIN_TEXTS_FOR_HOLDOUT = 40    # below this every text trains and calibration reuses them
MAX_TRAIN_TOKENS = 192        # longer training sequences are cut (the corpus' are < 100)
MAX_POSITIONS = 1024          # RoPE positions: responses (<= max_new_tokens) + context
WARMUP_FRACTION = 0.05
MIN_LR_RATIO = 0.1


@dataclass(frozen=True)
class TextLMSettings:
    """Architecture + training recipe (mirrors the `reward.text_lm_*` config fields)."""
    hidden: int = 96
    layers: int = 2
    heads: int = 2
    intermediate: int = 256
    steps: int = 300
    batch_size: int = 32
    lr: float = 3e-3
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    seed: int = 0


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


# --------------------------------------------------------------------------- format

def start_token_id(tokenizer) -> int:
    return int(tokenizer.convert_tokens_to_ids(START_TOKEN))


def language_context_ids(tokenizer, language: str) -> list[int]:
    """Ids of `language <Name><asr_text>` for a code ("en", "de", ...) or a name
    ("English"): the context to put before a bare (language-forced) response."""
    name = LANGUAGE_NAMES.get(language, language)
    if name not in LANGUAGE_NAMES.values():
        raise ValueError(f"unknown language {language!r}; known: {sorted(LANGUAGE_NAMES)} "
                         f"or {sorted(LANGUAGE_NAMES.values())}")
    return list(tokenizer.encode(f"language {name}{ASR_TEXT}", add_special_tokens=False))


def response_ids(tokenizer, text: str) -> list[int]:
    """Transcript + EOS, as the ASR model emits it after a prefilled language tag."""
    return list(tokenizer.encode(text, add_special_tokens=False)) + [
        int(tokenizer.convert_tokens_to_ids(IM_END))]


def encode_training_sequence(tokenizer, text: str, language: str) -> list[int]:
    """`<|im_start|> language <Name><asr_text> text <|im_end|>` as token ids."""
    return [start_token_id(tokenizer), *language_context_ids(tokenizer, language),
            *response_ids(tokenizer, text)]


# --------------------------------------------------------------------------- model

def build_text_lm(tokenizer, settings: TextLMSettings = TextLMSettings()) -> Qwen3ForCausalLM:
    """An untrained tiny Qwen3 LM over `tokenizer`'s vocabulary (seeded init)."""
    if settings.hidden % settings.heads:
        raise ValueError(f"text LM hidden={settings.hidden} is not divisible by "
                         f"heads={settings.heads}")
    ids = tokenizer.convert_tokens_to_ids
    config = Qwen3Config(
        vocab_size=len(tokenizer), hidden_size=settings.hidden,
        intermediate_size=settings.intermediate, num_hidden_layers=settings.layers,
        num_attention_heads=settings.heads, num_key_value_heads=settings.heads,
        head_dim=settings.hidden // settings.heads, max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=True, pad_token_id=ids(PAD_TOKEN), eos_token_id=ids(IM_END),
        bos_token_id=start_token_id(tokenizer))
    torch.manual_seed(settings.seed)
    return Qwen3ForCausalLM(config)


def _pad_right(rows: Sequence[Sequence[int]], pad_id: int) -> torch.Tensor:
    longest = max(len(r) for r in rows)
    out = torch.full((len(rows), longest), pad_id, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, :len(r)] = torch.as_tensor(list(r), dtype=torch.long)
    return out


def _token_logprobs(model, input_ids: torch.Tensor) -> torch.Tensor:
    """[B, L-1]: log p(input_ids[:, t+1] | input_ids[:, :t+1]).

    No attention mask: rows are right-padded and attention is causal, so a real token
    never sees padding, and a row scores exactly as it would alone (same positions,
    same attention path); values at padded positions are garbage and never read.
    """
    logits = model(input_ids=input_ids, use_cache=False).logits[:, :-1].float()
    return torch.log_softmax(logits, dim=-1).gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)


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
        ids = _pad_right(batch, pad_id)
        lengths = torch.tensor([len(s) for s in batch])
        # Targets are tokens 1..len-1 of each row (everything after the start token).
        valid = torch.arange(ids.shape[1] - 1).unsqueeze(0) < (lengths - 1).unsqueeze(1)
        for group in opt.param_groups:
            group["lr"] = _lr_at(step, settings)
        loss = -(_token_logprobs(model, ids) * valid).sum() / valid.sum()
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


def save_text_lm(model: Qwen3ForCausalLM, tokenizer, path: str | Path,
                 metadata: dict[str, Any] | None = None) -> Path:
    """Atomic HF folder (model + tokenizer + `checkpoint_complete.json` metadata)."""
    return save_hf_checkpoint(model, tokenizer, path, metadata)


def load_text_lm(path: str | Path, device: str | torch.device = "cpu") -> Qwen3ForCausalLM:
    """The saved LM in eval mode; `config.bos_token_id` is the start token id and
    `config.fluency_reference_nll` the calibration for `fluency_from_logprobs`."""
    if not is_complete_checkpoint(path):
        raise FileNotFoundError(f"{path} is not a complete text LM checkpoint")
    return Qwen3ForCausalLM.from_pretrained(str(path), dtype=torch.float32).to(device).eval()


def text_lm_metadata(path: str | Path) -> dict[str, Any]:
    return checkpoint_metadata(path)


# --------------------------------------------------------------------------- scoring

@torch.no_grad()
def response_token_logprobs(model, responses: Sequence[Sequence[int]], start_id: int,
                            contexts: Sequence[Sequence[int]] | None = None,
                            batch_size: int = 64) -> list[torch.Tensor]:
    """Per-token log-likelihood of each response given `start_id` (+ its context).

    Row i is `[start_id, *contexts[i], *responses[i]]`, right-padded; returns, per
    response, a float32 CPU tensor of len(responses[i]) values
    log p(responses[i][j] | start, context, responses[i][:j]). Context tokens
    condition but are not scored. Batching (and `batch_size`) does not change the
    values beyond float rounding. An empty response gives an empty tensor.
    """
    if contexts is not None and len(contexts) != len(responses):
        raise ValueError(f"{len(contexts)} contexts for {len(responses)} responses")
    ctxs = [list(c) for c in contexts] if contexts is not None else [[] for _ in responses]
    rows = [[int(start_id), *c, *map(int, r)] for c, r in zip(ctxs, responses)]
    device = next(model.parameters()).device
    pad_id = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    out: list[torch.Tensor] = [torch.zeros(0)] * len(rows)
    # Similar lengths together: less padding, and the order never changes a row's values.
    by_len = sorted(range(len(rows)), key=lambda i: len(rows[i]))
    for b in range(0, len(by_len), batch_size):
        idx = by_len[b:b + batch_size]
        lp = _token_logprobs(model, _pad_right([rows[i] for i in idx], pad_id).to(device)).cpu()
        for j, i in enumerate(idx):
            first = len(ctxs[i])            # logit column predicting response token 0
            out[i] = lp[j, first:first + len(responses[i])].clone()
    return out


def fluency_from_logprobs(logprobs: torch.Tensor, reference_nll: float = 0.0) -> float:
    """Smoothness in [0, 1] from a response's token log-likelihoods:
    exp(-max(0, mean NLL - reference_nll)).

    reference_nll = 0: inverse perplexity. With the trained LM's calibration
    (`config.fluency_reference_nll`): 1 for a response at least as predictable as a
    typical corpus sentence, ~1/k for one k times more perplexing. An empty response
    has no evidence of fluency: 0.
    """
    if logprobs.numel() == 0:
        return 0.0
    mean_nll = -float(logprobs.double().mean())
    if not math.isfinite(mean_nll):
        return 0.0
    return math.exp(-max(0.0, mean_nll - reference_nll))


def fluency_scores(model, responses: Sequence[Sequence[int]], start_id: int | None = None,
                   contexts: Sequence[Sequence[int]] | None = None,
                   reference_nll: float | None = None) -> list[float]:
    """One-shot `lm_scores` for the reward: fluency of each response. start_id and
    reference_nll default to the ones stored in the trained model's config."""
    start_id = model.config.bos_token_id if start_id is None else start_id
    if reference_nll is None:
        reference_nll = float(getattr(model.config, "fluency_reference_nll", 0.0))
    return [fluency_from_logprobs(lp, reference_nll)
            for lp in response_token_logprobs(model, responses, start_id, contexts)]


# --------------------------------------------------------------------------- caching

def settings_from_config(reward_cfg) -> TextLMSettings:
    return TextLMSettings(hidden=int(reward_cfg.text_lm_hidden), layers=int(reward_cfg.text_lm_layers),
                          intermediate=int(reward_cfg.text_lm_intermediate),
                          steps=int(reward_cfg.text_lm_steps), batch_size=int(reward_cfg.text_lm_batch_size),
                          lr=float(reward_cfg.text_lm_lr), seed=int(reward_cfg.text_lm_seed))


def _fingerprint(tokenizer, texts: Sequence[str], languages: Sequence[str],
                 settings: TextLMSettings) -> str:
    h = hashlib.sha256()
    h.update(json.dumps({"version": TEXT_LM_FORMAT_VERSION, "settings": asdict(settings)},
                        sort_keys=True).encode())
    h.update(tokenizer.backend_tokenizer.to_str().encode())
    for t, lang in zip(texts, languages):
        h.update(f"{lang}\t{t}\n".encode())
    return h.hexdigest()[:16]


@contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def train_texts(cfg) -> tuple[list[str], list[str]]:
    """(texts, languages) of the training manifest (the corpus is built if missing)."""
    from asr_grpo.data.dataset import resolve_manifests
    from asr_grpo.data.manifest import read_manifest

    manifests = resolve_manifests(cfg.data, cfg.paths.output_root)
    utts = read_manifest(manifests.train, on_bad=cfg.data.on_bad_audio,
                         min_duration_s=cfg.data.min_duration_s,
                         max_duration_s=cfg.data.max_duration_s,
                         default_language=cfg.data.default_language).utterances
    return [u.text for u in utts], [u.language for u in utts]


def ensure_text_lm(cfg, tokenizer=None) -> Path:
    """Path of the trained text LM at `cfg.reward.text_lm_dir`, training it first when
    missing or stale (a different tokenizer, training text or `reward.text_lm_*`
    setting changes the fingerprint stored with it). The tokenizer defaults to the
    ASR model's (`cfg.model.path`, the SFT checkpoint). Safe to call from several
    processes at once (file lock; the save is atomic)."""
    if tokenizer is None:
        if not cfg.model.path:
            raise ValueError("ensure_text_lm needs the ASR tokenizer: pass tokenizer= or set "
                             "model.path to the (SFT) checkpoint folder")
        from asr_grpo.models.builder import load_processor
        tokenizer = load_processor(cfg.model.path).tokenizer
    path = Path(cfg.reward.text_lm_dir)
    settings = settings_from_config(cfg.reward)
    texts, languages = train_texts(cfg)
    fingerprint = _fingerprint(tokenizer, texts, languages, settings)
    with _file_lock(path.with_name(f"{path.name}.lock")):
        if is_complete_checkpoint(path):
            if checkpoint_metadata(path).get("fingerprint") == fingerprint:
                return path
            log.info("text LM at %s is stale (tokenizer, texts or settings changed): rebuilding",
                     path)
        result = train_text_lm(tokenizer, texts, languages, settings, log_every=50)
        meta = {**result.metadata(), "fingerprint": fingerprint, "settings": asdict(settings),
                "format_version": TEXT_LM_FORMAT_VERSION, "start_id": start_token_id(tokenizer)}
        save_text_lm(result.model, tokenizer, path, meta)
        log.info("text LM trained in %.1f s (loss %.3f -> %.3f, held-out ppl %.2f): %s",
                 result.seconds, meta["loss_first10"], meta["loss_last10"],
                 meta["heldout_ppl"], path)
    return path
