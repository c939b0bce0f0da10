"""The published Qwen3-ASR sizes (conf/model/qwen3_asr_*.yaml): their shapes give the
published parameter counts (counted on the meta device: no memory), and each builds and
runs on CPU with its layer counts and widths scaled down through overrides."""
from __future__ import annotations

import pytest
import torch
from helpers import noise_audio
from omegaconf import OmegaConf
from transformers import Qwen3ASRForConditionalGeneration

from asr_grpo.config.schema import ModelConfig
from asr_grpo.config.store import CONF_DIR
from asr_grpo.models import (
    architecture_config,
    build_model,
    build_processor,
    encode_requests,
    train_tokenizer,
)

# (text decoder total, text without embeddings, audio encoder), billions: the Qwen3-0.6B /
# Qwen3-1.7B reports and the Qwen3-ASR model cards.
PUBLISHED = {"qwen3_asr_0p6b": (0.60, 0.44, 0.18), "qwen3_asr_1p7b": (1.72, 1.41, 0.31)}
SCALED_DOWN = dict(encoder_layers=1, encoder_d_model=64, encoder_heads=4, encoder_ffn_dim=128,
                   encoder_downsample_hidden=16, text_layers=1, text_hidden=64, text_heads=4, text_kv_heads=2,
                   text_head_dim=32, text_intermediate=128, vocab_size=4096, dtype="float32")


def model_cfg(name: str, **overrides) -> ModelConfig:
    merged = OmegaConf.merge(OmegaConf.structured(ModelConfig),
                             OmegaConf.load(f"{CONF_DIR}/model/{name}.yaml"),
                             {"path": "", **overrides})   # path: an interpolation into the run config
    return OmegaConf.to_object(merged)


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(["the quick brown fox", "你好世界", "guten morgen"] * 20, 300)


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_shapes_give_the_published_parameter_counts(name, tokenizer):
    with torch.device("meta"):
        model = Qwen3ASRForConditionalGeneration(architecture_config(model_cfg(name), tokenizer))
    encoder = sum(p.numel() for n, p in model.named_parameters() if "audio_tower" in n) / 1e9
    text = sum(p.numel() for p in model.parameters()) / 1e9 - encoder
    embeddings = model.get_input_embeddings().weight.numel() / 1e9
    want_text, want_body, want_encoder = PUBLISHED[name]
    assert text == pytest.approx(want_text, rel=0.03)
    assert text - embeddings == pytest.approx(want_body, rel=0.03)
    assert encoder == pytest.approx(want_encoder, rel=0.1)
    assert model.config.text_config.vocab_size == 151936 and model.config.text_config.head_dim == 128


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_each_size_builds_and_decodes_scaled_down(name, tokenizer):
    cfg = model_cfg(name, **SCALED_DOWN)
    model = build_model(cfg, tokenizer).eval()
    text = model.config.text_config
    assert (text.head_dim, text.vocab_size, text.num_attention_heads) == (32, 4096, 4)
    assert text.rope_parameters["rope_theta"] == cfg.rope_theta == 1e6   # the published base, kept
    batch = encode_requests(build_processor(tokenizer), [noise_audio(1.0, 0)], ["en"])
    out = model.generate(**batch, max_new_tokens=3, do_sample=False)
    assert out.shape[1] == batch["input_ids"].shape[1] + 3


def test_a_vocabulary_smaller_than_the_tokenizer_is_refused(tokenizer):
    with pytest.raises(ValueError, match="model.vocab_size=10 is smaller than the tokenizer"):
        architecture_config(model_cfg("tiny_qwen3_asr", vocab_size=10), tokenizer)
