"""Prompt sampling order, advantage estimation on real shapes, the actor/critic losses."""
from __future__ import annotations

import pytest
import torch
from helpers import on_policy_items

from asr_grpo.algorithms import group_norm_advantages
from asr_grpo.config.schema import AlgorithmConfig
from asr_grpo.experience.advantages import estimate_advantages
from asr_grpo.experience.losses import actor_loss
from asr_grpo.experience.prompts import PromptSampler
from asr_grpo.experience.tensors import pad_ragged, unpad


def test_sampler_covers_every_item_once_per_epoch_and_resumes_exactly():
    s = PromptSampler(10, seed=3)
    first_epoch = s.next(10)
    assert sorted(first_epoch) == list(range(10))
    s.next(4)
    state = s.state_dict()
    expected = s.next(13)
    resumed = PromptSampler(10, seed=3)
    resumed.load_state_dict(state)
    assert resumed.next(13) == expected
    assert PromptSampler(10, seed=4).next(10) != first_epoch
    with pytest.raises(ValueError, match="9 utterances"):
        PromptSampler(9, seed=3).load_state_dict(state)


def test_grpo_advantages_are_group_normalised_scores_on_every_token():
    algo = AlgorithmConfig(advantage_estimator="group_norm", n_samples_per_prompt=3)
    scores = torch.tensor([0.1, 0.5, 0.9, 0.4, 0.4, 0.4])
    lengths = [2, 3, 1, 4, 2, 2]
    logp = [torch.zeros(n) for n in lengths]
    out = estimate_advantages(algo, scores, lengths, logp, logp, None, group_size=3)
    expected = group_norm_advantages(scores, 3)
    for adv, n, e in zip(out.advantages, lengths, expected.tolist()):
        assert adv.shape == (n,) and torch.allclose(adv, torch.full((n,), e))
    assert out.returns is None
    assert out.metrics["kl/policy_ref"] == 0.0


def test_ppo_gae_puts_kl_in_the_reward_and_needs_values():
    algo = AlgorithmConfig(name="ppo", advantage_estimator="gae", use_critic=True, kl_in_reward=True,
                           kl_estimator="k1", kl_coef=0.5, gamma=1.0, lam=1.0)
    scores = torch.tensor([1.0, 0.0])
    lengths = [2, 3]
    old = [torch.tensor([-1.0, -1.0]), torch.tensor([-1.0, -1.0, -1.0])]
    ref = [torch.tensor([-1.5, -1.0]), torch.tensor([-1.0, -1.0, -2.0])]
    values = [torch.zeros(2), torch.zeros(3)]
    out = estimate_advantages(algo, scores, lengths, old, ref, values, group_size=1)
    # gamma=lam=1, V=0: returns are reward-to-go; KL k1 = old - ref, times -0.5 per token.
    assert out.returns[0].tolist() == pytest.approx([1.0 - 0.25, 1.0])
    assert out.returns[1].tolist() == pytest.approx([-0.5, -0.5, -0.5])
    with pytest.raises(ValueError, match="use_critic"):
        estimate_advantages(algo, scores, lengths, old, ref, None, group_size=1)


def test_pad_and_unpad_round_trip():
    rows = [torch.tensor([1.0, 2.0]), torch.tensor([3.0]), torch.tensor([4.0, 5.0, 6.0])]
    padded = pad_ragged(rows)
    assert padded.tolist() == [[1, 2, 0], [3, 0, 0], [4, 5, 6]]
    assert [r.tolist() for r in unpad(padded, [2, 1, 3])] == [r.tolist() for r in rows]


def test_actor_loss_is_minus_advantage_on_policy(tiny_model, tiny_processor, tiny_tokenizer):
    """On-policy (old = current log-probs), ratio = 1: the clipped loss is -mean(A), and
    its gradient is that of -A * logp."""
    items, _ = on_policy_items(tiny_model, tiny_processor, tiny_tokenizer, [0.5, -1.0])
    algo = AlgorithmConfig(kl_coef=0.1, loss_agg="token_mean", temperature=1.0)   # logp above: unscaled logits
    loss, metrics = actor_loss(tiny_model, items, algo, tiny_tokenizer.pad_token_id)
    assert float(loss) == pytest.approx(-(0.5 * 3 - 1.0 * 2) / 5, abs=1e-5)
    assert float(metrics["kl/loss"]) == pytest.approx(0.0, abs=1e-6)
    assert float(metrics["policy/clip_frac"]) == 0.0


def test_flat_groups_are_counted_overall_and_per_language():
    from asr_grpo.experience.maker import flat_group_shares

    rewards = torch.tensor([0.5, 0.5, 0.5, 0.2, 0.9, 0.9, 0.7, 0.7, 0.7])
    groups = ["a", "a", "a", "b", "b", "b", "c", "c", "c"]   # a, c: every sample the same reward
    langs = ["zh"] * 3 + ["en"] * 3 + ["zh"] * 3
    out = flat_group_shares(rewards, groups, langs)
    assert out == {"reward/flat_groups": pytest.approx(2 / 3), "reward/flat_groups/zh": 1.0,
                   "reward/flat_groups/en": 0.0}
    assert flat_group_shares(rewards[:1], groups[:1], langs[:1])["reward/flat_groups"] == 1.0   # one sample
