"""Streamed scoring (chunk by chunk, KV cache kept per sequence) equals one-shot scoring
of the finished sequence: reference log-probs and critic values, for several chunk
sizes, sequences arriving at different times, and a cache reset mid-stream."""
from __future__ import annotations

import pytest
import torch
from helpers import noise_audio

from asr_grpo.models.critic import ValueModel, response_values, value_forward
from asr_grpo.models.kv_batch import causal_lm_forward
from asr_grpo.models.sequences import encode_prompt, pack_sequences, response_logprobs
from asr_grpo.models.streaming import StreamingScorer, identity_score, score_once, token_logprobs

TEMPERATURE = 0.9


@pytest.fixture(scope="module")
def sequences(tiny_processor, tiny_tokenizer):
    """Prompts with audio of different lengths and responses of different lengths (0..23)."""
    g = torch.Generator().manual_seed(0)
    vocab = len(tiny_tokenizer)
    out = []
    for j, (secs, lang, n) in enumerate([(1.0, "en", 23), (2.6, "zh", 5), (0.7, "en", 1), (1.7, "zh", 0),
                                         (1.2, "en", 14)]):
        prompt_ids, feats = encode_prompt(tiny_processor, noise_audio(secs, j), lang)
        response = torch.randint(5, vocab, (n,), generator=g).tolist()
        out.append((f"u{j}", prompt_ids, feats, response))
    return out


@pytest.fixture(scope="module")
def value_model(tiny_model):
    vm = ValueModel(tiny_model.model, tiny_model.config.text_config.hidden_size).eval()
    torch.nn.init.normal_(vm.value_head.weight, std=0.5)   # a non-trivial head
    return vm


def one_shot(model, seqs, pad_id, kind):
    batch = pack_sequences([s[1] for s in seqs], [s[3] for s in seqs], [s[2] for s in seqs], pad_id)
    with torch.no_grad():
        full = (response_logprobs(model, batch, TEMPERATURE) if kind == "logprobs"
                else response_values(model, batch))
    return {s[0]: full[i, :len(s[3])] for i, s in enumerate(seqs)}


def stream(scorer, seqs, chunk, late=(), reset_at=None):
    """Feed `chunk` new tokens per round; sequences in `late` join two rounds later."""
    results, round_ = {}, 0
    pending = {s[0]: s for s in seqs}
    joined = set()
    while pending:
        feed = {}
        for uid, (_, prompt, feats, resp) in list(pending.items()):
            if uid in late and round_ < 2:
                continue
            if uid not in joined:
                scorer.register(uid, prompt, feats)
                joined.add(uid)
            upto = min(len(resp), (round_ + 1 - (2 if uid in late else 0)) * chunk)
            feed[uid] = resp[:upto]
        scorer.feed(feed)
        done = [u for u, toks in feed.items() if len(toks) == len(pending[u][3])]
        results.update(scorer.finish(done))
        for u in done:
            del pending[u]
        round_ += 1
        if reset_at is not None and round_ == reset_at:
            scorer.reset_caches()
    assert len(scorer) == 0
    return results


@pytest.mark.parametrize("chunk", [1, 3, 7, 1000])
@pytest.mark.parametrize("kind", ["logprobs", "values"])
def test_streamed_scoring_equals_one_shot(tiny_model, tiny_tokenizer, value_model, sequences, chunk, kind):
    pad = tiny_tokenizer.pad_token_id
    if kind == "logprobs":
        model, scorer = tiny_model, StreamingScorer(lambda: causal_lm_forward(tiny_model), pad,
                                                    token_logprobs(TEMPERATURE), max_batch_size=2)
    else:
        model, scorer = value_model, StreamingScorer(lambda: value_forward(value_model), pad, identity_score,
                                                     max_batch_size=2)
    expected = one_shot(model, sequences, pad, kind)
    got = stream(scorer, sequences, chunk, late={"u1", "u4"})
    assert set(got) == set(expected)
    for uid, ref in expected.items():
        assert got[uid].shape == ref.shape
        torch.testing.assert_close(got[uid], ref, atol=2e-5, rtol=1e-5)


def test_reset_caches_rescores_under_new_weights(tiny_model, tiny_tokenizer, value_model, sequences):
    """After a reset the tokens so far are re-prefilled: scores match the model's
    current weights, with nothing lost or counted twice."""
    pad = tiny_tokenizer.pad_token_id
    scorer = StreamingScorer(lambda: value_forward(value_model), pad, identity_score)
    old_head = value_model.value_head.weight.detach().clone()
    try:
        results, pending = {}, {s[0]: s for s in sequences}
        for s in sequences:
            scorer.register(s[0], s[1], s[2])
        scorer.feed({u: s[3][:4] for u, s in pending.items()})
        with torch.no_grad():
            value_model.value_head.weight.mul_(-2.0)   # "the critic was updated"
        scorer.reset_caches()
        scorer.feed({u: s[3] for u, s in pending.items()})
        results = scorer.finish(list(pending))
        expected = one_shot(value_model, sequences, pad, "values")
        for uid, ref in expected.items():
            torch.testing.assert_close(results[uid], ref, atol=2e-5, rtol=1e-5)
    finally:
        with torch.no_grad():
            value_model.value_head.weight.copy_(old_head)


def test_unregistered_or_shrinking_sequence_is_an_error(tiny_model, tiny_tokenizer, sequences):
    scorer = StreamingScorer(lambda: causal_lm_forward(tiny_model), tiny_tokenizer.pad_token_id,
                             token_logprobs())
    with pytest.raises(KeyError, match="never registered"):
        scorer.feed({"nope": [1, 2]})
    uid, prompt, feats, resp = sequences[0]
    scorer.register(uid, prompt, feats)
    scorer.feed({uid: resp[:6]})
    with pytest.raises(ValueError, match="shrank"):
        scorer.feed({uid: resp[:3]})


def test_streamed_text_lm_equals_one_shot(tiny_tokenizer, sequences):
    """The LM reward model: audio-free prompt (start token + language context)."""
    from asr_grpo.models.text_lm import (
        TextLMSettings,
        build_text_lm,
        language_context_ids,
        response_token_logprobs,
        start_token_id,
    )

    lm = build_text_lm(tiny_tokenizer, TextLMSettings(hidden=32, layers=1, intermediate=64)).eval()
    start = start_token_id(tiny_tokenizer)
    langs = ["en", "zh", "en", "zh", "en"]
    ctx = [language_context_ids(tiny_tokenizer, lang) for lang in langs]
    expected = response_token_logprobs(lm, [s[3] for s in sequences], start, ctx)
    for chunk in (1, 4, 1000):
        scorer = StreamingScorer(lambda: causal_lm_forward(lm), tiny_tokenizer.pad_token_id, token_logprobs(),
                                 use_audio=False)
        lm_seqs = [(s[0], [start, *c], None, s[3]) for s, c in zip(sequences, ctx)]
        got = stream(scorer, lm_seqs, chunk, late={"u2"})
        for s, ref in zip(sequences, expected):
            torch.testing.assert_close(got[s[0]], ref, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", ["logprobs", "values"])
def test_samples_of_one_prompt_share_its_prefill(tiny_model, value_model, tiny_tokenizer, sequences, kind):
    """score_once with 3 samples per prompt (one features object each, as a GRPO group
    has) prefills each prompt once and still equals the full forward per sequence."""
    g = torch.Generator().manual_seed(1)
    groups = []
    for uid, prompt, feats, _ in sequences[:3]:
        for k in range(3):
            n = int(torch.randint(0, 12, (1,), generator=g))
            response = torch.randint(5, len(tiny_tokenizer), (n,), generator=g).tolist()
            groups.append((f"{uid}#{k}", prompt, feats, response))
    model = tiny_model if kind == "logprobs" else value_model
    base = causal_lm_forward(tiny_model) if kind == "logprobs" else value_forward(value_model)
    prefilled_rows = []

    def counting(cache=None, **inputs):
        if cache is None:   # a prefill: count its rows
            prefilled_rows.append(inputs["input_ids"].shape[0])
        return base(cache=cache, **inputs)

    score = token_logprobs(TEMPERATURE) if kind == "logprobs" else identity_score
    got = score_once(lambda: counting, tiny_tokenizer.pad_token_id, score, [s[0] for s in groups],
                     [s[1] for s in groups], [s[2] for s in groups], [s[3] for s in groups])
    assert prefilled_rows == [3]   # 9 sequences, 3 distinct prompts
    want = one_shot(model, groups, tiny_tokenizer.pad_token_id, kind)
    for s, out in zip(groups, got):
        torch.testing.assert_close(out, want[s[0]], rtol=1e-4, atol=1e-4)
