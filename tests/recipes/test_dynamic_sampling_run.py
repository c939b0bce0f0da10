"""algorithm.dynamic_sampling on real Ray actors under `oppo` (streamed reference scores,
an overcommit buffer): with a reward file that gives every sample of some utterances the
same reward, no such group trains, each one dropped is replaced by one more admission,
and the counts reach MLflow."""
from __future__ import annotations

import zlib

import pytest
from helpers import compose_cfg, metric_history

from asr_grpo.recipes.rl import run_rl

pytestmark = [pytest.mark.long, pytest.mark.slow]

# Half the utterances (by their text) get 1.0 on every sample; the others a number drawn
# from the transcript, so their groups spread unless both samples read the same.
HALF_FLAT_REWARD = '''
import zlib


def reward_func(queries, prompts, labels, **kwargs):
    return [1.0 if zlib.crc32(label.encode()) % 2 == 0 else zlib.crc32(query.encode()) % 1000 / 1000
            for query, label in zip(queries, labels)]
'''


def flat_text(text: str) -> bool:
    return zlib.crc32(text.encode()) % 2 == 0


def test_a_run_with_dynamic_sampling_trains_no_flat_group(root, tmp_path):
    reward_file = tmp_path / "half_flat.py"
    reward_file.write_text(HALF_FLAT_REWARD)
    steps = 2
    cfg = compose_cfg(root, "overlap=oppo", "overlap.controller=fixed", "overlap.chunk_size=2",
                      "overlap.delta_init=1", "algorithm.dynamic_sampling.enabled=true",
                      f"reward.reward_file={reward_file}", f"trainer.steps={steps}", "trainer.eval_every=0",
                      "trainer.save_every=0", f"trainer.output_dir={root}/dynamic_sampling")
    B = cfg.trainer.prompts_per_step
    trained = []
    summary = run_rl(cfg, step_callbacks=[trained.append])
    texts = {}   # group uid -> utterance text, of every group trained
    dropped_total = 0
    for t in trained:
        m = t.metrics
        assert len(t.rollout.groups) == B and m["dynamic_sampling/trained_groups"] == B
        for g in t.rollout.groups:
            texts[g.uid] = g.utterance["text"]
            assert not flat_text(g.utterance["text"]), g.uid
            assert any(float(it.advantages.abs().max()) > 0 for it in t.items if it.group == g.uid)
        dropped = m["dynamic_sampling/dropped_groups"]
        assert m["dynamic_sampling/extra_groups"] == dropped and m["dynamic_sampling/bound_hit"] == 0
        # The logged reward covers the dropped groups too: their share is the flat share.
        assert m["reward/flat_groups"] == pytest.approx(dropped / (dropped + B))
        dropped_total += dropped
    assert dropped_total > 0, "no group was flat: the test would be vacuous"
    assert texts, "nothing trained"
    logged = metric_history(cfg, summary["mlflow_run_id"], "dynamic_sampling/dropped_groups")
    assert [v for _, v in sorted(logged)] == [t.metrics["dynamic_sampling/dropped_groups"] for t in trained]
