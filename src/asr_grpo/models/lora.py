"""LoRA adapters on the speech LLM with PEFT (`model.lora.rank` > 0).

`apply_lora` wraps the LM's projections (optionally the audio encoder's, and the audio
adapter in full) and freezes everything else. The training code keeps working on the
plain `Qwen3ASRForConditionalGeneration` (`peft.get_base_model()`, the same modules with
LoRA layers inside), so nothing downstream learns about PEFT's wrapper; the `PeftModel`
is kept beside it for what only it does: `disable_adapter()` (the reference policy is the
base model, computed with the same weights) and `save_pretrained` (the adapter alone).

Rollout engines and exports need the weights without adapters in them: `merged_tensors`
gives the plain model's tensors under its own names and in its own order, each LoRA
layer's weight with its delta (B A x alpha / rank) added as it is read, without touching
the trained model (merging in place and back would drift the base by rounding).
"""
from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable

import torch

ADAPTER = "default"   # PEFT's name for the one adapter a model gets here
ADAPTER_DIR = "adapter"   # the PEFT adapter folder inside a saved checkpoint
_TWIN = f".modules_to_save.{ADAPTER}."   # a fully trained module's copy (train_audio_adapter)
_ORIGINAL = ".original_module."
AUDIO_ADAPTER = "multi_modal_projector"

ReadFn = Callable[[str, torch.Tensor], torch.Tensor]


def lora_enabled(lora_cfg: Any) -> bool:
    return int(lora_cfg.rank) > 0


def reference_in_policy(cfg: Any) -> bool:
    """Whether the policy ranks compute the reference log-probs themselves, from their
    own weights with the adapters off: LoRA on colocated roles, where a reference role
    would hold a second copy of the base on the same devices. With placement=separate the
    reference keeps workers (and devices) of its own and loads the base from model.path."""
    return lora_enabled(cfg.model.lora) and bool(cfg.placement.colocate) and cfg.algorithm.kl_coef > 0


def reference_role_needed(cfg: Any) -> bool:
    """Whether the run starts reference workers (a KL term the policy does not compute)."""
    return cfg.algorithm.kl_coef > 0 and not reference_in_policy(cfg)


def target_pattern(lora_cfg: Any) -> str:
    """PEFT's `target_modules` as one regular expression (matched against whole module
    paths): the named projections inside the LM's layers, and the encoder's where given.
    Names alone would catch the audio encoder's q/k/v_proj too."""
    scopes = [(r"model\.language_model\.layers", lora_cfg.target_modules),
              (r"model\.audio_tower\.layers", lora_cfg.encoder_target_modules)]
    parts = [rf"{prefix}\.\d+\..*\b(?:{'|'.join(map(re.escape, names))})"
             for prefix, names in scopes if names]
    return "|".join(f"(?:{p})" for p in parts)


def peft_config(lora_cfg: Any):
    from peft import LoraConfig

    return LoraConfig(r=int(lora_cfg.rank), lora_alpha=float(lora_cfg.alpha), lora_dropout=float(lora_cfg.dropout),
                      target_modules=target_pattern(lora_cfg), bias="none",
                      modules_to_save=[AUDIO_ADAPTER] if lora_cfg.train_audio_adapter else None)


def apply_lora(model: torch.nn.Module, lora_cfg: Any):
    """Wrap `model` with LoRA adapters in place; returns the `PeftModel`, or None when
    `model.lora.rank` is 0. Only the adapters (and, with `train_audio_adapter`, the audio
    adapter's copy) are trainable afterwards."""
    if not lora_enabled(lora_cfg):
        return None
    from peft import get_peft_model

    with warnings.catch_warnings():   # PEFT asks transformers through a name it deprecated
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        return get_peft_model(model, peft_config(lora_cfg), adapter_name=ADAPTER)


def is_adapter_tensor(name: str) -> bool:
    """A tensor the adapters add (LoRA matrices, a fully trained module's copy), by its
    name in the wrapped model: the same on every copy wrapped with the same config."""
    return "lora_" in name or _TWIN in name


def adapter_tensors(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """The adapters' tensors of a wrapped model, in module order: what a rollout copy
    wrapped the same way needs to follow the policy."""
    return [(name, p) for name, p in model.named_parameters() if is_adapter_tensor(name)]


def plain_name(name: str) -> str:
    """A wrapped model's name for a base tensor -> the plain model's name for it."""
    return name.replace(".base_layer.", ".").replace(_ORIGINAL, ".")


def _lora_layers(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """Wrapped name of each LoRA layer's base weight -> the layer."""
    from peft.tuners.lora import LoraLayer

    return {f"{path}.base_layer.weight": m for path, m in model.named_modules() if isinstance(m, LoraLayer)}


def merged_tensors(model: torch.nn.Module, named: Iterable[tuple[str, torch.Tensor]]
                   ) -> tuple[list[tuple[str, torch.Tensor]], ReadFn]:
    """The plain model's view of a wrapped model's tensors `named` (its parameters and
    buffers, or its state dict): ([(plain name, base tensor)], read). The list drops the
    adapters' own tensors and keeps the order; `read(plain name, base tensor)` gives the
    value a merged model holds there (base weight + LoRA delta; a fully trained module's
    copy), computed on demand so only one merged tensor exists at a time."""
    layers = _lora_layers(model)
    tensors = dict(named)
    out, sources = [], {}
    for name, t in tensors.items():
        if is_adapter_tensor(name):
            continue
        plain = plain_name(name)
        out.append((plain, t))
        if name in layers:
            sources[plain] = layers[name]
        elif _ORIGINAL in name:
            sources[plain] = tensors[name.replace(_ORIGINAL, _TWIN)]

    @torch.no_grad()
    def read(plain: str, base: torch.Tensor) -> torch.Tensor:
        source = sources.get(plain)
        if source is None:
            return base
        if isinstance(source, torch.Tensor):
            return source
        delta = sum(source.get_delta_weight(a) for a in source.active_adapters)
        return (base.float() + delta.float()).to(base.dtype)

    return out, read


def merged_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The state dict of the model with its adapters merged in (for a plain
    `save_pretrained`: the export any `from_pretrained` loads)."""
    named, read = merged_tensors(model, model.state_dict().items())
    return {name: read(name, t) for name, t in named}


def save_adapter(peft_model, folder: str | Path) -> None:
    """The adapter alone, as PEFT saves it: `PeftModel.from_pretrained(base, folder)`
    puts it back on the base model (`model.path`)."""
    peft_model.save_pretrained(str(folder), safe_serialization=True)


def save_model_checkpoint(model: torch.nn.Module, processor, path: str | Path, metadata: dict | None = None,
                          peft_model=None) -> Path:
    """An HF checkpoint of a trained model (atomic, `save_hf_checkpoint`). With LoRA
    (`peft_model`, the wrapper of `model`): the merged weights, which a plain
    `from_pretrained` loads (the export, and what RL or a rollout engine starts from),
    and the adapter alone in `<path>/adapter/`."""
    from asr_grpo.models.checkpoint import save_hf_checkpoint

    if peft_model is None:
        return save_hf_checkpoint(model, processor, path, metadata)
    meta = {**(metadata or {}), "lora_adapter": ADAPTER_DIR}
    return save_hf_checkpoint(model, processor, path, meta, state_dict=merged_state_dict(model),
                              write_extra=lambda folder: save_adapter(peft_model, folder / ADAPTER_DIR))
