"""The PPO critic: the policy's backbone (audio encoder + adapter + LM body) with a
scalar value head, initialised from the same checkpoint as the policy."""
from __future__ import annotations

import torch
from transformers import Qwen3ASRForConditionalGeneration

from asr_grpo.models.builder import set_audio_encoder_frozen
from asr_grpo.models.hf_compat import enable_checkpointing, output_cache, with_cache
from asr_grpo.models.kv_batch import ForwardFn
from asr_grpo.models.sequences import SequenceBatch, hf_module, on_model_device


class ValueModel(torch.nn.Module):
    def __init__(self, backbone, hidden_size: int):
        super().__init__()
        self.backbone = backbone
        self.value_head = torch.nn.Linear(hidden_size, 1)
        # Start at V = 0 so the first updates are driven by returns, not by noise.
        torch.nn.init.zeros_(self.value_head.weight)
        torch.nn.init.zeros_(self.value_head.bias)

    @classmethod
    def from_pretrained(cls, path: str, freeze_audio_encoder: bool = True) -> "ValueModel":
        policy = Qwen3ASRForConditionalGeneration.from_pretrained(path, dtype=torch.float32)
        set_audio_encoder_frozen(policy, freeze_audio_encoder)
        return cls(policy.model, policy.config.text_config.hidden_size)

    @property
    def audio_tower(self):
        return self.backbone.audio_tower

    def activation_checkpointing_enable(self, activation_checkpointing_kwargs=None) -> None:
        """The backbone's (HF) gradient checkpointing; the value head is one linear layer."""
        enable_checkpointing(self.backbone, **(activation_checkpointing_kwargs or {}))

    def forward(self, **inputs) -> torch.Tensor:
        hidden = self.backbone(**inputs, use_cache=False).last_hidden_state
        return self.value_head(hidden).squeeze(-1)


def response_values(model: ValueModel, batch: SequenceBatch) -> torch.Tensor:
    """V(state before response token j) [B, T]: read at the column that predicts token j.
    On the model's device (with grad when it is on)."""
    values = model(**on_model_device(model, batch.shared_audio_inputs(hf_module(model).backbone)))
    return values[:, batch.prompt_width - 1:-1] * batch.response_mask.to(values.device)


def value_forward(model: ValueModel) -> ForwardFn:
    """Values at the kept positions, with the backbone's KV cache (for streaming
    scoring; see `ForwardFn`)."""
    def forward(cache=None, keep=None, **inputs):
        out = model.backbone(**with_cache(on_model_device(model, inputs), cache), use_cache=True)
        hidden = out.last_hidden_state
        if keep is not None:
            hidden = hidden[keep.to(hidden.device)]
        return model.value_head(hidden).squeeze(-1), output_cache(out)
    return forward
