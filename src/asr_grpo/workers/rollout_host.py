"""The chunked-engine API a role exposes over Ray (policy ranks when colocated, rollout
workers when separate). Results travel without the prompt audio."""
from __future__ import annotations

from asr_grpo.config.schema import AlgorithmConfig
from asr_grpo.distributed.faults import RestartAware
from asr_grpo.rollout import (
    ChunkedEngine,
    HFChunkedEngine,
    RolloutRequest,
    SamplingParams,
    SequenceResult,
    SequenceState,
)
from asr_grpo.tracking import busy
from asr_grpo.workers.base import phase


def sampling_params(algo: AlgorithmConfig, seed: int) -> SamplingParams:
    return SamplingParams(temperature=algo.temperature, top_p=algo.top_p,
                          max_new_tokens=algo.max_new_tokens, seed=seed)


def hf_engine(cfg, model, pad_id: int) -> HFChunkedEngine:
    """The HF chunked engine a role decodes with (policy ranks, HF rollout workers)."""
    gen = model.generation_config
    return HFChunkedEngine(model, gen.eos_token_id, pad_id, sampling_params(cfg.algorithm, cfg.seed),
                           max_batch_size=cfg.trainer.rollout_batch_size, suppress_token_ids=gen.suppress_tokens)


class RolloutHost(RestartAware):
    """After a restart (rollout workers are restartable) `add_requests` and `decode`
    refuse to run until the driver has put the weights and sequences back
    (`resume_sequences`, then `mark_restored`)."""

    engine: ChunkedEngine   # HFChunkedEngine or VLLMChunkedEngine

    def add_requests(self, requests: list[RolloutRequest]) -> int:
        self.refuse_if_restarted("its live sequences")
        self.engine.add_requests(requests)
        return len(self.engine.live())

    def resume_sequences(self, requests: list[RolloutRequest], partial: list[SequenceResult]) -> int:
        """Put partial sequences (from a checkpoint) back: they continue where they stopped."""
        states = [SequenceState(req, list(p.tokens), list(p.logprobs), list(p.versions), p.finish_reason)
                  for req, p in zip(requests, partial, strict=True)]
        self.engine.add_sequences(states)
        return len(self.engine.live())

    @busy
    @phase("solo")
    def decode(self, max_tokens: int | None = None, stop_after_groups: int | None = None,
               stop_check_every: int = 1) -> list[SequenceResult]:
        """Advance every live sequence (up to `max_tokens`, or until `stop_after_groups`
        groups completed); returns the state of each sequence touched (finished ones
        included, so nothing needs `pop_finished` afterwards)."""
        self.refuse_if_restarted("its live sequences and weights")
        model = getattr(self.engine, "model", None)   # the HF engine's; vLLM has none here
        if model is not None:
            model.eval()
        touched = [s.result() for s in self.engine.decode(max_tokens, stop_after_groups, stop_check_every)]
        self.engine.pop_finished()
        return touched

    def take_decode_stats(self) -> dict:
        """Decode-round and prefill costs measured since the last call (cost model input)."""
        return self.engine.take_stats()

    def num_live(self) -> int:
        return len(self.engine.live())

    def set_policy_version(self, version: int) -> None:
        self.engine.policy_version = version
