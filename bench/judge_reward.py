"""The `remote_reward` benchmark's judge: a reward file for `asr-grpo-reward-server` that
stands for a throughput-bound reward model on another machine (an LLM judge, a larger
ASR model on its own GPU).

Each request holds one of the server's `--concurrency` slots for
ASR_GRPO_JUDGE_SECONDS_PER_SEQUENCE seconds per sequence in it, spent in `time.sleep`:
a wait that takes no local core, as a remote GPU's compute takes none of ours. Then the
built-in multi-part ASR reward scores the batch, so training sees the real reward.
"""
import os
import time

from asr_grpo.rewards.asr_reward import reward_func as asr_reward

SECONDS_PER_SEQUENCE = float(os.environ.get("ASR_GRPO_JUDGE_SECONDS_PER_SEQUENCE", "0"))


def reward_func(queries, prompts, labels, **kwargs):
    time.sleep(SECONDS_PER_SEQUENCE * len(queries))
    return asr_reward(queries, prompts, labels, **kwargs)
