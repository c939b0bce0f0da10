"""The chunked-engine API a role exposes over Ray (policy ranks when colocated, rollout
workers when separate): `rollout/host.EngineHost`'s calls, restart-aware and timed."""
from __future__ import annotations

from asr_grpo.config.schema import AlgorithmConfig
from asr_grpo.distributed.faults import RestartAware
from asr_grpo.rollout import HFChunkedEngine, SamplingParams, SequenceResult
from asr_grpo.rollout.feed import FeedSink
from asr_grpo.rollout.host import EngineHost
from asr_grpo.tracking import busy
from asr_grpo.workers.threads import phase


def sampling_params(algo: AlgorithmConfig, seed: int) -> SamplingParams:
    return SamplingParams(temperature=algo.temperature, top_p=algo.top_p,
                          max_new_tokens=algo.max_new_tokens, seed=seed)


def hf_engine(cfg, model, pad_id: int) -> HFChunkedEngine:
    """The HF chunked engine a role decodes with (policy ranks, HF rollout workers)."""
    gen = model.generation_config
    return HFChunkedEngine(model, gen.eos_token_id, pad_id, sampling_params(cfg.algorithm, cfg.seed),
                           max_batch_size=cfg.trainer.rollout_batch_size, suppress_token_ids=gen.suppress_tokens)


class RolloutHost(RestartAware, EngineHost):
    """After a restart (rollout workers are restartable) `add_requests` and `decode`
    refuse to run until the driver has put the weights and sequences back
    (`resume_sequences`, then `mark_restored`). `engine` is an HFChunkedEngine or a
    VLLMChunkedEngine."""

    @busy
    @phase("solo")
    def decode(self, max_tokens: int | None = None, stop_after_groups: int | None = None,
               stop_check_every: int = 1, feed: FeedSink | None = None) -> list[SequenceResult]:
        model = getattr(self.engine, "model", None)   # the HF engine's; vLLM has none here
        if model is not None:
            model.eval()
        return EngineHost.decode(self, max_tokens, stop_after_groups, stop_check_every, feed)

