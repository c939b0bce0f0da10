"""Shared fixtures: a tiny tokenizer/processor/model built from config (no corpus needed),
and one tiny corpus + SFT checkpoint shared by every RL and workflow test of the session."""
from __future__ import annotations

import pytest
from helpers import TINY_MODEL, TINY_TEXTS, compose_cfg

from asr_grpo.models import build_model, build_processor, train_tokenizer


@pytest.fixture(scope="session")
def tiny_tokenizer():
    return train_tokenizer(TINY_TEXTS, vocab_size=400)


@pytest.fixture(scope="session")
def tiny_processor(tiny_tokenizer):
    return build_processor(tiny_tokenizer)


@pytest.fixture(scope="session")
def tiny_model(tiny_tokenizer):
    return build_model(TINY_MODEL, tiny_tokenizer, seed=0).eval()


@pytest.fixture(scope="session")
def root(tmp_path_factory):
    """paths.output_root holding the debug=fast corpus and SFT checkpoint (built once)."""
    from asr_grpo.recipes.sft import run_sft

    out = tmp_path_factory.mktemp("rl")
    run_sft(compose_cfg(out))
    return out
