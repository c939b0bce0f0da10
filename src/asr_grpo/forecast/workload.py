"""The prompts a simulated run draws and how long their responses run.

A prompt group's lengths are a function of its uid and the seed alone, so every mode
sees the same prompts with the same lengths in the same order: the modes differ only in
what the scheduler does with them. Lengths come from a lognormal mixture across prompts
(each sample spread around its prompt's length), a histogram, or an explicit table."""
from __future__ import annotations

import json
import math
import random
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from asr_grpo.config.schema import trained_per_group
from asr_grpo.experience.types import PromptGroup

GroupLengths = Callable[[random.Random, int], list[int]]   # (rng, n) -> natural lengths of n samples


@dataclass
class Component:
    weight: float
    median: float
    sigma: float


def lognormal_mixture(components: Sequence[Component], sample_sigma: float) -> GroupLengths:
    total = sum(c.weight for c in components)
    if total <= 0:
        raise ValueError("lengths: the components' weights sum to 0")

    def draw(rng: random.Random, n: int) -> list[int]:
        u, acc = rng.random() * total, 0.0
        comp = components[-1]
        for c in components:
            acc += c.weight
            if u < acc:
                comp = c
                break
        base = math.log(max(1.0, comp.median)) + comp.sigma * rng.gauss(0.0, 1.0)
        return [max(1, round(math.exp(base + sample_sigma * rng.gauss(0.0, 1.0)))) for _ in range(n)]
    return draw


def histogram(values: Sequence[int] | Sequence[Sequence[int]]) -> GroupLengths:
    """Lengths drawn from observed ones: whole groups when the file holds groups (their
    samples keep their correlation), else each sample independently."""
    if not values:
        raise ValueError("lengths: the histogram is empty")
    if isinstance(values[0], (list, tuple)):
        groups = [[int(x) for x in g] for g in values]

        def draw(rng: random.Random, n: int) -> list[int]:
            g = rng.choice(groups)
            return list(g) if len(g) == n else [rng.choice(g) for _ in range(n)]
        return draw
    flat = [int(v) for v in values]
    return lambda rng, n: [rng.choice(flat) for _ in range(n)]


def read_histogram(path: str) -> list:
    """A JSON list of lengths (or of per-group lists, or {"lengths": [...]}), or one length per line."""
    text = Path(path).read_text()
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return [int(float(x)) for x in text.split()]
    return data["lengths"] if isinstance(data, dict) else data


@dataclass
class Workload:
    """Prompt groups for the scheduler, their lengths for the engines, their prompt sizes
    for prefill and scoring."""
    lengths: GroupLengths | None
    B: int
    n: int
    max_new_tokens: int
    prompt_text_tokens: int = 32
    audio_tokens_per_token: float = 0.0   # prompt grows with the response (ASR: audio ~ transcript)
    seed: int = 0
    train_samples: int | None = None   # at most this many of a group's n train (max-variance); None: all n
    scripted: Callable[[str], list[int]] | None = None   # group uid -> lengths (tests: lengths chosen by hand)
    _cache: dict[str, tuple[list[int], int]] = field(default_factory=dict)

    @property
    def train_share(self) -> float:
        """The share of a group's samples that is scored after the rollout and trained: the
        rewards of all n choose them first (`algorithm.train_samples_per_prompt`)."""
        return trained_per_group(self.n, self.train_samples) / self.n

    def _group(self, group_uid: str) -> tuple[list[int], int]:
        got = self._cache.get(group_uid)
        if got is None:
            if self.scripted is not None:
                natural = list(self.scripted(group_uid))
            else:
                natural = self.lengths(random.Random(zlib.crc32(f"{self.seed}:{group_uid}".encode())), self.n)
            audio = self.audio_tokens_per_token * sorted(natural)[len(natural) // 2]
            got = self._cache[group_uid] = (natural, self.prompt_text_tokens + round(audio))
        return got

    def natural_length(self, seq_uid: str) -> int:
        """The length this sample would reach without a cap (its EOS position)."""
        group, k = seq_uid.rsplit("#", 1)
        return self._group(group)[0][int(k)]

    def target_length(self, seq_uid: str) -> int:
        return min(self.natural_length(seq_uid), self.max_new_tokens)

    def prompt_tokens(self, group_uid: str) -> int:
        return self._group(group_uid)[1]

    def source(self) -> Callable[[int, int], list[PromptGroup]]:
        """new_groups(k, step): the next k prompt groups, numbered in order."""
        count = iter(range(10 ** 9))

        def new_groups(k: int, step: int) -> list[PromptGroup]:
            # Prompt ids of the group's prompt size: the scheduler's cost model reads it.
            return [PromptGroup(f"p-{i}", {"language": "en"}, [0] * self.prompt_tokens(f"p-{i}"), None, self.n, step,
                                item_index=i) for i in (next(count) for _ in range(k))]
        return new_groups

    def sample_lengths(self, groups: int = 2000) -> list[list[int]]:
        """Capped lengths of `groups` prompt groups (the report's distribution summary)."""
        return [[min(x, self.max_new_tokens) for x in self._group(f"p-{i}")[0]] for i in range(groups)]
