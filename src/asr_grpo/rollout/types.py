"""What a rollout engine consumes and produces, independent of the engine behind it."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:   # a name in annotations only: the scheduler and forecast load no model code
    from asr_grpo.models.sequences import AudioFeatures
    from asr_grpo.rollout.feed import FeedSink


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 96
    seed: int = 0


@dataclass
class RolloutRequest:
    uid: str                    # unique per sampled sequence, e.g. "<utt id>#3"
    group: str                  # the prompt group (GRPO: the n samples of one prompt)
    prompt_ids: list[int]       # prompt with the audio placeholders expanded
    features: AudioFeatures


@dataclass
class SequenceState:
    """A sampled sequence, possibly unfinished: OPPO carries these across steps."""
    request: RolloutRequest
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)   # behaviour log-probs
    versions: list[int] = field(default_factory=list)     # policy version per token
    finish_reason: str | None = None                      # "stop" | "length" | None
    # Wall-clock time (time.time()) its last token was sampled: when a reward service
    # could have had it (what an ideal pipeline is measured against).
    finished_at: float | None = None

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def result(self) -> "SequenceResult":
        return SequenceResult(self.request.uid, self.request.group, list(self.tokens), list(self.logprobs),
                              list(self.versions), self.finish_reason, self.finished_at)


@dataclass
class SequenceResult:
    """A sequence's decoded state without its prompt/audio: what crosses process boundaries."""
    uid: str
    group: str
    tokens: list[int]
    logprobs: list[float]
    versions: list[int]
    finish_reason: str | None
    finished_at: float | None = None

    @property
    def done(self) -> bool:
        return self.finish_reason is not None


class ChunkedEngine(Protocol):
    """Decode up to N new tokens for every live sequence, resume later (OPPO needs this)."""

    policy_version: int

    def add_requests(self, requests: list[RolloutRequest]) -> None: ...

    def add_sequences(self, sequences: list[SequenceState]) -> None: ...

    def decode(self, max_tokens: int | None = None, stop_after_groups: int | None = None,
               stop_check_every: int = 1, feed: FeedSink | None = None) -> list[SequenceState]:
        """`feed` (rollout/feed.py): push the sequences that finish there while the call runs."""

    def take_stats(self) -> dict: ...

    def pop_finished(self) -> list[SequenceState]: ...

    def live(self) -> list[SequenceState]: ...
