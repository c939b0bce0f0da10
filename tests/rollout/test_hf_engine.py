"""The chunked HF engine: chunked == one-shot, resumable, batch-independent sampling,
and its behaviour log-probs equal the scorer's forward pass."""
from __future__ import annotations

import copy

import pytest
import torch
from helpers import noise_audio

from asr_grpo.models import suppressed_token_ids
from asr_grpo.models.sequences import encode_prompt, pack_sequences, response_logprobs
from asr_grpo.rollout import HFChunkedEngine, RolloutRequest, SamplingParams, sample_tokens, top_p_filter


@pytest.fixture(scope="module")
def requests(tiny_processor):
    reqs = []
    for j, (secs, lang) in enumerate([(1.0, "en"), (2.6, "zh"), (0.7, "en")]):
        prompt_ids, feats = encode_prompt(tiny_processor, noise_audio(secs, j), lang)
        reqs += [RolloutRequest(f"u{j}#{k}", f"u{j}", prompt_ids, feats) for k in range(3)]
    return reqs


def _engine(model, tok, max_new=24, batch=64, temperature=1.0, top_p=1.0, seed=7):
    eos = [tok.eos_token_id, tok.pad_token_id]
    return HFChunkedEngine(model, eos, tok.pad_token_id, SamplingParams(temperature, top_p, max_new, seed),
                           max_batch_size=batch, suppress_token_ids=suppressed_token_ids(tok, eos))


def _run(engine, reqs, chunk=None):
    engine.add_requests(copy.deepcopy(reqs))
    calls = 0
    while engine.live():
        engine.decode(chunk)
        calls += 1
    return sorted(engine.pop_finished(), key=lambda s: s.request.uid), calls


@pytest.mark.parametrize("chunk,batch", [(1, 64), (3, 4), (5, 2), (1000, 64)])
def test_chunked_decode_equals_one_shot(tiny_model, tiny_tokenizer, requests, chunk, batch):
    one_shot, calls = _run(_engine(tiny_model, tiny_tokenizer), requests)
    assert calls == 1
    chunked, chunk_calls = _run(_engine(tiny_model, tiny_tokenizer, batch=batch), requests, chunk)
    if chunk < 24:
        assert chunk_calls > 1
    for a, b in zip(one_shot, chunked):
        assert a.request.uid == b.request.uid
        assert a.tokens == b.tokens
        assert a.finish_reason == b.finish_reason
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)


def test_sampling_depends_on_seed_and_uid_not_on_batch(tiny_model, tiny_tokenizer, requests):
    full, _ = _run(_engine(tiny_model, tiny_tokenizer), requests)
    alone, _ = _run(_engine(tiny_model, tiny_tokenizer), requests[4:5])
    assert alone[0].tokens == next(s for s in full if s.request.uid == requests[4].uid).tokens
    other_seed, _ = _run(_engine(tiny_model, tiny_tokenizer, seed=8), requests)
    assert [s.tokens for s in other_seed] != [s.tokens for s in full]
    # Samples of one group differ from each other (distinct uids -> distinct noise).
    group = [s.tokens for s in full if s.request.group == "u1"]
    assert len({tuple(t) for t in group}) > 1


def test_finish_reasons_and_lengths(tiny_model, tiny_tokenizer, requests):
    done, _ = _run(_engine(tiny_model, tiny_tokenizer, max_new=6), requests)
    eos = {tiny_tokenizer.eos_token_id, tiny_tokenizer.pad_token_id}
    for s in done:
        assert 1 <= len(s.tokens) <= 6
        assert len(s.logprobs) == len(s.tokens) == len(s.versions)
        if s.finish_reason == "stop":
            assert s.tokens[-1] in eos
        else:
            assert s.finish_reason == "length" and len(s.tokens) == 6 and s.tokens[-1] not in eos


def test_partial_sequences_resume_with_their_tokens(tiny_model, tiny_tokenizer, requests):
    """Carry-over: stop after 2 tokens, move the partials to a new engine with a new
    policy version, and they finish exactly as an uninterrupted decode would."""
    first = _engine(tiny_model, tiny_tokenizer)
    first.add_requests(copy.deepcopy(requests))
    first.decode(2)
    partial = first.live() + first.pop_finished()
    kept = {s.request.uid: list(s.tokens) for s in partial}
    second = _engine(tiny_model, tiny_tokenizer)
    second.policy_version = 1
    second.add_sequences([s for s in partial if not s.done])
    second.decode(None)
    resumed = {s.request.uid: s for s in second.pop_finished() + [s for s in partial if s.done]}
    reference, _ = _run(_engine(tiny_model, tiny_tokenizer), requests)
    for ref in reference:
        got = resumed[ref.request.uid]
        assert got.tokens == ref.tokens
        assert got.tokens[:len(kept[ref.request.uid])] == kept[ref.request.uid]
        if len(got.tokens) > 2:
            assert got.versions[:2] == [0, 0] and set(got.versions[2:]) == {1}


def test_behaviour_logprobs_equal_scoring_forward(tiny_model, tiny_tokenizer, requests):
    done, _ = _run(_engine(tiny_model, tiny_tokenizer, temperature=0.7), requests)
    batch = pack_sequences([s.request.prompt_ids for s in done], [s.tokens for s in done],
                           [s.request.features for s in done], tiny_tokenizer.pad_token_id)
    with torch.no_grad():
        scored = response_logprobs(tiny_model, batch, temperature=0.7)
    for i, s in enumerate(done):
        assert scored[i, :len(s.tokens)].tolist() == pytest.approx(s.logprobs, abs=1e-4)
        assert scored[i, len(s.tokens):].abs().sum() == 0


def test_greedy_is_argmax(tiny_model, tiny_tokenizer, requests):
    done, _ = _run(_engine(tiny_model, tiny_tokenizer, temperature=0.0, max_new=5), requests[:1])
    s = done[0]
    batch = pack_sequences([s.request.prompt_ids], [s.tokens], [s.request.features], tiny_tokenizer.pad_token_id)
    with torch.no_grad():
        logits = tiny_model(**batch.model_inputs()).logits[0, batch.prompt_width - 1:-1]
    assert logits.argmax(-1).tolist()[:len(s.tokens)] == s.tokens


def test_top_p_keeps_the_smallest_set_reaching_p():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = torch.isfinite(top_p_filter(logits, 0.7))[0].tolist()
    assert kept == [True, True, False, False]
    assert torch.isfinite(top_p_filter(logits, 0.01))[0].tolist() == [True, False, False, False]
    assert torch.equal(top_p_filter(logits, 1.0), logits)


def test_special_tokens_are_never_sampled(tiny_model, tiny_tokenizer, requests):
    eos = [tiny_tokenizer.eos_token_id, tiny_tokenizer.pad_token_id]
    banned = suppressed_token_ids(tiny_tokenizer, eos)
    assert tiny_tokenizer.convert_tokens_to_ids(tiny_tokenizer.audio_token) in banned
    assert not set(eos) & set(banned)
    logits = torch.zeros(3, len(tiny_tokenizer))
    logits[:, banned[0]] = 50.0     # overwhelmingly likely, yet suppressed
    tokens, logp = sample_tokens(logits, 1.0, 1.0, 0, uids=["a", "b", "c"], positions=[0, 0, 0],
                                 suppress=torch.tensor(banned))
    assert not set(tokens.tolist()) & set(banned)
    assert torch.allclose(logp, logits.log_softmax(-1).gather(-1, tokens[:, None]).squeeze(-1))
    done, _ = _run(_engine(tiny_model, tiny_tokenizer, max_new=24), requests)
    assert not {t for s in done for t in s.tokens} & set(banned)
