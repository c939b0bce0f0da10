"""The rollout's metrics as MLflow logs them: how stale the trained tokens were, and what
a vLLM engine's prefix cache saved."""
from __future__ import annotations

from typing import Iterable


def staleness_histogram(staleness: Iterable[int]) -> dict[str, float]:
    """MLflow metrics for the policy-version lag of the sequences trained on in a step.

    Keys: `overlap/staleness_mean`, `overlap/staleness_max`, `overlap/staleness_frac_ge1`
    and `overlap/staleness_count/k` for every k in 0..max. Empty input gives zeros.
    """
    given = list(staleness)
    if any(isinstance(s, bool) or int(s) != s for s in given):
        raise ValueError(f"staleness must be whole numbers of versions, got {given}")
    values = [int(s) for s in given]
    if any(v < 0 for v in values):
        raise ValueError(f"staleness must be >= 0, got {min(values)}")
    top = max(values, default=0)
    counts = [0] * (top + 1)
    for v in values:
        counts[v] += 1
    n = len(values)
    out = {
        "overlap/staleness_mean": sum(values) / n if n else 0.0,
        "overlap/staleness_max": float(top),
        "overlap/staleness_frac_ge1": (n - counts[0]) / n if n else 0.0,
    }
    out.update({f"overlap/staleness_count/{k}": float(c) for k, c in enumerate(counts)})
    return out


def prefix_cache_metrics(stats: dict) -> dict[str, float]:
    """vLLM engines: the continuation prompts' tokens and the share its prefix cache held."""
    sent = stats.get("request_prompt_tokens", 0)
    if not sent:
        return {}
    return {"perf/decode/request_prompt_tokens": float(sent),
            "perf/decode/prefix_cache_hit": stats.get("cached_prompt_tokens", 0) / sent}
