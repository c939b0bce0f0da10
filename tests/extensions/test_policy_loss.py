"""A new policy loss is a function, its registration and a config value: plain REINFORCE
defined here, chosen by `algorithm.policy_loss`, is the loss the policy trains on."""
from __future__ import annotations

import pytest
from helpers import compose_cfg, on_policy_items

from asr_grpo.algorithms import POLICY_LOSSES, masked_mean
from asr_grpo.config.schema import AlgorithmConfig
from asr_grpo.config.validate import ConfigError, validate_config
from asr_grpo.experience.losses import actor_loss


@pytest.fixture
def reinforce():
    """-A * log pi, no ratio and no clipping; reports how many tokens it saw."""
    @POLICY_LOSSES.register("test_reinforce")
    def reinforce_loss(logp, old_logp, advantages, mask, algo, importance_weights=None):
        return masked_mean(-advantages * logp, mask), {"tokens": mask.sum()}

    yield
    POLICY_LOSSES.unregister("test_reinforce")


def test_the_policy_trains_on_it(reinforce, tiny_model, tiny_processor, tiny_tokenizer):
    items, logp = on_policy_items(tiny_model, tiny_processor, tiny_tokenizer, [0.5, -1.0])
    algo = AlgorithmConfig(policy_loss="test_reinforce", kl_coef=0.0, temperature=1.0)
    loss, metrics = actor_loss(tiny_model, items, algo, tiny_tokenizer.pad_token_id)
    # On-policy the clipped PPO loss would be -mean(A) = 0.1; REINFORCE weighs each token by its log-prob.
    expected = -(0.5 * logp[0, :3].sum() - 1.0 * logp[1, :2].sum()) / 5
    assert float(loss.detach()) == pytest.approx(float(expected), abs=1e-5)
    assert float(metrics["policy/tokens"]) == 5 and "policy/clip_frac" not in metrics


def test_an_unregistered_loss_is_a_one_line_error_listing_the_losses(tmp_path):
    with pytest.raises(ConfigError) as err:
        validate_config(compose_cfg(tmp_path, "algorithm.policy_loss=test_reinforce"))
    assert str(err.value) == ("invalid configuration: algorithm.policy_loss=test_reinforce: "
                              "expected one of ppo_clip, gspo, gspo_token, mwer")
