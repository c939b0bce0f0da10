"""Shared fixtures: a tiny tokenizer/processor/model built from config (no corpus needed)."""
from __future__ import annotations

import pytest

from asr_grpo.config.schema import ModelConfig
from asr_grpo.models import build_model, build_processor, train_tokenizer

TINY_TEXTS = ["turn on the lights in the kitchen", "call alice at five thirty", "send the report to bob",
              "请打开客厅的灯", "明天上午九点去北京", "给张伟打电话"] * 10
TINY_MODEL = ModelConfig(encoder_layers=1, encoder_d_model=64, encoder_heads=2, encoder_ffn_dim=128,
                         encoder_downsample_hidden=16, text_layers=2, text_hidden=64, text_heads=2,
                         text_kv_heads=1, text_intermediate=128)


@pytest.fixture(scope="session")
def tiny_tokenizer():
    return train_tokenizer(TINY_TEXTS, vocab_size=400)


@pytest.fixture(scope="session")
def tiny_processor(tiny_tokenizer):
    return build_processor(tiny_tokenizer)


@pytest.fixture(scope="session")
def tiny_model(tiny_tokenizer):
    return build_model(TINY_MODEL, tiny_tokenizer, seed=0).eval()


