"""The rollout's metrics: the staleness histogram and the vLLM prefix-cache share."""
from __future__ import annotations

import pytest

from asr_grpo.tracking.rollout_metrics import prefix_cache_metrics, staleness_histogram


def test_staleness_histogram_counts():
    m = staleness_histogram([0, 0, 1, 3, 1, 0])
    assert m == {
        "overlap/staleness_mean": pytest.approx(5 / 6),
        "overlap/staleness_max": 3.0,
        "overlap/staleness_frac_ge1": 0.5,
        "overlap/staleness_count/0": 3.0,
        "overlap/staleness_count/1": 2.0,
        "overlap/staleness_count/2": 0.0,
        "overlap/staleness_count/3": 1.0,
    }
    assert all(type(v) is float for v in m.values())


def test_staleness_histogram_empty_and_all_fresh():
    zeros = {"overlap/staleness_mean": 0.0, "overlap/staleness_max": 0.0,
             "overlap/staleness_frac_ge1": 0.0, "overlap/staleness_count/0": 0.0}
    assert staleness_histogram([]) == zeros
    assert staleness_histogram([0, 0]) == {**zeros, "overlap/staleness_count/0": 2.0}


@pytest.mark.parametrize("bad", [[1, -1], [1, 0.5], [True]])
def test_staleness_histogram_rejects_what_is_not_a_version_lag(bad):
    with pytest.raises(ValueError, match="staleness"):
        staleness_histogram(bad)


def test_prefix_cache_share_only_where_prompts_were_sent():
    assert prefix_cache_metrics({"request_prompt_tokens": 0}) == {}
    assert prefix_cache_metrics({"request_prompt_tokens": 200, "cached_prompt_tokens": 150}) == {
        "perf/decode/request_prompt_tokens": 200.0, "perf/decode/prefix_cache_hit": 0.75}
