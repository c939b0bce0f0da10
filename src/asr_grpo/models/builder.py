"""Build the speech LLM (Qwen3-ASR: audio encoder + adapter + causal LM) from config,
or load any Qwen3-ASR HF folder (a real checkpoint loads through the same path)."""
from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from transformers import (
    Qwen3ASRConfig,
    Qwen3ASRFeatureExtractor,
    Qwen3ASRForConditionalGeneration,
    Qwen3ASRProcessor,
)

from asr_grpo.config.model_shapes import decoder_head_dim
from asr_grpo.config.schema import ModelConfig
from asr_grpo.models.tokenizer import AUDIO_PAD, IM_END, PAD_TOKEN, train_tokenizer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ParameterCounts:
    total: int
    trainable: int
    frozen: int
    audio_encoder: int

    def as_dict(self) -> dict[str, int]:
        return {"params/total": self.total, "params/trainable": self.trainable,
                "params/frozen": self.frozen, "params/audio_encoder": self.audio_encoder}


def build_processor(tokenizer) -> Qwen3ASRProcessor:
    return Qwen3ASRProcessor(
        feature_extractor=Qwen3ASRFeatureExtractor(),
        tokenizer=tokenizer,
        chat_template=tokenizer.chat_template,
    )


def architecture_config(cfg: ModelConfig, tokenizer) -> Qwen3ASRConfig:
    """The Qwen3-ASR config of `cfg`'s architecture (the tiny default, or a published size
    in conf/model/) around `tokenizer`'s special tokens."""
    ids = tokenizer.convert_tokens_to_ids
    if cfg.vocab_size and cfg.vocab_size < len(tokenizer):
        raise ValueError(f"model.vocab_size={cfg.vocab_size} is smaller than the tokenizer "
                         f"({len(tokenizer)} tokens)")
    return Qwen3ASRConfig(
        audio_config={
            "model_type": "qwen3_asr_encoder",
            "encoder_layers": cfg.encoder_layers,
            "d_model": cfg.encoder_d_model,
            "encoder_attention_heads": cfg.encoder_heads,
            "encoder_ffn_dim": cfg.encoder_ffn_dim,
            "downsample_hidden_size": cfg.encoder_downsample_hidden,
            "output_dim": cfg.text_hidden,
            "n_window_infer": 100 * cfg.encoder_attention_window_s,
        },
        text_config={
            "model_type": "qwen3",
            "vocab_size": cfg.vocab_size or len(tokenizer),
            "hidden_size": cfg.text_hidden,
            "intermediate_size": cfg.text_intermediate,
            "num_hidden_layers": cfg.text_layers,
            "num_attention_heads": cfg.text_heads,
            "num_key_value_heads": cfg.text_kv_heads,
            "head_dim": decoder_head_dim(cfg.text_hidden, cfg.text_heads, cfg.text_head_dim),
            "max_position_embeddings": cfg.max_position_embeddings,
            "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
            "tie_word_embeddings": True,
            "pad_token_id": ids(PAD_TOKEN),
            "eos_token_id": ids(IM_END),
        },
        audio_token_id=ids(AUDIO_PAD),
        pad_token_id=ids(PAD_TOKEN),
        eos_token_id=[ids(IM_END), ids(PAD_TOKEN)],
        # Only read by the forced-aligner head; point it at a real token.
        timestamp_token_id=ids(PAD_TOKEN),
    )


def fresh_model(cfg: ModelConfig, texts, seed: int = 0, languages=("en", "zh")):
    """Fresh weights of `cfg`'s architecture around a tokenizer trained on `texts` (and
    the prompt words of `languages`): (model, processor)."""
    tokenizer = train_tokenizer(texts, cfg.tokenizer_vocab_size, languages=sorted(set(languages)))
    return build_model(cfg, tokenizer, seed=seed), build_processor(tokenizer)


def build_model(cfg: ModelConfig, tokenizer, seed: int = 0) -> Qwen3ASRForConditionalGeneration:
    torch.manual_seed(seed)
    model = Qwen3ASRForConditionalGeneration(architecture_config(cfg, tokenizer))
    init_audio_frontend(model)
    _set_generation_defaults(model, tokenizer)
    return model.to(getattr(torch, cfg.dtype))


@torch.no_grad()
def init_audio_frontend(model: Qwen3ASRForConditionalGeneration) -> None:
    """Fan-in scaled init for the audio path (conv stack and adapter), for training
    from scratch.

    HF initialises every conv/linear with N(0, 0.02), made for loading pretrained
    weights. Through three stride-2 convs (fan-in 9, then 9 x channels) the mel signal
    shrinks ~1000x and drowns under the encoder's per-chunk positional embedding, so
    every audio frame looks alike. The adapter (linear-GELU-linear) then shrinks the
    encoder's unit-scale output to ~0.04, and whatever reads it (the LM's residual
    stream, a CTC head) needs hundreds of Adam steps to grow weights large enough to
    hear it: a CTC head on the adapter stayed on the blank plateau for 600 steps,
    while the same head on a unit-scale adapter reached 44% / 28% CER (en / zh) in 450.
    Kaiming init keeps the signal at unit scale through both.
    """
    enc = audio_encoder(model)
    for conv in (enc.conv2d1, enc.conv2d2, enc.conv2d3):
        torch.nn.init.kaiming_normal_(conv.weight, nonlinearity="relu")  # GELU ~ ReLU gain
        torch.nn.init.zeros_(conv.bias)
    torch.nn.init.kaiming_normal_(enc.conv_out.weight, nonlinearity="linear")
    adapter = model.model.multi_modal_projector
    torch.nn.init.kaiming_normal_(adapter.linear_1.weight, nonlinearity="relu")
    torch.nn.init.kaiming_normal_(adapter.linear_2.weight, nonlinearity="linear")
    torch.nn.init.zeros_(adapter.linear_1.bias)
    torch.nn.init.zeros_(adapter.linear_2.bias)


def load_processor(path: str) -> Qwen3ASRProcessor:
    return Qwen3ASRProcessor.from_pretrained(path)


def load_model(path: str, dtype: str = "float32"):
    """Load model + processor from an HF folder (ours or a real Qwen3-ASR checkpoint)."""
    processor = load_processor(path)
    model = Qwen3ASRForConditionalGeneration.from_pretrained(path, dtype=getattr(torch, dtype))
    _set_generation_defaults(model, processor.tokenizer)
    return model, processor


def suppressed_token_ids(tokenizer, eos_token_ids) -> list[int]:
    """Special tokens a transcript must never contain (audio placeholders, role and tag
    markers): one sampled `<|audio_pad|>` would shift the audio splice on re-scoring."""
    special = set(tokenizer.all_special_ids) | set(
        tokenizer.convert_tokens_to_ids([tokenizer.audio_token, tokenizer.audio_bos_token,
                                         tokenizer.audio_eos_token]))
    return sorted(special - set(eos_token_ids))


def _set_generation_defaults(model, tokenizer) -> None:
    gen = model.generation_config
    gen.pad_token_id = tokenizer.pad_token_id
    gen.eos_token_id = [tokenizer.convert_tokens_to_ids(IM_END), tokenizer.pad_token_id]
    gen.bos_token_id = None
    gen.suppress_tokens = suppressed_token_ids(tokenizer, gen.eos_token_id)


def audio_encoder(model: Qwen3ASRForConditionalGeneration) -> torch.nn.Module:
    return model.model.audio_tower


def set_audio_encoder_frozen(model: Qwen3ASRForConditionalGeneration, frozen: bool) -> ParameterCounts:
    """Freeze (or unfreeze) the audio encoder; the adapter and the LM stay trainable."""
    for p in audio_encoder(model).parameters():
        p.requires_grad_(not frozen)
    return parameter_counts(model)


def parameter_counts(model: Qwen3ASRForConditionalGeneration) -> ParameterCounts:
    # Tied embeddings appear once in parameters(), so nothing is double counted.
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    enc = sum(p.numel() for p in audio_encoder(model).parameters())
    return ParameterCounts(total=total, trainable=trainable, frozen=total - trainable, audio_encoder=enc)
