"""Rollout on vLLM (GPU machines), behind the same chunked interface as the HF engine.

vLLM keeps no sequence between `generate` calls that we could extend, so a chunk is
one `generate` over every live sequence with `max_tokens = chunk`, and continuing a
sequence is a NEW request over prompt + the tokens it has so far. With prefix caching
on, that prompt's KV blocks (audio included: vLLM hashes the multimodal input into the
block keys) are found again, so a continuation costs the new tokens, not a re-prefill.
After a weight sync the cache is reset: a carried-over sequence then continues under
the new weights, as OPPO specifies.

The audio goes in through vLLM's multimodal input for Qwen3-ASR as the log-mel
features our processor already computed (`input_audio_features`,
`audio_feature_lengths`, `feature_attention_mask`), so vLLM encodes exactly what the
trainer encodes. vLLM expands the audio placeholder itself (to as many tokens as the
trainer's processor did: the same formula), so each run of placeholders in our prompt
ids goes in as one; `prompt_token_ids` of its outputs are the expanded ids.

Log-probs are vLLM's `processed_logprobs`: under the temperature-scaled distribution
the token was sampled from. With `top_p < 1` that is the truncated distribution (the
HF engine reports the untruncated one), and suppressed tokens get a -100 logit bias.

Nothing here imports vLLM: the `LLM` object is passed in (see `rollout.factory`), so
the request building and the bookkeeping are tested on machines without it.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from asr_grpo.models.sequences import AudioFeatures
from asr_grpo.rollout.feed import FeedSink
from asr_grpo.rollout.pool import GroupQuota, SequencePool
from asr_grpo.rollout.sampling import token_seed
from asr_grpo.rollout.types import SamplingParams, SequenceState

# vLLM's per-request seed is a plain int; keep it well inside every range it accepts.
_SEED_RANGE = 2**31 - 1
SUPPRESS_BIAS = -100.0


def vllm_audio(features: AudioFeatures) -> dict[str, torch.Tensor]:
    """One utterance's features as vLLM's Qwen3-ASR takes precomputed audio (what its
    own processor would produce): the real frames only ([mel, frames]), their count and
    their mask ([1, frames])."""
    frames = int(features.mask.sum())
    return {"input_audio_features": features.features[:, :frames].contiguous(),
            "audio_feature_lengths": torch.tensor([frames], dtype=torch.long),
            "feature_attention_mask": torch.ones(1, frames, dtype=torch.long)}


def collapse_audio(ids: Sequence[int], audio_token_id: int) -> list[int]:
    """Each run of audio placeholders as one placeholder: vLLM does the expanding."""
    return [int(t) for i, t in enumerate(ids) if t != audio_token_id or i == 0 or ids[i - 1] != audio_token_id]


def tokens_prompt(prompt_ids: Sequence[int], features: AudioFeatures, audio_token_id: int) -> dict[str, Any]:
    """A vLLM TokensPrompt (a plain dict) with the utterance's audio attached."""
    return {"prompt_token_ids": collapse_audio(prompt_ids, audio_token_id),
            "multi_modal_data": {"audio": vllm_audio(features)}}


@dataclass(frozen=True)
class VLLMRequest:
    prompt: dict[str, Any]   # vllm.inputs.TokensPrompt
    params: dict[str, Any]   # keyword arguments of vllm.SamplingParams


def continuation_request(seq: SequenceState, sampling: SamplingParams, max_tokens: int | None,
                         eos_token_ids: Sequence[int], suppress_token_ids: Sequence[int],
                         audio_token_id: int) -> VLLMRequest:
    """The request that advances `seq` by up to `max_tokens` (None: to its budget):
    prompt + every token it has so far, seeded by (seed, uid, position) so the same
    partial sequence always continues the same way."""
    budget = sampling.max_new_tokens - len(seq.tokens)
    if budget <= 0:
        raise ValueError(f"sequence {seq.request.uid} has no token budget left")
    params = {"n": 1, "temperature": sampling.temperature, "top_p": sampling.top_p,
              "max_tokens": budget if max_tokens is None else min(max_tokens, budget),
              "seed": token_seed(sampling.seed, seq.request.uid, len(seq.tokens)) % _SEED_RANGE,
              "logprobs": 0, "stop_token_ids": [int(t) for t in eos_token_ids],
              "detokenize": False, "skip_special_tokens": False}
    if suppress_token_ids:
        params["logit_bias"] = {int(t): SUPPRESS_BIAS for t in suppress_token_ids}
    return VLLMRequest(tokens_prompt(seq.request.prompt_ids + seq.tokens, seq.request.features, audio_token_id),
                       params)


def apply_completion(seq: SequenceState, completion, version: int, max_new_tokens: int,
                     eos_token_ids: Sequence[int]) -> None:
    """Append one vLLM CompletionOutput (token_ids, logprobs, finish_reason) to `seq`."""
    tokens = [int(t) for t in completion.token_ids]
    if completion.logprobs is None or len(completion.logprobs) != len(tokens):
        raise RuntimeError(f"vLLM returned no log-prob for some tokens of {seq.request.uid}")
    seq.tokens.extend(tokens)
    seq.logprobs.extend(float(entry[tok].logprob) for tok, entry in zip(tokens, completion.logprobs))
    seq.versions.extend([version] * len(tokens))
    reason = completion.finish_reason
    if reason == "stop":
        if not tokens or tokens[-1] not in set(int(t) for t in eos_token_ids):
            raise RuntimeError(f"vLLM stopped {seq.request.uid} without an end-of-sequence token")
        seq.finish_reason = "stop"
    elif reason == "length" or reason is None:
        if len(seq.tokens) >= max_new_tokens:   # else only the chunk ended
            seq.finish_reason = "length"
    else:
        raise RuntimeError(f"vLLM finished {seq.request.uid} with {reason!r}")


def _vllm_sampling_params(**kwargs):
    from vllm import SamplingParams as VLLMSamplingParams

    return VLLMSamplingParams(**kwargs)


class VLLMChunkedEngine(SequencePool):
    """The chunked engine over a vLLM `LLM` (or anything with its `generate`,
    `collective_rpc`, `reset_prefix_cache`, `sleep` and `wake_up`)."""

    def __init__(self, llm, eos_token_ids: Sequence[int], sampling: SamplingParams,
                 suppress_token_ids: Sequence[int], audio_token_id: int, *,
                 make_params: Callable[..., Any] = _vllm_sampling_params):
        super().__init__()
        self.llm = llm
        self.audio_token_id = int(audio_token_id)
        self.eos = tuple(int(t) for t in eos_token_ids)
        self.suppress = tuple(int(t) for t in suppress_token_ids)
        self.sampling = sampling
        self._make_params = make_params
        self._asleep = False

    def _generate(self, requests: list[VLLMRequest]) -> list:
        self.wake_up()
        return self.llm.generate([r.prompt for r in requests], [self._make_params(**r.params) for r in requests],
                                 use_tqdm=False)

    def decode(self, max_tokens: int | None = None, stop_after_groups: int | None = None,
               stop_check_every: int = 1, feed: FeedSink | None = None) -> list[SequenceState]:
        """Advance every live sequence by up to `max_tokens` (None: to the end) in one
        `generate`; returns the sequences advanced (finished ones move to `pop_finished`).
        With `stop_after_groups=k`, generate `stop_check_every` tokens at a time and stop
        once k prompt groups have completed (each slice is a prefix-cached continuation).
        `feed`: as `SequencePool.decode` (a slice's finished sequences, after the slice)."""
        self.start_feed(feed)
        self._finish_at_budget(self.sampling.max_new_tokens)
        seqs = list(self._live)
        if not seqs:
            return []
        budget = self.sampling.max_new_tokens if max_tokens is None else max_tokens
        quota = GroupQuota(seqs, stop_after_groups) if stop_after_groups is not None else None
        step = budget if quota is None else max(1, stop_check_every)
        done = 0
        while done < budget and self._live and not (quota is not None and quota.met):
            n = min(step, budget - done)
            live = list(self._live)
            t0 = time.perf_counter()
            requests = [continuation_request(s, self.sampling, n, self.eos, self.suppress, self.audio_token_id)
                        for s in live]
            for seq, out in zip(live, self._generate(requests), strict=True):
                # Both are optional in vLLM's RequestOutput (None: not reported).
                self.stats.add_requests(len(out.prompt_token_ids or ()), int(out.num_cached_tokens or 0))
                apply_completion(seq, out.outputs[0], self._version, self.sampling.max_new_tokens, self.eos)
                if seq.done:
                    self._mark_finished(seq)
                if quota is not None and seq.done:
                    quota.finished(seq)
            self.stats.add_round(len(live), time.perf_counter() - t0, count=n)
            self._retire_finished()
            self._push_fed()
            done += n
        return seqs

    def score(self, items: Sequence) -> list[torch.Tensor]:
        """Log-probs of fixed responses (items with prompt_ids, response_ids, features)
        under the engine's current weights, from vLLM's prompt log-probs: the raw model
        distribution (temperature 1). What a sync check compares with the trainer's."""
        requests = [VLLMRequest(tokens_prompt(list(it.prompt_ids) + list(it.response_ids), it.features,
                                              self.audio_token_id),
                                {"max_tokens": 1, "temperature": 1.0, "prompt_logprobs": 0, "detokenize": False})
                    for it in items]
        out = []
        for it, result in zip(items, self._generate(requests), strict=True):
            start = len(result.prompt_token_ids) - len(it.response_ids)   # in expanded ids
            out.append(torch.tensor([result.prompt_logprobs[start + j][int(tok)].logprob
                                     for j, tok in enumerate(it.response_ids)], dtype=torch.float32))
        return out

    # ---- weights ---------------------------------------------------------------------
    def join_weight_sync(self, master_addr: str, master_port: int, first_rank: int, world_size: int,
                         backend: str, specs: list[tuple[str, tuple[int, ...]]], timeout_s: float = 600.0) -> None:
        """Every worker of this engine joins the trainer's sync group, as ranks
        first_rank .. first_rank + tensor_parallel_size - 1 (see workers.vllm_extension)."""
        self.llm.collective_rpc("asr_join_weight_sync",
                                args=(master_addr, master_port, first_rank, world_size, backend, specs, timeout_s))

    def update_weights(self, version: int) -> None:
        """Receive the trainer's broadcast into every worker, then forget whatever the
        old weights computed: cached prefixes (keys/values) and cached audio encodings."""
        if self._asleep:   # weights first: the KV cache's memory is not needed to load them
            self.llm.wake_up(tags=["weights"])
        self.llm.collective_rpc("asr_receive_weights")
        if self._asleep:
            self.llm.wake_up(tags=["kv_cache"])
            self._asleep = False
        self.llm.reset_prefix_cache()
        # The audio tower's outputs are cached by input hash (scheduler and workers);
        # vLLM exposes the reset on its engine (LLMEngine.reset_encoder_cache).
        reset_encoder = getattr(getattr(self.llm, "llm_engine", None), "reset_encoder_cache", None)
        if reset_encoder is not None:
            reset_encoder()
        self.policy_version = version

    def sleep(self, level: int = 1) -> None:
        """Colocated: hand the GPU memory to the trainer (level 1: weights to CPU, KV
        cache dropped; level 2: both dropped, fine when a sync follows). Live sequences
        stay here; they continue as new requests."""
        if not self._asleep:
            self.llm.sleep(level=level)
            self._asleep = True

    def wake_up(self) -> None:
        if self._asleep:
            self.llm.wake_up()
            self._asleep = False
