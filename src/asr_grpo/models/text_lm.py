"""A tiny text LM over the ASR tokenizer, used as the `lm` smoothness (fluency) scorer.

`Qwen3ForCausalLM` with a few hundred K parameters, trained at set-up on the TRAIN
split's transcripts (recipes/text_lm_training.py: a few hundred AdamW steps, well under a
minute on CPU) and cached as a normal HF folder (recipes/text_lm_cache.py). It shares the
ASR model's tokenizer, so the ASR model's response token ids are scored as they are, with
no decode / re-encode.

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
reference_nll, a high quantile of the per-sentence mean NLL on held-out train
sentences (in `config.fluency_reference_nll` and the checkpoint metadata): with it, a
transcript as predictable as a typical corpus sentence scores 1 and one whose
perplexity is k times higher scores ~1/k. Like the rule scorer, it then scores
degeneration (loops, word salad, broken character sequences), not accuracy.

Everything here is plain torch / transformers (no Ray): roles wrap it.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from asr_grpo.data.languages import LANGUAGE_NAMES
from asr_grpo.models.checkpoint import (
    checkpoint_metadata,
    is_complete_checkpoint,
    save_hf_checkpoint,
)
from asr_grpo.models.tokenizer import ASR_TEXT, IM_END, IM_START, PAD_TOKEN

START_TOKEN = IM_START
MAX_POSITIONS = 1024          # RoPE positions: responses (<= max_new_tokens) + context


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


def pad_right(rows: Sequence[Sequence[int]], pad_id: int) -> torch.Tensor:
    """Token rows as one [B, longest] tensor, padded on the right with `pad_id`."""
    longest = max(len(r) for r in rows)
    out = torch.full((len(rows), longest), pad_id, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, :len(r)] = torch.as_tensor(list(r), dtype=torch.long)
    return out


def next_token_logprobs(model, input_ids: torch.Tensor) -> torch.Tensor:
    """[B, L-1]: log p(input_ids[:, t+1] | input_ids[:, :t+1]).

    No attention mask: rows are right-padded and attention is causal, so a real token
    never sees padding, and a row scores exactly as it would alone (same positions,
    same attention path); values at padded positions are garbage and never read.
    """
    logits = model(input_ids=input_ids, use_cache=False).logits[:, :-1].float()
    return torch.log_softmax(logits, dim=-1).gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)


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
        lp = next_token_logprobs(model, pad_right([rows[i] for i in idx], pad_id).to(device)).cpu()
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
