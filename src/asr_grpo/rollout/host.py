"""The calls the rollout scheduler makes on a rollout host, over any chunked engine.

A host holds one engine and its live sequences between steps. The Ray roles that roll
out (`workers/rollout_host.RolloutHost`: policy ranks, rollout workers, vLLM engines) and
the forecast's simulated hosts (`forecast/hosts.SimHost`) are both an `EngineHost`, so the
scheduler drives them the same way. Results travel without the prompt audio."""
from __future__ import annotations

from asr_grpo.rollout.feed import FeedSink
from asr_grpo.rollout.types import ChunkedEngine, RolloutRequest, SequenceResult, SequenceState


class EngineHost:
    """`engine` is set by the subclass. A host whose process can restart overrides
    `refuse_if_restarted` and `mark_restored` (`distributed/faults.RestartAware`)."""

    engine: ChunkedEngine

    def refuse_if_restarted(self, what: str) -> None:
        """A host that cannot lose its state to a restart never refuses."""

    def mark_restored(self) -> None:
        """Called by the scheduler once it has put a restarted host's state back."""

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

    def decode(self, max_tokens: int | None = None, stop_after_groups: int | None = None,
               stop_check_every: int = 1, feed: FeedSink | None = None) -> list[SequenceResult]:
        """Advance every live sequence (up to `max_tokens`, or until `stop_after_groups`
        groups completed); returns the state of each sequence touched (finished ones
        included, so nothing needs `pop_finished` afterwards). `feed`: the sequences that
        finish are sent there while the call runs (rollout/feed.py); `take_fed` then
        gives the driver the calls it made."""
        self.refuse_if_restarted("its live sequences and weights")
        touched = [s.result() for s in self.engine.decode(max_tokens, stop_after_groups, stop_check_every, feed)]
        self.engine.pop_finished()
        self._fed = feed.take_sent() if feed is not None else []
        return touched

    def take_fed(self) -> list:
        """The reward calls the last decode call's feed made, (call, uids) each; once."""
        fed, self._fed = getattr(self, "_fed", []), []
        return fed

    def take_decode_stats(self) -> dict:
        """Decode-round and prefill costs measured since the last call (cost model input)."""
        return self.engine.take_stats()

    def num_live(self) -> int:
        return len(self.engine.live())

    def set_policy_version(self, version: int) -> None:
        self.engine.policy_version = version
