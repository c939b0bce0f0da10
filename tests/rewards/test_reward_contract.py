"""Every OpenRLHF reward file works as it is: `reward_func` gets only the keyword
arguments its signature takes, may return the rewards alone, and a signature that cannot
work is refused when the file is loaded (and by validate_config, before Ray starts)."""
import inspect
import textwrap

import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from asr_grpo.config import register_configs
from asr_grpo.config.store import CONF_DIR
from asr_grpo.config.validate import ConfigError, validate_config
from asr_grpo.rewards.loader import (
    TOOLKIT_KWARGS,
    RewardFunctionError,
    accepted_kwargs,
    call_reward_function,
    load_reward_function,
    to_reward_result,
)
from asr_grpo.workers.reward import RewardWorker

register_configs()
LABELS = ["the cat sat", "hello", "abc"]
RESPONSES = ["the cat sat", "hallo", "abcabcabc"]
# Everything the toolkit passes, as the RL loop passes it (the prompt is audio).
TOOLKIT = dict(
    responses=RESPONSES, languages=["en", "en", "en"], keywords=[["cat"], [], []],
    finish_reasons=["stop", "stop", "length"], weights={"cer": 1.0}, lm_scores=[0.9, 0.8, 0.1],
    durations=[1.5, 0.75, 3.0])
BATCH = dict(queries=RESPONSES, prompts=[""] * 3, labels=LABELS, **TOOLKIT)

CLASSIC = """
    import torch

    def reward_func(queries, prompts, labels):
        return torch.tensor([1.0 if q == l else len(l) / 10 for q, l in zip(queries, labels)])
"""
CLASSIC_REWARDS = [1.0, 0.5, 0.3]


def write(tmp_path, body, name="openrlhf_reward.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return str(path)


def test_toolkit_batch_covers_every_kwarg_the_toolkit_passes():
    assert set(TOOLKIT) == set(TOOLKIT_KWARGS)


def test_classic_openrlhf_file_runs_unchanged(tmp_path):
    path = write(tmp_path, CLASSIC)
    r = call_reward_function(load_reward_function(path), timeout_s=10.0, **BATCH)
    assert r.total.tolist() == pytest.approx(CLASSIC_REWARDS)
    assert r.scores.tolist() == pytest.approx(CLASSIC_REWARDS)
    assert r.components == {} and r.keep.all()
    # The training path: the reward worker adds the configured weights.
    out = RewardWorker(path, weights={"cer": 1.0}).score({**BATCH, "sample_ids": ["a", "b", "c"]})
    assert out["total"] == pytest.approx(CLASSIC_REWARDS)


@pytest.mark.parametrize("returned", [
    "[1.0, 0.5, 0.25]",
    "(1, 0.5, 0.25)",
    "np.array([1.0, 0.5, 0.25])",
    "np.array([4, 2, 1]) / 4",
    "[np.float32(1.0), np.float64(0.5), np.float32(0.25)]",
    "torch.tensor([1.0, 0.5, 0.25], dtype=torch.float64)",
    "{'rewards': [1.0, 0.5, 0.25]}",
])
def test_rewards_alone_or_in_a_dict(tmp_path, returned):
    path = write(tmp_path, f"import numpy as np\nimport torch\n\n"
                           f"def reward_func(queries, prompts, labels, **kwargs):\n    return {returned}\n")
    r = call_reward_function(load_reward_function(path), timeout_s=10.0, **BATCH)
    assert r.total.tolist() == [1.0, 0.5, 0.25]
    assert r.scores.tolist() == [1.0, 0.5, 0.25]


def test_to_reward_result_refuses_what_is_not_rewards():
    with pytest.raises(RewardFunctionError, match=r"f\.py: reward_func must return a dict with 'rewards', "
                                                  r"got NoneType \(or the rewards alone"):
        to_reward_result(None, 3, "f.py")
    with pytest.raises(RewardFunctionError, match=r"'rewards' has shape \(2,\), expected \(3,\)"):
        to_reward_result(np.zeros(2), 3, "f.py")


def test_named_kwargs_get_exactly_those(tmp_path):
    path = write(tmp_path, """
        SEEN = []

        def reward_func(q, p, l, languages, durations=None, *, finish_reasons, sample_rate=16000):
            SEEN.append(dict(languages=languages, durations=durations,
                             finish_reasons=finish_reasons, sample_rate=sample_rate))
            return durations
    """)
    fn = load_reward_function(path)
    r = call_reward_function(fn, timeout_s=10.0, **BATCH)
    assert r.total.tolist() == TOOLKIT["durations"]
    assert fn.__globals__["SEEN"] == [dict(languages=TOOLKIT["languages"], durations=TOOLKIT["durations"],
                                           finish_reasons=TOOLKIT["finish_reasons"], sample_rate=16000)]


def _sig(src: str):
    scope: dict = {}
    exec(f"def reward_func{src}:\n    pass\n", scope)
    return scope["reward_func"]


@pytest.mark.parametrize("signature, expected", [
    ("(queries, prompts, labels)", set()),
    ("(queries, prompts, labels, **kwargs)", set(TOOLKIT_KWARGS)),
    ("(*args, **kwargs)", set(TOOLKIT_KWARGS)),
    ("(q, p, l, responses, weights=None, *, lm_scores=None, other=1)", {"responses", "weights", "lm_scores"}),
    # The third parameter already takes the labels: `responses` by name too would bind it twice.
    ("(q, p, responses, **kwargs)", set(TOOLKIT_KWARGS) - {"responses"}),
    ("(q, p, responses, /, **kwargs)", set(TOOLKIT_KWARGS)),
])
def test_accepted_kwargs(signature, expected):
    fn = _sig(signature)
    got = accepted_kwargs(fn, TOOLKIT)
    assert set(got) == expected
    assert all(got[k] is TOOLKIT[k] for k in got)
    inspect.signature(fn).bind(1, 2, 3, **got)   # the call the toolkit makes binds


@pytest.mark.parametrize("body, pattern", [
    ("def reward_func(queries, prompts):\n    return [0.0] * len(queries)\n",
     r"reward_func\(queries, prompts\) takes 2 positional parameters; "
     r"it must take \(queries, prompts, labels\) positionally"),
    ("def reward_func(*, queries, prompts, labels):\n    return [0.0] * len(queries)\n",
     r"takes 0 positional parameters"),
    ("def reward_func(queries, prompts, labels, *, sample_rate):\n    return [0.0] * len(queries)\n",
     r"requires sample_rate, which the toolkit never passes"),
    ("def reward_func(queries, prompts, labels, audio, /, **kw):\n    return [0.0] * len(queries)\n",
     r"requires audio, which the toolkit never passes"),
])
def test_unworkable_signature_is_refused_at_load_in_one_line(tmp_path, body, pattern):
    path = write(tmp_path, body)
    with pytest.raises(RewardFunctionError, match=pattern) as err:
        load_reward_function(path)
    msg = str(err.value)
    assert msg.startswith(f"reward file {path}: ") and "\n" not in msg


def test_unworkable_function_passed_directly_is_refused_under_drop(tmp_path):
    with pytest.raises(RewardFunctionError, match="takes 2 positional parameters"):
        call_reward_function(lambda queries, prompts: [0.0] * 3, timeout_s=10.0, on_bad="drop", **BATCH)


def _compose(overrides):
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


def test_validate_config_refuses_an_unworkable_reward_file(tmp_path):
    path = write(tmp_path, "def reward_func(queries, prompts):\n    return [0.0] * len(queries)\n")
    with pytest.raises(ConfigError) as err:
        validate_config(_compose([f"reward.reward_file={path}"]))
    msg = str(err.value)
    assert msg.startswith(f"invalid configuration: reward.reward_file: reward file {path}: ")
    assert "takes 2 positional parameters" in msg and "\n" not in msg


def test_validate_config_loads_a_classic_file_and_skips_a_served_reward(tmp_path):
    validate_config(_compose([f"reward.reward_file={write(tmp_path, CLASSIC)}"]))
    cfg = _compose([f"reward.reward_file={tmp_path / 'missing.py'}"])
    with pytest.raises(ConfigError, match=r"missing\.py: not found"):
        validate_config(cfg)
    # With reward.remote.urls the file is not loaded; setting both is refused as ambiguous.
    cfg.reward.remote.urls = ["http://127.0.0.1:9"]
    with pytest.raises(ConfigError, match="both set") as err:
        validate_config(cfg)
    assert "not found" not in str(err.value)
