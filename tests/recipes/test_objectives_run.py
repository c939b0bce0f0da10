"""The policy objectives on real Ray actors and DeepSpeed, through the one RL step every
algorithm takes: MWER under OPPO overlap (streamed scoring, a carried group) trains on
each group's character errors; GSPO trains with its sequence ratio."""
from __future__ import annotations

import pytest
import torch
from helpers import compose_cfg

from asr_grpo.experience.types import SequenceRef
from asr_grpo.recipes.rl import RLRecipe

pytestmark = [pytest.mark.long, pytest.mark.slow]


def run_steps(cfg, steps: int):
    """(each step's TrainedStep, the recipe's rewards of a step's trained samples by uid)."""
    trained = []
    recipe = RLRecipe(cfg, step_callbacks=[trained.append])
    try:
        recipe.setup()
        for step in range(steps):
            recipe.train_step(step)
        cer = []
        for t in trained:
            groups = t.rollout.groups
            by_uid = {g.uid: g for g in groups}
            seqs = [s for g in groups for s in t.rollout.results[g.uid]]
            refs = [SequenceRef(s.uid, by_uid[s.group].prompt_ids, s.tokens, by_uid[s.group].features,
                                by_uid[s.group].utterance["language"]) for s in seqs]
            reward = recipe.maker._score_rewards(groups, seqs, refs, {})
            cer.append(dict(zip((s.uid for s in seqs), reward.components["cer"].tolist())))
        return trained, cer
    finally:
        recipe.cleanup()


def test_mwer_trains_on_each_groups_character_errors_under_oppo(root):
    cfg = compose_cfg(root, "algorithm=mwer", "overlap=oppo", "overlap.controller=fixed", "overlap.chunk_size=2",
                      "overlap.delta_init=1", "overlap.delta_max=1", "algorithm.n_samples_per_prompt=4",
                      "algorithm.max_new_tokens=12", "trainer.eval_every=0", "trainer.save_every=0",
                      f"trainer.output_dir={root}/mwer")
    trained, cer = run_steps(cfg, steps=2)
    for t, scores in zip(trained, cer):
        assert "policy/mwer_p_max" in t.metrics and "policy/clip_frac" not in t.metrics
        assert 1 / 4 <= t.metrics["policy/mwer_p_max"] <= 1
        for g in t.rollout.groups:
            mine = [it for it in t.items if it.group == g.uid]
            assert len(mine) == 4
            err = torch.tensor([1 - scores[it.uid] for it in mine])
            for it, relative in zip(mine, err - err.mean()):   # the advantage is minus the relative error
                torch.testing.assert_close(it.advantages, torch.full_like(it.advantages, -float(relative)),
                                           atol=1e-5, rtol=0)
    # Overcommit and streaming were on: B + 1 groups in flight, tokens streamed to the scorers.
    assert all(t.metrics["overlap/delta"] == 1 and t.metrics["overlap/buffer_groups"] == 3 for t in trained)
    assert trained[0].metrics["overlap/streamed_frac"] > 0


def test_gspo_trains_with_its_sequence_ratio(root):
    cfg = compose_cfg(root, "algorithm.policy_loss=gspo", "algorithm.max_new_tokens=12", "trainer.eval_every=0",
                      "trainer.save_every=0", f"trainer.output_dir={root}/gspo")
    (t,), _ = run_steps(cfg, steps=1)
    # One micro-batch, on the weights that sampled it: every sequence ratio is 1, none clipped.
    assert t.metrics["policy/ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    assert t.metrics["policy/clip_frac"] == 0.0
    assert torch.isfinite(torch.tensor(t.metrics["loss/policy"]))
