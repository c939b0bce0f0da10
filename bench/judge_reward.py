"""The `remote_reward` benchmark's judge: a reward file for `asr-grpo-reward-server` that
stands for a throughput-bound reward model on another machine (an LLM judge, a larger
ASR model on its own GPU, batching what it is sent).

It serves sequences, not requests: ASR_GRPO_JUDGE_SLOTS sequences at once, each for
ASR_GRPO_JUDGE_SECONDS_PER_SEQUENCE seconds, first come first served over every request
in flight (a request's sequences spread over the free slots, as a batching server's
would). The time is spent in `time.sleep` on the slots' threads: a wait that takes no
local core, as a remote GPU's compute takes none of ours. A request is answered when
its last sequence is through; then the built-in multi-part ASR reward scores the batch,
so training sees the real reward. The server's own `--concurrency` must admit every
request the client keeps in flight, so that only the slots bound the service.
"""
import os
import time
from concurrent.futures import ThreadPoolExecutor

from asr_grpo.rewards.asr_reward import reward_func as asr_reward

SECONDS_PER_SEQUENCE = float(os.environ.get("ASR_GRPO_JUDGE_SECONDS_PER_SEQUENCE", "0"))
SLOTS = ThreadPoolExecutor(max_workers=int(os.environ.get("ASR_GRPO_JUDGE_SLOTS", "4")),
                           thread_name_prefix="judge-slot")


def reward_func(queries, prompts, labels, **kwargs):
    if SECONDS_PER_SEQUENCE > 0:   # the executor's queue is first in, first out
        list(SLOTS.map(time.sleep, [SECONDS_PER_SEQUENCE] * len(queries)))
    return asr_reward(queries, prompts, labels, **kwargs)
