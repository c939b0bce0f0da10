"""algorithm.train_samples_per_prompt on real Ray actors: each group trains on the m of
its n samples whose rewards spread most, with the advantages of those m alone, the
reference scores streamed during the rollout, and the reward of all n logged."""
from __future__ import annotations

import itertools

import pytest
import torch
from helpers import compose_cfg

from asr_grpo.experience.types import SequenceRef
from asr_grpo.recipes.rl import RLRecipe

pytestmark = pytest.mark.slow


def test_each_group_trains_on_its_max_variance_samples(root):
    n, m = 4, 2
    cfg = compose_cfg(root, "overlap=intra", "overlap.controller=fixed", "overlap.chunk_size=2",
                      f"algorithm.n_samples_per_prompt={n}", f"algorithm.train_samples_per_prompt={m}",
                      "algorithm.max_new_tokens=12", "trainer.steps=1", "trainer.eval_every=0",
                      "trainer.save_every=0", f"trainer.output_dir={root}/downsample")
    trained = []
    recipe = RLRecipe(cfg, step_callbacks=[trained.append])
    try:
        recipe.setup()
        metrics = recipe.train_step(0)
        rollout, items = trained[0].rollout, trained[0].items
        seqs = [s for g in rollout.groups for s in rollout.results[g.uid]]
        assert len(seqs) == n * cfg.trainer.prompts_per_step
        refs = [SequenceRef(s.uid, g.prompt_ids, s.tokens, g.features, g.utterance["language"])
                for g in rollout.groups for s in rollout.results[g.uid]]
        rewards = dict(zip((s.uid for s in seqs),
                           recipe.maker._score_rewards(rollout.groups, seqs, refs, {}).total.tolist()))
        streamed_ref = rollout.streamed["ref"].get()
        spread = 0
        for g in rollout.groups:
            mine = [it for it in items if it.group == g.uid]
            assert len(mine) == m
            r = torch.tensor([rewards[it.uid] for it in mine], dtype=torch.float64)
            group_r = torch.tensor([rewards[s.uid] for s in rollout.results[g.uid]], dtype=torch.float64)
            best = max(float(group_r[list(c)].var(unbiased=False)) for c in itertools.combinations(range(n), m))
            assert float(r.var(unbiased=False)) == pytest.approx(best, abs=1e-9)
            spread += best > 0
            for it, adv in zip(mine, r - r.flip(0)):   # RLOO over the m = 2 kept samples
                torch.testing.assert_close(it.advantages, torch.full_like(it.advantages, float(adv)),
                                           atol=1e-5, rtol=0)
                torch.testing.assert_close(it.ref_logprobs, streamed_ref[it.uid], atol=0, rtol=0)
        assert spread > 0, "no group had different rewards: the test is vacuous"
        assert metrics["reward/total"] == pytest.approx(sum(rewards.values()) / len(rewards), abs=1e-5)
        assert metrics["charts/trained_reward"] == pytest.approx(
            sum(rewards[it.uid] for it in items) / len(items), abs=1e-5)
        # Per language and flat groups: from the same n rewards of every group.
        by_language: dict[str, list[float]] = {}
        for g in rollout.groups:
            by_language.setdefault(g.utterance["language"], []).extend(rewards[s.uid] for s in rollout.results[g.uid])
        for language, values in by_language.items():
            assert metrics[f"reward/total/{language}"] == pytest.approx(sum(values) / len(values), abs=1e-5)
        group_rewards = [[rewards[s.uid] for s in rollout.results[g.uid]] for g in rollout.groups]
        flat = [max(r) - min(r) <= 1e-6 for r in group_rewards]
        assert metrics["reward/flat_groups"] == pytest.approx(sum(flat) / len(flat))
        assert metrics["overlap/streamed_frac"] == pytest.approx(1.0)   # of all n samples, not of the kept m
        assert metrics["charts/grad_norm"] > 0   # the update ran on the kept samples
    finally:
        recipe.cleanup()
