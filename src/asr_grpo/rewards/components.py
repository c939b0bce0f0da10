"""Per-sample reward components: pure functions of text, each returning a float in [0, 1].

Formulas (all text is first passed through `normalize_text`):

- cer         = clip(1 - CER(transcript, reference), 0, 1)
- keyword     = |{k in keywords : k found in transcript}| / |keywords|, over distinct
                non-empty normalised keywords; in spaced languages (English, German, ...)
                keywords must match whole words, in unspaced ones (Chinese, Japanese,
                Thai, ...) they are substrings. No keywords -> 1.0 (nothing to miss, so an
                utterance without keywords neither gains nor loses against one with them).
- language    = script_share * (TAG_MISMATCH_FACTOR if a declared language name is
                given and differs from the utterance's language else 1), where
                script_share = (# letters in the utterance language's own scripts) /
                (# letters of any script), scripts from the letters' Unicode names
                (`asr_grpo.data.languages`: Latin for en/de/fr/..., Cyrillic for ru,
                CJK + Hiragana + Katakana for ja, CJK for zh, Thai, Hangul, ...). No
                letters (e.g. empty) -> 0. Languages that share a script (German and
                English) are told apart only by the declared tag.
- smoothness  = repetition * length * truncation, with
                repetition = 1 - max(0, rep(hyp) - rep(ref)), rep(x) = share of the
                    REPEAT_NGRAM-grams of x's word units (words; in Chinese, Japanese, Thai
                    characters) that repeat an earlier one; subtracting the reference's
                    own rep leaves legitimate repetition ("no no no") unpunished, while
                    a loop drives rep towards 1;
                length = exp(-LENGTH_DECAY * max(0, ratio - MAX_LENGTH_RATIO)),
                    ratio = normalised characters of hyp / max(1, those of ref), so
                    up to 1.5x is free and hallucinated runs decay (2x -> 0.37);
                truncation = TRUNCATION_FACTOR if finish_reason == "length" (ran out of
                    tokens without EOS: almost always a loop) else 1.
  Smoothness scores degeneration only; an empty or wrong transcript can be smooth,
  accuracy is the cer component's job.

A component is a function of a `RewardSample` registered in `REWARD_COMPONENTS`; the
built-in reward file scores every registered component and combines those that
`reward.weights` weighs (the others are logged).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

from asr_grpo.config.registry import Registry
from asr_grpo.data.languages import language as language_info
from asr_grpo.data.languages import script_share
from asr_grpo.rewards.text import normalize_text, utterance_cer, words

TAG_MISMATCH_FACTOR = 0.5
REPEAT_NGRAM = 3
MAX_LENGTH_RATIO = 1.5
LENGTH_DECAY = 2.0
TRUNCATION_FACTOR = 0.1
FINISH_REASONS = ("stop", "length")


def _clip01(x: float) -> float:
    return min(1.0, max(0.0, x))


def cer_score(transcript: str, reference: str, language: str) -> float:
    return _clip01(1.0 - utterance_cer(transcript, reference, language))


def keyword_recall(transcript: str, keywords: Sequence[str], language: str) -> float:
    wanted = {k for k in (normalize_text(k, language) for k in keywords) if k}
    if not wanted:
        return 1.0
    text = normalize_text(transcript, language)
    if not language_info(language).unspaced:   # pad so "cat" does not match inside "catalog"
        text, wanted = f" {text} ", {f" {k} " for k in wanted}
    return sum(k in text for k in wanted) / len(wanted)


def language_consistency(transcript: str, language: str,
                         predicted_language_name: str | None = None) -> float:
    name = language_info(language).name
    share = script_share(normalize_text(transcript, language), language)
    declared = predicted_language_name
    if declared is not None and declared.lower() != name.lower():
        share *= TAG_MISMATCH_FACTOR
    return share


def _repeat_share(units: list[str]) -> float:
    grams = [tuple(units[i:i + REPEAT_NGRAM])
             for i in range(len(units) - REPEAT_NGRAM + 1)]
    return 1.0 - len(set(grams)) / len(grams) if grams else 0.0


def smoothness(transcript: str, reference: str, language: str,
               finish_reason: str = "stop") -> float:
    if finish_reason not in FINISH_REASONS:
        raise ValueError(f"finish_reason {finish_reason!r} not in {FINISH_REASONS}")
    hyp, ref = normalize_text(transcript, language), normalize_text(reference, language)
    excess = _repeat_share(words(hyp, language)) - _repeat_share(words(ref, language))
    repetition = 1.0 - max(0.0, excess)
    ratio = len(hyp) / max(1, len(ref))
    length = math.exp(-LENGTH_DECAY * max(0.0, ratio - MAX_LENGTH_RATIO))
    truncation = TRUNCATION_FACTOR if finish_reason == "length" else 1.0
    return repetition * length * truncation


@dataclass(frozen=True)
class RewardSample:
    """Everything a component may look at for one sampled response."""
    transcript: str                       # parsed from the response
    reference: str
    language: str                         # utterance language code ("en", "de", "zh", ...)
    keywords: Sequence[str] = field(default_factory=tuple)
    declared_language: str | None = None  # language name the response declared, if any
    finish_reason: str = "stop"           # "stop" (EOS) | "length" (hit the token cap)
    response: str = ""                    # raw response text, for custom components


Component = Callable[[RewardSample], float]   # -> a score in [0, 1]

# Keyed by `reward.weights`: a weight names a registered component.
REWARD_COMPONENTS: Registry[Component] = Registry("reward.weights")
REWARD_COMPONENTS.register("cer")(lambda s: cer_score(s.transcript, s.reference, s.language))
REWARD_COMPONENTS.register("keyword")(lambda s: keyword_recall(s.transcript, s.keywords, s.language))
REWARD_COMPONENTS.register("language")(lambda s: language_consistency(s.transcript, s.language,
                                                                       s.declared_language))
REWARD_COMPONENTS.register("smoothness")(lambda s: smoothness(s.transcript, s.reference, s.language,
                                                               s.finish_reason))

# Mirrors RewardConfig.weights' default (a test keeps the two equal).
DEFAULT_WEIGHTS: dict[str, float] = {
    "cer": 1.0, "keyword": 0.3, "language": 0.2, "smoothness": 0.2}
