"""The text LM behind `reward.smoothness_scorer: lm`: its training (recipes/text_lm_training.py),
fluency, save/load, batch-invariant scoring, the cache (recipes/text_lm_cache.py), and
`lm_scores` in the built-in reward."""
from __future__ import annotations

import json

import numpy as np
import pytest
import soundfile as sf
import torch
from omegaconf import OmegaConf

from asr_grpo.config.schema import RunConfig
from asr_grpo.data.templates import sample_sentence
from asr_grpo.models import train_tokenizer
from asr_grpo.models.text_lm import (
    TextLMSettings,
    encode_training_sequence,
    fluency_from_logprobs,
    fluency_scores,
    language_context_ids,
    load_text_lm,
    response_ids,
    response_token_logprobs,
    save_text_lm,
    start_token_id,
    text_lm_metadata,
)
from asr_grpo.recipes.text_lm_cache import ensure_text_lm
from asr_grpo.recipes.text_lm_training import train_text_lm
from asr_grpo.rewards import (
    BUILTIN_REWARD_FILE,
    DEFAULT_WEIGHTS,
    RewardFunctionError,
    call_reward_function,
    load_reward_function,
)
from asr_grpo.workers.reward import RewardWorker

SETTINGS = TextLMSettings(hidden=64, intermediate=128, steps=60, batch_size=16, lr=5e-3, seed=0)


def _corpus(n: int, seed: int) -> tuple[list[str], list[str]]:
    rng = np.random.default_rng(seed)
    langs = ["en" if rng.random() < 0.6 else "zh" for _ in range(n)]
    return [sample_sentence(rng, lang).text for lang in langs], langs


@pytest.fixture(scope="module")
def corpus():
    return _corpus(200, seed=0)


@pytest.fixture(scope="module")
def tok(corpus):
    return train_tokenizer(corpus[0], vocab_size=600)


@pytest.fixture(scope="module")
def trained(tok, corpus):
    return train_text_lm(tok, *corpus, SETTINGS)


def _eos(tok) -> int:
    return tok.convert_tokens_to_ids("<|im_end|>")


def test_training_sequence_is_the_asr_response_format(tok):
    ids = encode_training_sequence(tok, "turn on the lights", "en")
    assert tok.decode(ids) == "<|im_start|>language English<asr_text>turn on the lights<|im_end|>"
    assert ids[0] == start_token_id(tok)
    assert tok.decode(language_context_ids(tok, "Chinese")) == "language Chinese<asr_text>"
    assert language_context_ids(tok, "zh") == language_context_ids(tok, "Chinese")
    with pytest.raises(ValueError, match="unknown language"):
        language_context_ids(tok, "xx")


def test_loss_drops_and_training_is_deterministic(tok, corpus, trained):
    first, last = np.mean(trained.losses[:5]), np.mean(trained.losses[-5:])
    assert len(trained.losses) == SETTINGS.steps
    assert last < 0.7 * first, (first, last)
    assert 0 < trained.reference_nll < first
    assert trained.num_train_texts + trained.num_heldout_texts == len(corpus[0])
    assert 0 < sum(p.numel() for p in trained.model.parameters()) < 1_000_000
    again = train_text_lm(tok, *corpus, SETTINGS)
    assert again.losses == trained.losses


def test_real_sentences_are_more_fluent_than_shuffled_or_looping_ones(tok, trained):
    texts, langs = _corpus(30, seed=1)        # unseen sentences from the same templates
    rng = np.random.default_rng(2)
    real, shuffled, loops, ctx = [], [], [], []
    for text in texts:
        ids = tok.encode(text, add_special_tokens=False)
        real.append(ids + [_eos(tok)])
        perm = rng.permutation(len(ids))
        if (perm == np.arange(len(ids))).all():
            perm = perm[::-1]
        shuffled.append([ids[i] for i in perm] + [_eos(tok)])
        loops.append(ids * 3)                 # a loop cut at the token cap: no EOS
    ctx = [language_context_ids(tok, lang) for lang in langs]
    model, start = trained.model, start_token_id(tok)

    def score(rs, ref):
        return np.array(fluency_scores(model, rs, start, ctx, ref))

    for ref in (0.0, trained.reference_nll):
        f_real, f_shuf, f_loop = score(real, ref), score(shuffled, ref), score(loops, ref)
        assert ((0 <= f_real) & (f_real <= 1)).all()
        assert f_real.mean() > f_shuf.mean() and f_real.mean() > f_loop.mean()
        assert (f_real > f_shuf).mean() >= 0.9 and (f_real >= f_loop).mean() >= 0.9
    # Calibrated: a typical corpus sentence is fully fluent.
    assert np.median(score(real, trained.reference_nll)) == 1.0


def test_save_load_round_trip_gives_identical_logprobs(tok, corpus, trained, tmp_path):
    path = save_text_lm(trained.model, tok, tmp_path / "lm", {"reference_nll": trained.reference_nll})
    loaded = load_text_lm(path)
    assert loaded.config.bos_token_id == start_token_id(tok)
    assert loaded.config.fluency_reference_nll == pytest.approx(trained.reference_nll)
    assert text_lm_metadata(path)["reference_nll"] == trained.reference_nll
    responses = [response_ids(tok, t) for t in corpus[0][:8]]
    ctx = [language_context_ids(tok, lang) for lang in corpus[1][:8]]
    a = response_token_logprobs(trained.model, responses, start_token_id(tok), ctx)
    b = response_token_logprobs(loaded, responses, start_token_id(tok), ctx)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert fluency_scores(loaded, responses, contexts=ctx) == fluency_scores(
        trained.model, responses, start_token_id(tok), ctx, trained.reference_nll)


def test_batched_scoring_equals_one_at_a_time(tok, corpus, trained):
    texts, langs = corpus
    responses = [response_ids(tok, t) for t in texts[:10]]
    responses += [[], [_eos(tok)], response_ids(tok, texts[0]) * 3]   # empty, EOS only, long
    ctx = [language_context_ids(tok, lang) for lang in langs[:10]] + [[], language_context_ids(tok, "en"), []]
    start = start_token_id(tok)
    batched = response_token_logprobs(trained.model, responses, start, ctx)
    chunked = response_token_logprobs(trained.model, responses, start, ctx, batch_size=3)
    for i, (r, c) in enumerate(zip(responses, ctx)):
        alone = response_token_logprobs(trained.model, [r], start, [c])[0]
        assert batched[i].shape == (len(r),) and batched[i].dtype == torch.float32
        torch.testing.assert_close(batched[i], alone, atol=1e-5, rtol=0)
        torch.testing.assert_close(chunked[i], alone, atol=1e-5, rtol=0)
        assert (batched[i] <= 0).all()
    assert fluency_from_logprobs(batched[10]) == 0.0          # empty -> 0


def test_context_conditions_but_is_not_scored(tok, trained):
    """A full response (`language X<asr_text>...`) scored without context ends with
    the same values as the bare response scored after the language tag."""
    start, tag = start_token_id(tok), language_context_ids(tok, "en")
    bare = response_ids(tok, "turn on the lights in the kitchen")
    full, bare_lp = response_token_logprobs(trained.model, [tag + bare, bare], start, [[], tag])
    assert full.shape == (len(tag) + len(bare),)
    torch.testing.assert_close(full[len(tag):], bare_lp, atol=1e-5, rtol=0)


def test_fluency_from_logprobs():
    assert fluency_from_logprobs(torch.zeros(0)) == 0.0
    assert fluency_from_logprobs(torch.zeros(4)) == 1.0
    assert fluency_from_logprobs(torch.full((3,), -2.0)) == pytest.approx(np.exp(-2.0))
    assert fluency_from_logprobs(torch.full((3,), -2.0), reference_nll=1.5) == pytest.approx(np.exp(-0.5))
    assert fluency_from_logprobs(torch.full((3,), -1.0), reference_nll=1.5) == 1.0
    assert fluency_from_logprobs(torch.tensor([-float("inf"), -1.0])) == 0.0


def _manifest(root, texts, langs):
    lines = []
    for i, (text, lang) in enumerate(zip(texts, langs)):
        sf.write(root / f"{i}.wav", np.zeros(3200, dtype=np.float32), 16000)
        lines.append(json.dumps({"id": f"u{i}", "audio": f"{i}.wav", "text": text,
                                 "language": lang, "duration": 0.2}))
    path = root / "train.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_ensure_text_lm_builds_once_and_rebuilds_when_stale(tok, tmp_path, monkeypatch):
    from asr_grpo.recipes import text_lm_cache

    texts, langs = _corpus(30, seed=3)
    train = _manifest(tmp_path, texts, langs)
    cfg = OmegaConf.structured(RunConfig)
    cfg.paths.output_root = str(tmp_path / "out")
    cfg.data.train_manifest = cfg.data.dev_manifest = cfg.data.test_manifest = str(train)
    cfg.reward.text_lm_hidden, cfg.reward.text_lm_intermediate = 32, 64
    cfg.reward.text_lm_steps, cfg.reward.text_lm_batch_size = 3, 4
    calls = []
    real_train = text_lm_cache.train_text_lm
    monkeypatch.setattr(text_lm_cache, "train_text_lm",
                        lambda *a, **k: calls.append(1) or real_train(*a, **k))

    path = ensure_text_lm(cfg, tokenizer=tok)
    assert path == tmp_path / "out" / "checkpoints" / "text-lm" and len(calls) == 1
    meta = text_lm_metadata(path)
    assert meta["settings"]["steps"] == 3 and meta["num_train_texts"] == 30
    assert load_text_lm(path).config.hidden_size == 32
    assert ensure_text_lm(cfg, tokenizer=tok) == path and len(calls) == 1     # cached
    cfg.reward.text_lm_steps = 4                                              # stale
    ensure_text_lm(cfg, tokenizer=tok)
    assert len(calls) == 2 and text_lm_metadata(path)["settings"]["steps"] == 4
    cfg.model.path = ""
    with pytest.raises(ValueError, match="needs the ASR tokenizer"):
        ensure_text_lm(cfg)


# ------------------------------------------------------------------- reward integration

BATCH = {
    "prompts": [""] * 3,
    "labels": ["the cat sat on the mat", "我爱北京天安门", "the"],
    "responses": ["The cat sat on the mat.", "我爱北京天门", "the the the the"],
    "languages": ["en", "zh", "en"],
    "keywords": [["cat"], ["北京"], []],
    "finish_reasons": ["stop", "stop", "length"],
}
BATCH["queries"] = list(BATCH["responses"])


def _call(**extra):
    fn = load_reward_function(BUILTIN_REWARD_FILE)
    return call_reward_function(fn, **BATCH, **extra)


def test_reward_without_lm_scores_is_unchanged():
    base = _call()
    assert sorted(base.components) == sorted(DEFAULT_WEIGHTS)
    assert torch.equal(_call(lm_scores=None).total, base.total)
    assert base.components["smoothness"][2] < 0.1          # the rule score of the loop


def test_reward_uses_lm_scores_as_smoothness_and_logs_the_rule_score():
    base = _call()
    lm = [0.9, 0.5, 0.25]
    got = _call(lm_scores=lm)
    torch.testing.assert_close(got.components["smoothness"], torch.tensor(lm))
    torch.testing.assert_close(got.components["smoothness_rule"], base.components["smoothness"])
    for k in ("cer", "keyword", "language"):
        assert torch.equal(got.components[k], base.components[k])
    w = DEFAULT_WEIGHTS
    expected = [(sum(w[k] * float(base.components[k][i]) for k in ("cer", "keyword", "language"))
                 + w["smoothness"] * lm[i]) / sum(w.values()) for i in range(3)]
    torch.testing.assert_close(got.total, torch.tensor(expected))
    torch.testing.assert_close(got.scores, got.total)
    # A tensor works too; with the smoothness weight at 0 the LM score has no effect.
    assert torch.equal(_call(lm_scores=torch.tensor(lm)).total, got.total)
    no_smooth = {**w, "smoothness": 0.0}
    assert torch.equal(_call(lm_scores=lm, weights=no_smooth).total,
                       _call(weights=no_smooth).total)


def test_reward_worker_forwards_lm_scores():
    worker = RewardWorker(reward_file="", weights=DEFAULT_WEIGHTS)
    out = worker.score({**BATCH, "lm_scores": [0.1, 0.2, 0.3]})
    assert out["components"]["smoothness"] == pytest.approx([0.1, 0.2, 0.3])
    assert "smoothness_rule" in out["components"]
    assert "smoothness_rule" not in worker.score(dict(BATCH))["components"]


def test_bad_lm_scores():
    with pytest.raises(RewardFunctionError, match="lm_scores has 2 values for 3 samples"):
        _call(lm_scores=[0.5, 0.5])
    with pytest.raises(RewardFunctionError, match=r"must lie in \[0, 1\]"):
        _call(lm_scores=[0.5, 1.5, 0.5])
    # Non-finite: the on_bad policy decides, as for any reward value.
    with pytest.raises(RewardFunctionError, match="non-finite"):
        _call(lm_scores=[0.5, float("nan"), 0.5])
    dropped = _call(lm_scores=[0.5, float("nan"), 0.5], on_bad="drop")
    assert dropped.keep.tolist() == [True, False, True]
