"""Packing prompt + response token sequences (with their audio) into model batches, and
scoring them: response log-probs (actor, reference) share this one forward path.

Layout (as in OpenRLHF): prompts left-padded to P, responses right-padded to T, so
response token j of every row sits at column P + j and is predicted by column P + j - 1.
Position ids come from the attention mask, so padding never shifts positions.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from asr_grpo.algorithms import logprobs_from_logits
from asr_grpo.models.hf_compat import checkpointing_enabled, output_cache, with_cache

# The encoder processes audio in chunks of 2 * n_window = 100 mel frames.
FEATURE_CHUNK = 100


@dataclass
class AudioFeatures:
    """Log-mel features of one utterance as the feature extractor gave them alone."""
    features: torch.Tensor   # [128, F], F a multiple of FEATURE_CHUNK
    mask: torch.Tensor       # [F] (1 = real frame)


def distinct(keys: Sequence) -> tuple[list[int], list[int]]:
    """The first position of each distinct key, and each position's index among them."""
    slot: dict = {}
    first, index = [], []
    for i, key in enumerate(keys):
        if key not in slot:
            slot[key] = len(first)
            first.append(i)
        index.append(slot[key])
    return first, index


def encode_prompt(processor, audio: np.ndarray, language: str | None,
                  context: str | None = None) -> tuple[list[int], AudioFeatures]:
    """Prompt token ids (audio placeholders expanded) and the utterance's own features."""
    from asr_grpo.models.prompting import transcription_prompts

    prompt = transcription_prompts(processor, 1, [language] if language else None,
                                   [context] if context else None)
    out = processor(text=prompt, audio=[audio])
    feats = AudioFeatures(out["input_features"][0], out["input_features_mask"][0].long())
    return out["input_ids"][0].tolist(), feats


def stack_features(feats: Sequence[AudioFeatures]) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad with whole zero chunks: a chunk with no real frame is dropped by the encoder,
    so each utterance encodes exactly as it does alone."""
    longest = max(f.features.shape[1] for f in feats)
    longest = -(-longest // FEATURE_CHUNK) * FEATURE_CHUNK
    x = torch.zeros(len(feats), feats[0].features.shape[0], longest, dtype=feats[0].features.dtype)
    m = torch.zeros(len(feats), longest, dtype=torch.long)
    for i, f in enumerate(feats):
        x[i, :, :f.features.shape[1]] = f.features
        m[i, :f.mask.shape[0]] = f.mask
    return x, m


def on_model_device(model, inputs: dict) -> dict:
    """`inputs` moved to where `model`'s weights are (a GPU under DeepSpeed; a no-op on
    CPU), floating-point ones (the audio features) cast to the weights' dtype (a bf16
    model's convolutions refuse fp32 features). Batches are built on the CPU; outputs
    stay on the model's device, and what the callers bring back is small (per-token
    log-probs or values, sampled token ids), never full-vocabulary logits."""
    first = next(model.parameters())
    device = getattr(model, "device", None)
    if not isinstance(device, torch.device):
        device = first.device
    dtype = first.dtype if first.is_floating_point() else None
    return {k: (v.to(device, dtype) if dtype is not None and v.is_floating_point() else v.to(device))
            if torch.is_tensor(v) else v for k, v in inputs.items()}


def positions_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    return (attention_mask.cumsum(dim=1) - 1).clamp(min=0)


@dataclass
class SequenceBatch:
    input_ids: torch.Tensor          # [B, P + T]
    attention_mask: torch.Tensor     # [B, P + T]
    position_ids: torch.Tensor       # [B, P + T]
    input_features: torch.Tensor     # [B, 128, F]
    input_features_mask: torch.Tensor
    response_ids: torch.Tensor       # [B, T]
    response_mask: torch.Tensor      # [B, T] float
    prompt_width: int                # P
    audio_rows: tuple[list[int], list[int]] | None = None   # `distinct` over the rows' features objects
    prompt_rows: tuple[list[int], list[int]] | None = None  # `distinct` over (features object, prompt tokens)

    def model_inputs(self) -> dict:
        return {"input_ids": self.input_ids, "attention_mask": self.attention_mask,
                "position_ids": self.position_ids, "input_features": self.input_features,
                "input_features_mask": self.input_features_mask}

    def shared_audio_inputs(self, model) -> dict:
        """`model_inputs` with each distinct utterance encoded once: the samples of a GRPO
        group share one features object, so the audio encoder and adapter run once per
        group and every row takes its copy by index (gradients sum over the copies, as
        over separate encodings). `model` is the HF audio LM (or its backbone) whose
        forward the result feeds. As `model_inputs` where every row has its own audio or
        the model has no separate audio encoder."""
        first, index = self.audio_rows or ([], [])
        audio_id = getattr(getattr(model, "config", None), "audio_token_id", None)
        if len(first) == len(index) or audio_id is None or not hasattr(model, "get_audio_features"):
            return self.model_inputs()
        moved = on_model_device(model, {"input_ids": self.input_ids,
                                        "input_features": self.input_features[first],
                                        "input_features_mask": self.input_features_mask[first]})
        audio = model.get_audio_features(moved["input_features"], moved["input_features_mask"],
                                         return_dict=True).pooler_output   # [tokens of all distinct rows, D]
        placeholders = moved["input_ids"] == audio_id
        pieces = torch.split(audio, placeholders[first].sum(dim=1).tolist())
        embeds = model.get_input_embeddings()(moved["input_ids"])
        embeds = embeds.masked_scatter(placeholders.unsqueeze(-1).expand_as(embeds),
                                       torch.cat([pieces[u] for u in index]).to(embeds.dtype))
        return {"inputs_embeds": embeds, "attention_mask": self.attention_mask,
                "position_ids": self.position_ids}


def pack_sequences(prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]],
                   features: Sequence[AudioFeatures], pad_id: int) -> SequenceBatch:
    P = max(len(p) for p in prompts)
    T = max(1, max(len(r) for r in responses))
    B = len(prompts)
    ids = torch.full((B, P + T), pad_id, dtype=torch.long)
    mask = torch.zeros((B, P + T), dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        ids[i, P - len(p):P] = torch.as_tensor(list(p), dtype=torch.long)
        mask[i, P - len(p):P] = 1
        if len(r):
            ids[i, P:P + len(r)] = torch.as_tensor(list(r), dtype=torch.long)
            mask[i, P:P + len(r)] = 1
    feats, feat_mask = stack_features(features)
    return SequenceBatch(ids, mask, positions_from_mask(mask), feats, feat_mask,
                         ids[:, P:].clone(), mask[:, P:].float(), P, distinct([id(f) for f in features]),
                         distinct([(id(f), tuple(p)) for f, p in zip(features, prompts)]))


def response_logits(model, batch: SequenceBatch, share_audio: bool = True,
                    share_prompt: bool = True) -> torch.Tensor:
    """Logits [B, T, V] that predict each response token, on the model's device (with
    grad when it is on): only the response positions go through the LM head
    (`logits_to_keep`), so no prompt position is projected onto the vocabulary;
    (`share_audio`) each distinct utterance of the batch is encoded once, and
    (`share_prompt`) each distinct prompt is run through the LM once, its KV cache
    copied to the rows that share it (`_shared_prompt_logits`)."""
    if share_prompt and _shares_prompts(model, batch):
        return _shared_prompt_logits(model, batch)
    P, T = batch.prompt_width, batch.response_ids.shape[1]
    inputs = batch.shared_audio_inputs(hf_module(model)) if share_audio else batch.model_inputs()
    out = model(**on_model_device(model, {**inputs, "logits_to_keep": torch.arange(P - 1, P + T - 1)}),
                use_cache=False)
    return out.logits


def _shares_prompts(model, batch: SequenceBatch) -> bool:
    """Whether some rows share a prompt and the model can carry a KV cache through a
    training forward (transformers drops the cache under gradient checkpointing)."""
    first, index = batch.prompt_rows or ([], [])
    hf = hf_module(model)
    return (len(first) < len(index) and hasattr(hf, "get_audio_features")
            and not checkpointing_enabled(hf))


def _shared_prompt_logits(model, batch: SequenceBatch) -> torch.Tensor:
    """`response_logits` with each distinct prompt run once: the n samples of a GRPO group
    share their audio prompt (~4x their response in tokens), so the LM's forward and
    backward cost P + n * T tokens per group instead of n * (P + T). The prompt pass keeps
    its last position's logits (they predict response token 0) and its KV cache; the cache
    is copied to every row by index, differentiably, so the gradients of the copies sum
    into the one prompt pass, as they would over separate rows. The response pass then
    predicts tokens 1 .. T-1. Equal to the whole-row forward up to float rounding."""
    first, index = batch.prompt_rows
    P, T = batch.prompt_width, batch.response_ids.shape[1]
    prompt = {"input_ids": batch.input_ids[first, :P], "attention_mask": batch.attention_mask[first, :P],
              "position_ids": batch.position_ids[first, :P], "input_features": batch.input_features[first],
              "input_features_mask": batch.input_features_mask[first]}
    out = model(**on_model_device(model, {**prompt, "logits_to_keep": 1}), use_cache=True)
    rows = torch.as_tensor(index, dtype=torch.long, device=out.logits.device)
    head = out.logits[:, -1:][rows]   # [B, 1, V]: left padding puts every prompt's last token at column P - 1
    if T == 1:
        return head
    cache = output_cache(out)
    cache.batch_select_indices(rows)
    rest = {"input_ids": batch.input_ids[:, P:P + T - 1],
            "attention_mask": batch.attention_mask[:, :P + T - 1],
            "position_ids": batch.position_ids[:, P:P + T - 1]}
    out = model(**with_cache(on_model_device(model, rest), cache), use_cache=True)
    return torch.cat([head, out.logits], dim=1)


def hf_module(model):
    """The HF model a DeepSpeed engine wraps (the model itself when it is not wrapped)."""
    return getattr(model, "module", model)


def response_logprobs(model, batch: SequenceBatch, temperature: float = 1.0) -> torch.Tensor:
    """log pi(response token | prefix) [B, T] at the sampling temperature; 0 on padding.
    Computed on the model's device; only the [B, T] log-probs come back to the CPU."""
    logits = response_logits(model, batch)
    if temperature not in (0.0, 1.0):
        logits = logits.float() / temperature   # bf16 logits: scale in fp32, as the sampler does
    return logprobs_from_logits(logits, batch.response_ids.to(logits.device)).cpu() * batch.response_mask
