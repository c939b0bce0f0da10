"""Text handling shared by the rewards and the evaluators: parsing Qwen3-ASR responses,
normalising transcripts, and corpus / per-utterance error rates.

This module is the project's one definition of CER/WER: the SFT evaluator, the RL eval
loop and the CER reward all call it, so a number in MLflow means the same everywhere.

Any language of `asr_grpo.data.languages.LANGUAGES` (Qwen3-ASR's 30); how a text is
scored depends on whether the language separates its words by spaces:

- Normalisation (`normalize_text`), every language: NFKC, case folded (German ß and
  ss are one spelling), apostrophes dropped, punctuation and symbols turned into
  spaces, whitespace collapsed. Letters and combining marks (accents, umlauts, Thai
  and Devanagari vowel signs) are kept: "Bär" and "Bar" differ.
- Spaced languages (English, German, Russian, Arabic, Korean, ...):
  CER counts characters, single spaces between words included (a missing word
  boundary is an error a reader sees); jiwer's plain `cer` would also count
  punctuation and repeated spaces, which normalisation removes first.
  WER counts whitespace-separated words.
- Unspaced languages (Chinese, Cantonese, Japanese, Thai): spaces next to a character
  of the language's own script (CJK; CJK, Hiragana, Katakana; Thai) are removed,
  so only spaces between embedded Latin words remain (and count, as above). CER
  counts characters. A word error rate is meaningless without word boundaries
  (unsegmented text would score whole sentences as one word), so "WER" for these
  languages is the mixed error rate: each character of the language's script is a
  unit, each embedded Latin word (or number) is one unit.
- An empty reference has no length to divide by: its error rate is 0.0 when the
  hypothesis is empty too, else 1.0 (the hypothesis is all insertions; capped so one
  such utterance cannot dominate). At corpus level, empty references add their
  insertions to the error count but nothing to the length; a corpus whose references
  are all empty follows the same 0.0 / 1.0 rule.
"""
from __future__ import annotations

import re
import unicodedata
from collections import defaultdict
from functools import lru_cache

import jiwer

from asr_grpo.data.languages import LANGUAGE_CODES, LANGUAGE_NAMES, Language, script_of
from asr_grpo.data.languages import language as language_info

__all__ = ["LANGUAGE_CODES", "LANGUAGE_NAMES", "char_error_rate", "check_language",
           "error_rates_by_language", "normalize_text", "split_asr_output", "utterance_cer",
           "word_error_rate", "words"]

# `<prefix>language X<asr_text><transcript>`; the prefix is tolerated (garbage before
# the tag is the model's problem, the transcript after it is still what it said).
_TAGGED_RE = re.compile(r"^(?P<head>.*?)<asr_text>(?P<text>.*)$", re.DOTALL)
_DECLARED_RE = re.compile(r"language\s*(?P<name>[A-Za-z]+)\s*$")
# Untagged text: strip a leading `language X` only for names we know, so a transcript
# that merely starts with the word "language" survives.
_LEADING_DECL_RE = re.compile(
    r"^\s*language\s+(?:%s)(?![A-Za-z])" % "|".join([*LANGUAGE_CODES, "None"]), re.IGNORECASE)

_APOSTROPHES_RE = re.compile("['\u2019\u02bc]")
_SPACES_RE = re.compile(r"\s+")

_script = lru_cache(maxsize=1 << 16)(script_of)


def check_language(language: str) -> str:
    """`language` if it is a known code; ValueError naming the known codes otherwise."""
    return language_info(language).code


def _own_script(ch: str, lang: Language) -> bool:
    return _script(ch) in lang.scripts


def split_asr_output(response: str) -> tuple[str | None, str]:
    """Parse `language X<asr_text>transcript` into (X, transcript stripped).

    Returns language None when there is no tag (malformed output, or a prompt that
    forced the language so the response is the bare transcript) and for Qwen3-ASR's
    own `language None` ("no language detected"). Without a tag the whole text is the
    transcript, minus a leading `language <known name>`.
    """
    m = _TAGGED_RE.match(response)
    if m is None:
        return None, _LEADING_DECL_RE.sub("", response, count=1).strip()
    decl = _DECLARED_RE.search(m.group("head"))
    name = decl.group("name") if decl else None
    return (None if name in (None, "None") else name), m.group("text").strip()


def normalize_text(text: str, language: str) -> str:
    """NFKC, case folded, punctuation and symbols removed, whitespace collapsed; for an
    unspaced language (Chinese, Japanese, Thai, ...) spaces next to a character of its
    script are dropped (embedded Latin words keep theirs)."""
    lang = language_info(language)
    text = unicodedata.normalize("NFKC", text).casefold()
    text = _APOSTROPHES_RE.sub("", text)     # "don't" == "dont", not "don t"
    text = "".join(" " if unicodedata.category(c)[0] in "PS" else c for c in text)
    text = _SPACES_RE.sub(" ", text).strip()
    if lang.unspaced and " " in text:       # stripped: a space has a character either side
        text = "".join(c for i, c in enumerate(text) if c != " " or not (
            _own_script(text[i - 1], lang) or _own_script(text[i + 1], lang)))
    return text


def words(normalized: str, language: str) -> list[str]:
    """Word units of a normalised text: whitespace-separated words; for an unspaced
    language each character of its script and each embedded Latin word (or number)."""
    lang = language_info(language)
    if not lang.unspaced:
        return normalized.split()
    units, run = [], ""
    for c in normalized:
        own = _own_script(c, lang)
        if c.isspace() or own:
            if run:
                units.append(run)
                run = ""
            if own:
                units.append(c)
        else:
            run += c
    return units + ([run] if run else [])


def _check_lengths(hyps, refs, languages) -> None:
    if not len(hyps) == len(refs) == len(languages):
        raise ValueError(f"hyps, refs and languages differ in length: "
                         f"{len(hyps)}, {len(refs)}, {len(languages)}")


def _rate(errors: int, ref_len: int) -> float:
    if ref_len == 0:
        return 0.0 if errors == 0 else 1.0
    return errors / ref_len


def _error_counts(hyps, refs, languages, unit: str) -> tuple[int, int]:
    """(edits, reference length) summed over the corpus, in characters or words."""
    _check_lengths(hyps, refs, languages)
    if not refs:
        return 0, 0
    hyp_n = [normalize_text(h, lang) for h, lang in zip(hyps, languages)]
    ref_n = [normalize_text(r, lang) for r, lang in zip(refs, languages)]
    if unit == "char":
        out = jiwer.process_characters(ref_n, hyp_n)
    else:   # words re-joined by single spaces: jiwer's default transform splits them
        out = jiwer.process_words(
            [" ".join(words(r, lang)) for r, lang in zip(ref_n, languages)],
            [" ".join(words(h, lang)) for h, lang in zip(hyp_n, languages)])
    return (out.substitutions + out.deletions + out.insertions,
            out.substitutions + out.deletions + out.hits)


def char_error_rate(hyps: list[str], refs: list[str], languages: list[str]) -> float:
    """Corpus CER: total character edits / total reference characters (see module doc)."""
    return _rate(*_error_counts(hyps, refs, languages, "char"))


def word_error_rate(hyps: list[str], refs: list[str], languages: list[str]) -> float:
    """Corpus WER (the mixed error rate for unspaced languages, see module doc)."""
    return _rate(*_error_counts(hyps, refs, languages, "word"))


def utterance_cer(hyp: str, ref: str, language: str) -> float:
    """CER of one utterance; may exceed 1 when the hypothesis inserts a lot."""
    return char_error_rate([hyp], [ref], [language])


def error_rates_by_language(hyps: list[str], refs: list[str],
                            languages: list[str]) -> dict[str, float]:
    """{"cer", "wer", "n"} over the whole corpus plus "cer/<code>", "wer/<code>",
    "n/<code>" for each language present (absent languages are left out rather than
    reported as NaN). Each utterance is scored in its own language's units, so the
    corpus "wer" pools words of spaced languages with the character units of unspaced
    ones (module doc)."""
    _check_lengths(hyps, refs, languages)
    out: dict[str, float] = {"cer": char_error_rate(hyps, refs, languages),
                             "wer": word_error_rate(hyps, refs, languages),
                             "n": float(len(refs))}
    groups: dict[str, list[int]] = defaultdict(list)
    for i, lang in enumerate(languages):
        groups[lang].append(i)
    for lang in sorted(groups):
        idx = groups[lang]
        sub = ([hyps[i] for i in idx], [refs[i] for i in idx], [lang] * len(idx))
        out[f"cer/{lang}"] = char_error_rate(*sub)
        out[f"wer/{lang}"] = word_error_rate(*sub)
        out[f"n/{lang}"] = float(len(idx))
    return out
