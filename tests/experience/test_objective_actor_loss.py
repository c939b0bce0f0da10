"""The sequence-level objectives through the training loss every worker runs
(`experience.losses.actor_loss`): MWER is handed each sample's group, GSPO's ratio is
the sequence's; the experience's advantages, and dynamic sampling, read the score the config
names."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from helpers import on_policy_items

from asr_grpo.config.errors import ConfigError
from asr_grpo.config.schema import AlgorithmConfig, RunConfig
from asr_grpo.experience.losses import actor_loss, group_index
from asr_grpo.experience.maker import ExperienceMaker, training_scores
from asr_grpo.experience.types import PromptGroup
from asr_grpo.rewards.combine import RewardResult
from asr_grpo.rollout.types import SequenceResult


def test_group_index_numbers_groups_in_order_of_first_appearance(tiny_model, tiny_processor, tiny_tokenizer):
    items, _ = on_policy_items(tiny_model, tiny_processor, tiny_tokenizer, [0.5, -1.0])
    other = [dataclasses.replace(it, uid=f"y#{i}", group="y") for i, it in enumerate(items)]
    mixed = [other[0], items[0], other[1], items[1]]
    assert group_index(mixed, torch.device("cpu")).tolist() == [0, 1, 0, 1]


def test_mwer_through_actor_loss_is_the_renormalised_expected_relative_error(tiny_model, tiny_processor,
                                                                             tiny_tokenizer):
    items, logp = on_policy_items(tiny_model, tiny_processor, tiny_tokenizer, [0.3, -0.3])
    algo = AlgorithmConfig(policy_loss="mwer", advantage_estimator="dr_grpo", kl_coef=0.0, temperature=1.0)
    loss, metrics = actor_loss(tiny_model, items, algo, tiny_tokenizer.pad_token_id)
    p = torch.softmax(torch.stack([logp[0, :3].sum(), logp[1, :2].sum()]), 0)
    # err_i - mean err is minus the advantage: -0.3 and +0.3.
    assert float(loss.detach()) == pytest.approx(float(p[0] * -0.3 + p[1] * 0.3), abs=1e-5)
    assert float(metrics["policy/mwer_p_max"]) == pytest.approx(float(p.max()), abs=1e-5)


def test_gspo_through_actor_loss_on_policy_is_minus_the_mean_sequence_advantage(tiny_model, tiny_processor,
                                                                               tiny_tokenizer):
    items, _ = on_policy_items(tiny_model, tiny_processor, tiny_tokenizer, [0.5, -1.0])
    algo = AlgorithmConfig(policy_loss="gspo", kl_coef=0.0, temperature=1.0)
    loss, metrics = actor_loss(tiny_model, items, algo, tiny_tokenizer.pad_token_id)
    # Ratio 1 for both sequences, each weighs the same whatever its length (3 and 2 tokens).
    assert float(loss.detach()) == pytest.approx(-(0.5 - 1.0) / 2, abs=1e-5)
    assert float(metrics["policy/ratio_mean"]) == pytest.approx(1.0, abs=1e-5)


def test_the_advantages_read_the_score_component_the_config_names():
    reward = RewardResult(total=torch.tensor([0.9, 0.1]), components={"cer": torch.tensor([0.2, 0.7])})
    assert training_scores(reward, None) is reward.total
    assert training_scores(reward, "cer").tolist() == pytest.approx([0.2, 0.7])
    with pytest.raises(ConfigError, match="algorithm.score_component=wer: the reward reported no such "
                                          "component \\(it reported: cer\\)"):
        training_scores(reward, "wer")


@pytest.mark.parametrize("component,flat", [(None, set()), ("cer", {"a"})])
def test_dynamic_sampling_judges_the_spread_of_the_score_the_advantages_read(component, flat):
    """Group a's totals spread but its CER does not: under MWER (score_component=cer) it
    teaches nothing and is the one dropped; on the reward's total neither is."""
    groups = [PromptGroup(uid=g, utterance={"language": "en"}, prompt_ids=[1], features=None, n=2, entered_step=0)
              for g in ("a", "b")]
    results = {g.uid: [SequenceResult(f"{g.uid}#{k}", g.uid, [5], [-1.0], [0], "stop") for k in range(2)]
               for g in groups}
    maker = ExperienceMaker(RunConfig(algorithm=AlgorithmConfig(score_component=component)), None,
                            None, None, None, None)
    reward = RewardResult(total=torch.tensor([0.9, 0.8, 0.5, 0.4]),
                          components={"cer": torch.tensor([0.7, 0.7, 0.2, 0.6])})
    maker._score_rewards = lambda *args: reward
    assert maker.judge_groups(groups, results) == flat


def test_the_logged_entropy_is_per_token_whatever_the_aggregation(tiny_model, tiny_processor, tiny_tokenizer):
    from asr_grpo.algorithms import entropy_from_logits
    from asr_grpo.experience.losses import pack_items
    from asr_grpo.models.sequences import response_logits

    items, _ = on_policy_items(tiny_model, tiny_processor, tiny_tokenizer, [0.5, -1.0])
    batch = pack_items(items, tiny_tokenizer.pad_token_id)
    with torch.no_grad():
        h = entropy_from_logits(response_logits(tiny_model, batch).float())
    mask = batch.response_mask.bool()
    per_token = float(h[mask].mean())
    for agg in ("token_mean", "seq_mean_token_sum_norm", "seq_mean_token_sum"):
        algo = AlgorithmConfig(kl_coef=0.0, temperature=1.0, loss_agg=agg)
        _, metrics = actor_loss(tiny_model, items, algo, tiny_tokenizer.pad_token_id)
        assert float(metrics["policy/entropy"]) == pytest.approx(per_token, rel=1e-5), agg
