"""A new reward component is a function, its registration and a weight in `reward.weights`:
one defined here is scored by the built-in reward file for every sample, logged, and
weighed into the total the run optimises."""
from __future__ import annotations

import pytest
import torch
from helpers import compose_cfg

from asr_grpo.config.validate import validate_config
from asr_grpo.rewards import REWARD_COMPONENTS, RewardSample, cer_score, load_reward_function


@pytest.fixture
def brevity():
    """1 when the transcript is no longer than the reference, else 0."""
    @REWARD_COMPONENTS.register("test_brevity")
    def brevity_score(s: RewardSample) -> float:
        return float(len(s.transcript) <= len(s.reference))

    yield
    REWARD_COMPONENTS.unregister("test_brevity")


def test_its_weight_is_accepted_by_the_validation(brevity, tmp_path):
    validate_config(compose_cfg(tmp_path, "+reward.weights.test_brevity=1.0"))


def test_the_built_in_reward_weighs_it_into_the_total(brevity):
    reward_func = load_reward_function("")   # the built-in reward file, as the reward workers load it
    references = ["call alice", "call bob"]
    responses = ["language English<asr_text>call alice", "language English<asr_text>call bob at five"]
    out = reward_func([""] * 2, [""] * 2, references, responses=responses, languages=["en", "en"],
                      weights={"cer": 1.0, "test_brevity": 1.0})
    assert out["extra_logs"]["test_brevity"].tolist() == [1.0, 0.0]
    transcripts = ["call alice", "call bob at five"]
    cer = torch.tensor([cer_score(t, ref, "en") for t, ref in zip(transcripts, references)])
    torch.testing.assert_close(out["rewards"], (cer + torch.tensor([1.0, 0.0])) / 2)
