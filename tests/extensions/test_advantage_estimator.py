"""A new advantage estimator is a function, its registration and a config value: one defined
here, chosen by `algorithm.advantage_estimator`, checked by the validation with what it
registered it needs, and what the experience's advantages are made of."""
from __future__ import annotations

import pytest
import torch
from helpers import compose_cfg

from asr_grpo.algorithms import (
    ADVANTAGE_ESTIMATORS,
    AdvantageInput,
    broadcast_to_tokens,
    register_advantage_estimator,
)
from asr_grpo.config.schema import AlgorithmConfig
from asr_grpo.config.validate import ConfigError, config_problems, validate_config
from asr_grpo.experience.advantages import estimate_advantages


@pytest.fixture
def sign_estimator():
    """+1 above the group's mean, -1 below: compares at least three samples of a prompt."""
    seen: list[AdvantageInput] = []

    @register_advantage_estimator("test_sign", min_group_size=3)
    def sign(x: AdvantageInput) -> tuple[torch.Tensor, None]:
        seen.append(x)
        groups = x.scores.view(-1, x.group_size)
        signs = torch.sign(groups - groups.mean(dim=1, keepdim=True)).view(-1)
        return broadcast_to_tokens(signs, x.mask), None

    yield seen
    ADVANTAGE_ESTIMATORS.unregister("test_sign")


def test_the_config_selects_it_and_the_validation_knows_what_it_needs(sign_estimator, tmp_path):
    chosen = "algorithm.advantage_estimator=test_sign"
    validate_config(compose_cfg(tmp_path, chosen, "algorithm.n_samples_per_prompt=4",
                                "algorithm.train_samples_per_prompt=null"))
    problems = config_problems(compose_cfg(tmp_path, chosen, "algorithm.n_samples_per_prompt=2"))
    assert ("algorithm.advantage_estimator=test_sign compares samples of one prompt: "
            "algorithm.n_samples_per_prompt must be >= 3 (got 2)") in problems


def test_its_advantages_are_the_experiences(sign_estimator):
    algo = AlgorithmConfig(advantage_estimator="test_sign", n_samples_per_prompt=3)
    scores = torch.tensor([0.0, 0.5, 1.0, 1.0, 0.25, 0.25])   # group means 0.5 (exact in binary)
    lengths = [2, 3, 1, 4, 2, 2]
    logp = [torch.zeros(n) for n in lengths]
    out = estimate_advantages(algo, scores, lengths, logp, logp, None, group_size=3)
    signs = [-1, 0, 1, 1, -1, -1]
    assert [a.tolist() for a in out.advantages] == [[s] * n for s, n in zip(signs, lengths)]
    assert out.returns is None
    (x,) = sign_estimator
    assert x.group_size == 3 and x.kl is not None and x.kl_coef == 0.0   # the KL goes in the loss here


def test_unregistered_it_is_a_one_line_error_listing_the_estimators(tmp_path):
    with pytest.raises(ConfigError) as err:
        validate_config(compose_cfg(tmp_path, "algorithm.advantage_estimator=test_sign"))
    assert str(err.value) == ("invalid configuration: algorithm.advantage_estimator=test_sign: "
                              "expected one of group_norm, rloo, reinforce_baseline, dr_grpo, gae")
