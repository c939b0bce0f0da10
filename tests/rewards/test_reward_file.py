"""The reward-file contract: the built-in file, user files, and every way one can fail."""
import math
import textwrap
import time

import pytest
import torch

from asr_grpo.rewards import (
    BUILTIN_REWARD_FILE,
    RewardFunctionError,
    RewardResult,
    call_reward_function,
    load_reward_function,
    sanitize,
)
from asr_grpo.workers.reward import RewardWorker

PROMPT = "<|im_start|>user<|audio_pad|><|im_end|><|im_start|>assistant\n"
BATCH = dict(
    prompts=[PROMPT] * 3,
    labels=["the cat sat on the mat", "我爱北京天安门", "the"],
    responses=["language English<asr_text>The cat sat on the mat.",
               "language English<asr_text>我爱北京天门",
               "the the the the"],
    languages=["en", "zh", "en"],
    keywords=[["cat"], ["北京", "天安门"], []],
    finish_reasons=["stop", "stop", "length"],
)
BATCH["queries"] = [p + r for p, r in zip(BATCH["prompts"], BATCH["responses"])]

# Hand-computed components of BATCH (see asr_grpo.rewards.components for formulas):
# 1: perfect. 2: one deletion of 7, one of two keywords, script right but tag says
# English (x0.5). 3: untagged loop, 12 insertions on 3 chars (cer 0), trigram repeats
# 1/2, length ratio 5, truncated.
EXPECTED = {
    "cer": [1.0, 6 / 7, 0.0],
    "keyword": [1.0, 0.5, 1.0],
    "language": [1.0, 0.5, 1.0],
    "smoothness": [1.0, 1.0, 0.5 * math.exp(-2 * (5 - 1.5)) * 0.1],
}


def weighted(weights):
    return [sum(w * EXPECTED[k][i] for k, w in weights.items()) / sum(weights.values())
            for i in range(3)]


def write(tmp_path, body, name="my_reward.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return str(path)


def call(fn, **overrides):
    kwargs = {**BATCH, "timeout_s": 5.0, "sample_ids": ["u1#0", "u2#0", "u3#0"], **overrides}
    return call_reward_function(fn, **kwargs)


@pytest.mark.parametrize("path", [None, ""])
def test_builtin_file_returns_contract_keys_and_values(path):
    fn = load_reward_function(path)
    out = fn(BATCH["queries"], BATCH["prompts"], BATCH["labels"],
             **{k: BATCH[k] for k in ("responses", "languages", "keywords", "finish_reasons")})
    assert set(out) == {"rewards", "scores", "extra_logs"}
    assert set(out["extra_logs"]) == set(EXPECTED)
    for k, v in EXPECTED.items():
        assert out["extra_logs"][k].shape == (3,)
        assert out["extra_logs"][k].tolist() == pytest.approx(v, abs=1e-6), k
    expected_total = weighted({"cer": 1.0, "keyword": 0.3, "language": 0.2, "smoothness": 0.2})
    assert out["rewards"].tolist() == pytest.approx(expected_total, abs=1e-6)
    assert torch.equal(out["scores"], out["rewards"])


def test_builtin_through_call_with_weights_and_derived_responses():
    fn = load_reward_function(None)
    r = call(fn, responses=None, weights={"cer": 1.0, "language": 1.0})
    assert isinstance(r, RewardResult) and len(r) == 3
    assert r.total.tolist() == pytest.approx(weighted({"cer": 1.0, "language": 1.0}), abs=1e-6)
    assert r.keep.all() and r.num_dropped == 0
    log = r.log()
    assert log["reward/cer"] == pytest.approx(sum(EXPECTED["cer"]) / 3, abs=1e-6)
    assert log["reward/dropped"] == 0.0


def test_user_file_with_its_own_formula(tmp_path):
    path = write(tmp_path, """
        import torch
        from asr_grpo.rewards import utterance_cer

        def reward_func(queries, prompts, labels, **kwargs):
            lengths = [float(len(label)) for label in labels]
            cers = [utterance_cer(r, l, lang) for r, l, lang
                    in zip(kwargs["responses"], labels, kwargs["languages"])]
            return {"rewards": torch.tensor(lengths) / 10,
                    "scores": [1.0, 2.0, 3.0],
                    "extra_logs": {"cer_raw": cers, "n": torch.ones(3, dtype=torch.int64)}}
    """)
    r = call(load_reward_function(path), responses=["the cat sat on the mat", "我爱北京", "x"])
    assert r.total.tolist() == pytest.approx([2.2, 0.7, 0.3])
    assert r.scores.tolist() == [1.0, 2.0, 3.0]
    assert r.components["cer_raw"].tolist() == pytest.approx([0.0, 3 / 7, 1.0])
    assert r.components["n"].dtype == torch.float32
    assert set(r.log()) == {"reward/total", "reward/cer_raw", "reward/n", "reward/dropped"}


def test_two_files_with_the_same_name_do_not_shadow(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    body = "def reward_func(q, p, l, **kw):\n    return {'rewards': [%s] * len(q)}\n"
    fa = load_reward_function(write(a, body % "1.0", "reward.py"))
    fb = load_reward_function(write(b, body % "2.0", "reward.py"))
    assert call(fa).total.tolist() == [1.0] * 3
    assert call(fb).total.tolist() == [2.0] * 3


@pytest.mark.parametrize("body, pattern", [
    ("def reward_func(q, p, l, **kw):\n    return 1 / 0\n",
     r"reward_func raised ZeroDivisionError: division by zero"),
    ("def reward_func(q, p, l, **kw):\n    return {'rewards': [1.0, 2.0]}\n",
     r"'rewards' has shape \(2,\), expected \(3,\)"),
    ("def reward_func(q, p, l, **kw):\n    return {'rewards': 'abc'}\n",
     r"'rewards' must be a tensor or a list of numbers, got str"),
    ("def reward_func(q, p, l, **kw):\n    return {'rewards': ['1', '2', '3']}\n",
     r"'rewards' must be a tensor or a list of numbers, got list"),
    ("def reward_func(q, p, l, **kw):\n    return None\n",
     r"must return a dict with 'rewards', got NoneType"),
    ("def reward_func(q, p, l, **kw):\n    return {'reward': [1.0] * 3}\n",
     r"must return a dict with 'rewards', got dict with keys \['reward'\]"),
    ("def reward_func(q, p, l, **kw):\n"
     "    return {'rewards': [1.0] * 3, 'extra_logs': {'fluency': [1.0]}}\n",
     r"'extra_logs/fluency' has shape \(1,\), expected \(3,\)"),
    ("def reward_func(q, p, l, **kw):\n"
     "    return {'rewards': [1.0] * 3, 'extra_logs': [1.0]}\n",
     r"'extra_logs' must be a dict, got list"),
])
def test_bad_outputs_raise_naming_file_and_cause(tmp_path, body, pattern):
    path = write(tmp_path, body)
    with pytest.raises(RewardFunctionError, match=pattern) as err:
        call(load_reward_function(path))
    assert path in str(err.value)


def test_exception_is_chained(tmp_path):
    path = write(tmp_path, "def reward_func(q, p, l, **kw):\n    raise KeyError('languages')\n")
    with pytest.raises(RewardFunctionError) as err:
        call(load_reward_function(path))
    assert isinstance(err.value.__cause__, KeyError)


NAN_FILE = """
    import math
    def reward_func(q, p, l, **kw):
        return {"rewards": [1.0, math.nan, 0.5],
                "extra_logs": {"fluency": [0.1, 0.2, math.inf], "ok": [1.0, 1.0, 1.0]}}
"""


def test_non_finite_values_raise_naming_component_and_samples(tmp_path):
    path = write(tmp_path, NAN_FILE)
    with pytest.raises(RewardFunctionError) as err:
        call(load_reward_function(path))
    msg = str(err.value)
    assert path in msg
    assert "rewards: samples ['u2#0'] (indices [1])" in msg
    assert "extra_logs/fluency: samples ['u3#0'] (indices [2])" in msg
    assert "extra_logs/ok" not in msg


def test_drop_policy_masks_bad_samples_and_never_returns_nan(tmp_path):
    path = write(tmp_path, NAN_FILE)
    r = call(load_reward_function(path), on_bad="drop")
    assert r.keep.tolist() == [True, False, False]
    assert r.num_dropped == 2
    for t in (r.total, r.scores, *r.components.values()):
        assert torch.isfinite(t).all()
    assert r.total.tolist() == [1.0, 0.0, 0.0]
    assert r.components["fluency"].tolist() == pytest.approx([0.1, 0.0, 0.0])
    log = r.log()
    assert log == pytest.approx({"reward/total": 1.0, "reward/fluency": 0.1,
                                 "reward/ok": 1.0, "reward/dropped": 2.0})
    assert all(math.isfinite(v) for v in log.values())


def test_sanitize_keeps_clean_results_and_checks_policy():
    r = RewardResult(total=torch.tensor([0.5, 1.0]))
    assert sanitize(r, "drop") is r
    with pytest.raises(ValueError, match="on_bad must be one of"):
        sanitize(r, "ignore")
    all_nan = sanitize(RewardResult(total=torch.tensor([math.nan])), "drop")
    assert all_nan.log()["reward/total"] == 0.0 and all_nan.num_dropped == 1


def test_hang_past_timeout_raises_promptly(tmp_path):
    path = write(tmp_path, "import time\ndef reward_func(q, p, l, **kw):\n"
                           "    time.sleep(5)\n    return {'rewards': [0.0] * len(q)}\n")
    start = time.monotonic()
    with pytest.raises(RewardFunctionError, match=r"did not return within 0.5 s") as err:
        call(load_reward_function(path), timeout_s=0.5)
    assert time.monotonic() - start < 3.0
    assert path in str(err.value)


@pytest.mark.parametrize("body, pattern", [
    ("import no_such_module_xyz\n", r"import failed: ModuleNotFoundError: .*no_such_module_xyz"),
    ("def reward_func(:\n", r"import failed: SyntaxError"),
    ("def other(q, p, l):\n    return {}\n", r"defines no callable `reward_func`"),
    ("reward_func = 3\n", r"defines no callable `reward_func`"),
])
def test_load_failures_name_the_file(tmp_path, body, pattern):
    path = write(tmp_path, body)
    with pytest.raises(RewardFunctionError, match=pattern) as err:
        load_reward_function(path)
    assert path in str(err.value)


def test_missing_file(tmp_path):
    with pytest.raises(RewardFunctionError, match=r"nope\.py: not found"):
        load_reward_function(str(tmp_path / "nope.py"))
    assert BUILTIN_REWARD_FILE.is_file()


def test_mismatched_batch_lengths():
    with pytest.raises(ValueError, match=r"same length, got \{'queries': 3, 'prompts': 1"):
        call(load_reward_function(None), prompts=[PROMPT])


def test_reward_worker_in_process(tmp_path):
    w = RewardWorker("", weights={"cer": 1.0})
    out = w.score({**BATCH, "sample_ids": ["a", "b", "c"]})
    assert out["total"] == pytest.approx(EXPECTED["cer"], abs=1e-6)
    assert out["keep"] == [True] * 3
    assert set(out["components"]) == set(EXPECTED)
    dropper = RewardWorker(write(tmp_path, NAN_FILE), on_bad_reward="drop")
    assert dropper.score(BATCH)["keep"] == [True, False, False]
