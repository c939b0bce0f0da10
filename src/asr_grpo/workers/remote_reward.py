"""A Ray actor that sends rewards to a reward service over HTTP (`reward.remote.urls`).

It is an async actor: the calls of one step (a whole batch under overlap=none, or one
per decoded chunk under intra/oppo) wait on the network side by side in one event loop,
so a call never holds the next one back; the client's own cap bounds what is in flight.
Its `score` has the local `RewardWorker`'s signature and answer, so the experience maker
does not know which one it talks to.
"""
from __future__ import annotations

from typing import Any, Mapping

from asr_grpo.rewards.remote import RemoteRewardClient
from asr_grpo.rewards.request import reward_request
from asr_grpo.rollout.types import SequenceResult


class RemoteRewardWorker:
    """The constructor's arguments mirror `RewardConfig` (`remote` is its `remote` block);
    `tokenizer_path`: the checkpoint whose tokenizer decodes what a rollout host's feed
    sends (`score_finished`)."""

    def __init__(self, remote: Mapping[str, Any], weights: Mapping[str, float] | None = None,
                 on_bad_reward: str = "error", seed: int | None = None, tokenizer_path: str | None = None) -> None:
        self.weights = dict(weights) if weights else None
        self.tokenizer = None
        if tokenizer_path:   # only where hosts feed it
            from asr_grpo.models.builder import load_processor
            self.tokenizer = load_processor(tokenizer_path).tokenizer
        self.client = RemoteRewardClient(remote["urls"], batch_size=remote["batch_size"],
                                         max_in_flight=remote["max_in_flight"], timeout_s=remote["timeout_s"],
                                         retries=remote["retries"], backoff_s=remote["backoff_s"],
                                         backoff_max_s=remote["backoff_max_s"], on_bad=str(on_bad_reward),
                                         seed=seed)

    async def score(self, batch: Mapping[str, Any]) -> dict:
        batch = dict(batch)
        if self.weights is not None:
            batch.setdefault("weights", self.weights)
        result = await self.client.score(batch)
        return {**result.to_dict(), "hung_calls": 0}   # no threads of user code here to hang

    async def score_finished(self, seqs: list[SequenceResult], utterances: list[Mapping[str, Any]]) -> dict:
        """`score` for sequences a decoding host sent as they finished (rollout/feed.py):
        decoded here, into the rows the experience maker would have sent."""
        if self.tokenizer is None:
            raise RuntimeError("score_finished needs the worker's tokenizer_path (the policy checkpoint)")
        texts = self.tokenizer.batch_decode([s.tokens for s in seqs], skip_special_tokens=True)
        return await self.score(reward_request(texts, utterances, seqs))

    def take_request_stats(self) -> dict[str, float]:
        """reward/remote/*: requests, retries, failures and round trips since the last call."""
        return self.client.take_stats().as_metrics()

    def take_busy_seconds(self) -> float:
        return 0.0   # it waits on the network; it never computes

