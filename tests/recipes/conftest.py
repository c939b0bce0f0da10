"""One tiny corpus + SFT checkpoint shared by every RL test of the session."""
from __future__ import annotations

import pytest
from helpers import compose_cfg

from asr_grpo.recipes.sft import run_sft


@pytest.fixture(scope="session")
def root(tmp_path_factory):
    out = tmp_path_factory.mktemp("rl")
    run_sft(compose_cfg(out))
    return out
