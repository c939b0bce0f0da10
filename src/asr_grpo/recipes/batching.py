"""Length-grouped batches with an audio-seconds budget, so long-form utterances don't
blow up memory and short ones don't waste padding."""
from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np


def length_grouped_batches(durations: Sequence[float], max_batch_size: int, max_batch_seconds: float,
                           rng: np.random.Generator, pool_factor: int = 32,
                           shortest_first: bool = False) -> Iterator[list[int]]:
    """One epoch of batches: shuffle, sort within pools of ~pool_factor batches, cut by budget, shuffle.

    shortest_first (SortaGrad): one pool, batches in increasing length. Short utterances
    first let a model trained from scratch find the audio-text alignment sooner.
    """
    order = rng.permutation(len(durations))
    pool = len(order) if shortest_first else max_batch_size * pool_factor
    batches: list[list[int]] = []
    for start in range(0, len(order), pool):
        chunk = sorted(order[start:start + pool], key=lambda i: durations[i])
        batch: list[int] = []
        longest = 0.0
        for i in chunk:
            longest_if_added = max(longest, durations[i])
            # Padded cost of a batch = size x longest member.
            if batch and (len(batch) >= max_batch_size or longest_if_added * (len(batch) + 1) > max_batch_seconds):
                batches.append(batch)
                batch, longest_if_added = [], durations[i]
            batch.append(int(i))
            longest = longest_if_added
        if batch:
            batches.append(batch)
    for b in (range(len(batches)) if shortest_first else rng.permutation(len(batches))):
        yield batches[b]
