"""The weight-sync check's comparison: per-token differences, the worst engine, and a
mismatch that stops the run naming the engine, the version and the gap."""
from __future__ import annotations

import pytest
import torch

from asr_grpo.experience.sync_check import (
    WeightSyncMismatch,
    check_sequences,
    check_weight_sync,
    compare_logprobs,
)
from asr_grpo.experience.types import ExperienceItem
from asr_grpo.models.sequences import AudioFeatures


def test_compare_reports_the_worst_and_mean_token_gap():
    trainer = [torch.tensor([-1.0, -2.0]), torch.tensor([-0.5])]
    engine = [torch.tensor([-1.0, -2.5]), torch.tensor([-0.25])]
    cmp = compare_logprobs(trainer, engine)
    assert cmp.max_abs_diff == pytest.approx(0.5)
    assert cmp.mean_abs_diff == pytest.approx((0.0 + 0.5 + 0.25) / 3)
    assert cmp.tokens == 3
    assert cmp.metrics() == {"rollout/sync/max_abs_diff": pytest.approx(0.5),
                             "rollout/sync/mean_abs_diff": pytest.approx(0.25), "rollout/sync/tokens": 3.0}


def test_compare_refuses_sequences_that_do_not_line_up():
    with pytest.raises(ValueError, match="2 trainer sequences against 1"):
        compare_logprobs([torch.zeros(2), torch.zeros(1)], [torch.zeros(2)])
    with pytest.raises(ValueError, match=r"sequence 0: \(2,\) trainer log-probs against \(3,\)"):
        compare_logprobs([torch.zeros(2)], [torch.zeros(3)])


def test_every_engine_is_checked_and_a_stale_one_stops_the_run():
    trainer = [torch.tensor([-1.0, -2.0])]
    close = [torch.tensor([-1.0, -2.0 + 2e-4])]
    closer = [torch.tensor([-1.0, -2.0 + 1e-5])]
    worst = check_weight_sync(trainer, [closer, close], tol=1e-3, version=4)
    assert worst.max_abs_diff == pytest.approx(2e-4, rel=1e-3)   # float32 inputs
    stale = [torch.tensor([-1.3, -2.0])]
    gap = r"policy version 7, rollout engine 1 .* 0\.3 .*rollout\.sync_check_tol=0\.001"
    with pytest.raises(WeightSyncMismatch, match=gap):
        check_weight_sync(trainer, [closer, stale], tol=1e-3, version=7)


def test_check_sequences_are_the_first_trained_samples_with_tokens():
    feats = AudioFeatures(torch.zeros(8, 100), torch.ones(100, dtype=torch.long))

    def item(uid, response):
        z = torch.zeros(len(response))
        return ExperienceItem(uid, "g", [1, 2, 3], response, feats, z, z, z)

    items = [item("a", []), item("b", [5, 6]), item("c", [7]), item("d", [8])]
    refs = check_sequences(items, 2)
    assert [(r.uid, r.prompt_ids, r.response_ids) for r in refs] == [("b", [1, 2, 3], [5, 6]), ("c", [1, 2, 3], [7])]
    assert refs[0].features is feats
