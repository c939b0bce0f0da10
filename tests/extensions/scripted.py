"""A model-free chunked engine for the extension tests: every sequence is TOKEN, TOKEN, EOS."""
from __future__ import annotations

from asr_grpo.experience.types import PromptGroup
from asr_grpo.rollout.pool import SequencePool

EOS, TOKEN, LENGTH = 0, 7, 3


class ThreeTokenEngine(SequencePool):
    def __init__(self):
        super().__init__(max_new_tokens=16, eos={EOS})

    def _advance(self, quota) -> int:
        live = [s for s in self._live if not s.done]
        for s in live:
            self._append(s, EOS if len(s.tokens) + 1 >= LENGTH else TOKEN, -1.0, quota)
        return len(live)


def prompt_groups(count: int, n: int, step: int = 0, first: int = 0) -> list[PromptGroup]:
    return [PromptGroup(f"p-{i}", {"language": "en"}, [1], None, n, step)
            for i in range(first, first + count)]
