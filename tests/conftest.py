"""Shared fixtures: a tiny tokenizer/processor/model built from config (no corpus needed)."""
from __future__ import annotations

import pytest

from asr_grpo.models import build_model, build_processor, train_tokenizer
from helpers import TINY_MODEL, TINY_TEXTS


@pytest.fixture(scope="session")
def tiny_tokenizer():
    return train_tokenizer(TINY_TEXTS, vocab_size=400)


@pytest.fixture(scope="session")
def tiny_processor(tiny_tokenizer):
    return build_processor(tiny_tokenizer)


@pytest.fixture(scope="session")
def tiny_model(tiny_tokenizer):
    return build_model(TINY_MODEL, tiny_tokenizer, seed=0).eval()


