"""Prompt groups (what the scheduler buffers) and experience items (what trainers consume)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

from asr_grpo.rollout.types import RolloutRequest

if TYPE_CHECKING:   # names in annotations only: the scheduler and forecast load no model code, no torch
    import torch

    from asr_grpo.models.sequences import AudioFeatures


@dataclass
class PromptGroup:
    """One utterance and its n samples (a GRPO group): finished when all n are."""
    uid: str                        # unique across the run, e.g. "s12:train-00042"
    utterance: dict[str, Any]       # id, text, language, keywords (no audio)
    prompt_ids: list[int]
    features: AudioFeatures
    n: int
    entered_step: int               # step at which the group entered the buffer
    item_index: int = -1            # index in the training set (rebuilds the group on resume)

    def requests(self) -> list[RolloutRequest]:
        return [RolloutRequest(uid=f"{self.uid}#{k}", group=self.uid, prompt_ids=self.prompt_ids,
                               features=self.features) for k in range(self.n)]


@dataclass
class ExperienceItem:
    """One sampled sequence with everything the policy/critic update needs (1-D over its tokens)."""
    uid: str
    group: str
    prompt_ids: list[int]
    response_ids: list[int]
    features: AudioFeatures
    advantages: torch.Tensor
    old_logprobs: torch.Tensor
    behaviour_logprobs: torch.Tensor
    ref_logprobs: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    old_values: torch.Tensor | None = None
    versions: list[int] = field(default_factory=list)   # policy version that produced each token

    @property
    def num_tokens(self) -> int:
        return len(self.response_ids)


@dataclass
class SequenceRef:
    """A finished (prompt, response) pair to score: reference/old log-probs, values."""
    uid: str
    prompt_ids: list[int]
    response_ids: list[int]
    features: AudioFeatures | None
    language: str | None = None     # what a text-only scorer (the LM reward model) conditions on


class NonFiniteError(FloatingPointError):
    """A NaN or inf in experience or a loss: refused before it reaches an optimizer."""


def check_finite(items: Sequence[ExperienceItem], where: str) -> None:
    """Raise `NonFiniteError` naming the samples and fields with a NaN or inf."""
    bad = {}
    for it in items:
        for name in ("advantages", "old_logprobs", "behaviour_logprobs", "ref_logprobs", "returns", "old_values"):
            t = getattr(it, name)
            if t is not None and not bool(t.isfinite().all()):
                bad.setdefault(name, []).append(it.uid)
    if bad:
        raise NonFiniteError(f"{where}: non-finite values, refused before any update: "
                             + "; ".join(f"{k} of samples {v}" for k, v in bad.items()))
