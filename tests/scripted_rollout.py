"""A rollout with scripted lengths, no model and no Ray (importable: `tests/` is on
pytest's pythonpath): hosts whose engine runs the real round-by-round decode loop and
group quota, and emits lengths chosen by hand, so what overcommit must carry and which
groups must train are known."""
from __future__ import annotations

import zlib

from asr_grpo.experience.types import PromptGroup
from asr_grpo.rollout.host import EngineHost
from asr_grpo.rollout.pool import SequencePool

EOS, TOKEN = 0, 7
B, N = 4, 4


def scripted_length(uid: str) -> int:
    """Every fourth prompt runs long (one sample of it: 40 tokens), the rest 3-8."""
    group, sample = uid.split("#")
    index = int(group.rsplit("-", 1)[1])
    if index % 4 == 3 and sample == "0":
        return 40
    return 3 + zlib.crc32(uid.encode()) % 6


class ScriptedEngine(SequencePool):
    def __init__(self, max_new_tokens: int = 64):
        super().__init__(max_new_tokens, {EOS})

    def _advance(self, quota) -> int:
        live = [s for s in self._live if not s.done]
        for s in live:
            last = len(s.tokens) + 1 >= scripted_length(s.request.uid)
            self._append(s, EOS if last else TOKEN, -1.0, quota)
        return len(live)


class ScriptedHost(EngineHost):
    def __init__(self):
        self.engine = ScriptedEngine()


def prompts():
    count = iter(range(10_000))

    def new_groups(k: int, step: int = 0) -> list[PromptGroup]:
        return [PromptGroup(f"p-{i}", {"language": "en"}, [1, 2], None, N, step)
                for i in (next(count) for _ in range(k))]
    return new_groups
