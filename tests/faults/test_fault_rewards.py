"""Bad reward files, one injected fault at a time, under both `reward.on_bad_reward`
policies: "error" raises naming the file, the component and the samples; "drop" keeps
the good samples and drops the affected ones, never passing a NaN on. A broken contract
(wrong length or type, a file that does not import) raises under both. The same
faults on a live run (a step failing before any update) are in test_fault_workers."""
from __future__ import annotations

import math

import pytest
import torch

from asr_grpo.rewards import RewardFunctionError
from asr_grpo.workers.reward import RewardWorker

IDS = ["a#0", "a#1", "b#0"]
BATCH = {"queries": ["x", "y", "z"], "prompts": [""] * 3, "labels": ["the cat", "the dog", "a bird"],
         "responses": ["the cat", "the dog", "a bird"], "languages": ["en"] * 3, "keywords": [[], [], []],
         "finish_reasons": ["stop"] * 3, "sample_ids": IDS}
HEAD = "import math, time\n\ndef reward_func(queries, prompts, labels, **kw):\n"

# fault -> (body of reward_func, what "error" must say, the keep mask under "drop" or None: raises too)
FAULTS = {
    "raises": ("    raise RuntimeError('boom')\n",
               r"reward_func raised RuntimeError: boom \(3 samples: \[a#0, a#1, b#0\]\)", [False] * 3),
    "raises on one sample": ("    if 'the dog' in labels: raise KeyError('dog')\n"
                             "    return {'rewards': [1.0] * len(labels)}\n",
                             r"reward_func raised KeyError: 'dog' \(3 samples", [True, False, True]),
    "returns NaN": ("    return {'rewards': [1.0, math.nan, 0.5]}\n",
                    r"non-finite values in rewards: samples \['a#1'\]", [True, False, True]),
    "returns inf in a component": (
        "    return {'rewards': [1.0] * 3, 'extra_logs': {'fluency': [0.1, 0.2, math.inf]}}\n",
        r"extra_logs/fluency: samples \['b#0'\]", [True, True, False]),
    "hangs": ("    time.sleep(3)\n", r"did not return within 0.5 s \(3 samples: \[a#0, a#1, b#0\]\)", [False] * 3),
    "wrong length": ("    return {'rewards': [1.0, 1.0]}\n", r"'rewards' has shape \(2,\), expected \(3,\)", None),
    "wrong type": ("    return {'rewards': 'high'}\n", r"'rewards' must be a tensor or a list of numbers, got str",
                   None),
}


def worker(tmp_path, body: str, policy: str) -> tuple[RewardWorker, str]:
    path = tmp_path / "bad_reward.py"
    path.write_text(HEAD + body)
    return RewardWorker(str(path), timeout_s=0.5, on_bad_reward=policy), str(path)


@pytest.mark.parametrize("fault", list(FAULTS))
def test_reward_fault_raises_or_drops_only_the_affected_samples(tmp_path, fault):
    body, pattern, keep = FAULTS[fault]
    strict, path = worker(tmp_path, body, "error")
    with pytest.raises(RewardFunctionError, match=pattern) as err:
        strict.score(BATCH)
    assert f"reward file {path}" in str(err.value)
    dropper, _ = worker(tmp_path, body, "drop")
    if keep is None:   # a broken contract is a bug in the file, not in a sample
        with pytest.raises(RewardFunctionError, match=pattern):
            dropper.score(BATCH)
        return
    out = dropper.score(BATCH)
    assert out["keep"] == keep
    values = [out["total"], out["scores"], *out["components"].values()]
    assert all(math.isfinite(v) for vs in values for v in vs)
    assert all(v == 0.0 for vs in values for v, k in zip(vs, keep) if not k)
    if fault == "hangs":   # its thread is still running: the worker says so (the driver restarts it)
        assert out["hung_calls"] > 0


@pytest.mark.parametrize("retries", [0, 1])
def test_a_call_that_hangs_once_is_tried_again_before_the_policy(tmp_path, retries):
    # hangs on its first call only: a stall in what it calls out to, which passes
    body = ("    global CALLS\n    CALLS = globals().get('CALLS', 0) + 1\n"
            "    if CALLS == 1: time.sleep(3)\n    return {'rewards': [float(len(l)) for l in labels]}\n")
    path = tmp_path / "stalls_once.py"
    path.write_text(HEAD + body)
    strict = RewardWorker(str(path), timeout_s=0.5, on_bad_reward="error", hang_retries=retries)
    if not retries:
        with pytest.raises(RewardFunctionError, match="did not return within 0.5 s"):
            strict.score(BATCH)
        return
    out = strict.score(BATCH)
    assert out["total"] == [7.0, 7.0, 6.0] and out["keep"] == [True] * 3
    assert out["hung_calls"] >= 1   # the first call's thread still runs: the driver restarts the worker


def test_a_reward_file_that_does_not_import_fails_at_start(tmp_path):
    path = tmp_path / "broken.py"
    path.write_text("import numpy_but_misspelt\n")
    for policy in ("error", "drop"):
        with pytest.raises(RewardFunctionError, match=r"import failed: ModuleNotFoundError") as err:
            RewardWorker(str(path), on_bad_reward=policy)
        assert str(path) in str(err.value)


def test_good_samples_keep_their_exact_rewards_when_others_drop(tmp_path):
    body = ("    if 'the dog' in labels: raise KeyError('dog')\n"
            "    return {'rewards': [float(len(l)) for l in labels], 'extra_logs': {'n': [1.0] * len(labels)}}\n")
    dropper, _ = worker(tmp_path, body, "drop")
    out = dropper.score(BATCH)
    assert out["total"] == [7.0, 0.0, 6.0] and out["components"]["n"] == [1.0, 0.0, 1.0]
    assert torch.tensor(out["keep"]).tolist() == [True, False, True]
