"""The Ray face of a streaming scorer (reference, critic, LM reward model): one call
per decoded chunk registers new sequences, feeds the tokens so far and returns the
per-token scores of the sequences that finished.

After a restart (Ray restarts these roles) the caches are gone, and Ray may run the
calls it retries in another order than they were sent: until the driver's next step
starts (`begin_step`) every `stream` call raises `WorkerRestarted`, and the
driver scores the sequences of those calls again in one shot."""
from __future__ import annotations

import contextlib
import os

import torch

from asr_grpo.distributed.faults import RestartAware
from asr_grpo.experience.types import SequenceRef
from asr_grpo.models.streaming import StreamingScorer
from asr_grpo.tracking import busy
from asr_grpo.workers.threads import phase


class StreamScoringRole(RestartAware):
    scorer: StreamingScorer
    pad_id: int

    def start_streaming(self, forward, score, **scorer_kwargs) -> None:
        """Build the scorer the `stream` calls feed, and lower this process's priority:
        scoring is background work beside the actor's decode, the critical path, so on
        shared cores the OS runs the actor first (`overlap.scorer_nice`)."""
        if self.cfg.overlap.scorer_nice > 0:
            os.nice(self.cfg.overlap.scorer_nice)
        self.scorer = StreamingScorer(forward, self.pad_id, score, max_batch_size=self.cfg.trainer.rollout_batch_size,
                                      **scorer_kwargs)

    def stream_prompt(self, ref: SequenceRef) -> tuple[list[int], object]:
        """What this scorer prefills before the response: (prompt ids, audio features)."""
        return ref.prompt_ids, ref.features

    def stream_result(self, scores: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Per-token scores of finished sequences -> what this role returns for them."""
        return scores

    def scoring_weights(self):
        """Context in which the scorer's weights are usable (ZeRO-3 gathers them)."""
        return contextlib.nullcontext()

    @busy
    @phase("shared")   # beside the decode
    def stream(self, register: list[SequenceRef], feed: dict[str, list[int]],
               finish: list[str]) -> dict[str, torch.Tensor]:
        self.refuse_if_restarted("its streaming caches")
        with self.scoring_weights():
            for ref in register:
                self.scorer.register(ref.uid, *self.stream_prompt(ref))
            if feed:
                self.scorer.feed(feed)
            return self.stream_result(self.scorer.finish(finish))

    def begin_step(self, keep: list[str], weights_changed: bool) -> list[str]:
        """A new step: keep the carried sequences `keep` (their KV caches too, unless
        this scorer's weights changed: then they are re-prefilled when next fed) and
        forget every other (a sequence whose `finish` a restart lost would stay
        registered). Returns what it kept: after a restart, nothing."""
        self.scorer.retain(keep)
        if weights_changed:
            self.scorer.reset_caches()
        self.mark_restored()
        return self.scorer.registered()
