"""JSON-lines manifests: one utterance per line with
`{"id", "audio", "text", "language", "keywords", "duration"}` (`keywords` optional).

`read_manifest` validates every line up front, including a header-only check of the
audio file, so a bad line fails (or is skipped and counted) before training starts.
"""
from __future__ import annotations

import json
import math
import os
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path

from asr_grpo.data.audio import check_audio_file

LANGUAGES = frozenset({"en", "zh"})
# The scripts a transcript's letters may be written in (Mandarin may embed Latin words);
# anything else means the text or its language tag is wrong.
SCRIPTS = {"en": frozenset({"LATIN"}), "zh": frozenset({"CJK", "LATIN"})}
ON_BAD = ("error", "skip")
# The manifest's duration may be rounded; a larger gap means it points at the wrong file.
DURATION_TOLERANCE_S = 0.5

_REQUIRED: dict[str, tuple[type, ...]] = {
    "id": (str,), "audio": (str,), "text": (str,), "language": (str,), "duration": (int, float)}


class ManifestError(ValueError):
    """A manifest line is malformed or references unusable audio."""

    def __init__(self, manifest: str | Path, line: int | None, problem: str) -> None:
        where = f"{manifest}, line {line}" if line is not None else str(manifest)
        super().__init__(f"{where}: {problem}")
        self.manifest = str(manifest)
        self.line = line
        self.problem = problem


def letter_script(ch: str) -> str:
    """The Unicode script of a letter, from its name: LATIN, CJK, CYRILLIC, GREEK, ..."""
    name = unicodedata.name(ch, "UNKNOWN").removeprefix("FULLWIDTH ").removeprefix("HALFWIDTH ")
    return name.split(" ")[0].split("-")[0]


def script_problem(text: str, language: str) -> str | None:
    """Why `text` cannot be a `language` transcript (letters of another script, or
    Mandarin without a single Chinese character), or None."""
    allowed = SCRIPTS[language]
    letters = [ch for ch in text if ch.isalpha()]
    foreign = {}
    for ch in letters:
        foreign.setdefault(letter_script(ch), ch)
    unexpected = {k: v for k, v in foreign.items() if k not in allowed}
    if unexpected:
        return (f"text in an unexpected script for language {language!r}: "
                + ", ".join(f"{k} (e.g. {v!r})" for k, v in sorted(unexpected.items())))
    if language == "zh" and "CJK" not in foreign:
        return "text for language 'zh' has no Chinese character"
    return None


@dataclass
class Utterance:
    id: str
    audio: str                # absolute path
    text: str
    language: str
    keywords: list[str]
    duration: float           # seconds, from the audio file's header
    manifest: str
    line: int                 # 1-based line in `manifest`


@dataclass
class ManifestReadResult:
    utterances: list[Utterance]
    skipped: list[tuple[int, str]] = field(default_factory=list)   # (line, reason)


def _parse_line(raw: str, manifest: Path, line: int, *, min_duration_s: float,
                max_duration_s: float | None) -> Utterance:
    """Validate one line; raises ValueError (plain or AudioError) describing the problem."""
    try:
        row = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"invalid JSON ({exc})") from exc
    if not isinstance(row, dict):
        raise ValueError(f"expected a JSON object, got {type(row).__name__}")
    for key, types in _REQUIRED.items():
        if key not in row:
            raise ValueError(f"missing required field {key!r}")
        # bool is an int subclass, but never a valid duration.
        if not isinstance(row[key], types) or isinstance(row[key], bool):
            raise ValueError(f"field {key!r} must be {'/'.join(t.__name__ for t in types)}, "
                             f"got {type(row[key]).__name__}")
    if row["language"] not in LANGUAGES:
        raise ValueError(f"unknown language {row['language']!r}; expected one of "
                         f"{sorted(LANGUAGES)}")
    if not row["text"].strip():
        raise ValueError("empty text")
    if (problem := script_problem(row["text"], row["language"])) is not None:
        raise ValueError(problem)
    if not row["id"].strip() or not row["audio"].strip():
        raise ValueError("empty id or audio path")
    keywords = row.get("keywords", [])
    if not isinstance(keywords, list) or not all(isinstance(k, str) for k in keywords):
        raise ValueError("field 'keywords' must be a list of strings")
    if not math.isfinite(row["duration"]) or row["duration"] <= 0:
        raise ValueError(f"field 'duration' must be a positive number, got {row['duration']}")

    audio = Path(os.path.abspath(manifest.parent / row["audio"]))  # absolute paths stay
    info = check_audio_file(audio, min_duration_s=min_duration_s, max_duration_s=max_duration_s)
    duration = info.frames / info.samplerate
    if abs(duration - row["duration"]) > DURATION_TOLERANCE_S:
        raise ValueError(f"duration {row['duration']} s in the manifest but {audio} "
                         f"lasts {duration:.3f} s")
    return Utterance(id=row["id"], audio=str(audio), text=row["text"], language=row["language"],
                     keywords=list(keywords), duration=duration, manifest=str(manifest),
                     line=line)


def read_manifest(path: str | Path, *, on_bad: str = "error", min_duration_s: float = 0.0,
                  max_duration_s: float | None = None) -> ManifestReadResult:
    """Read and validate a manifest.

    on_bad="error" raises `ManifestError` (manifest path, line number, problem) at the
    first bad line; on_bad="skip" drops bad lines and lists them in `skipped`. Blank
    lines are ignored; duplicate ids are bad lines.
    """
    if on_bad not in ON_BAD:
        raise ValueError(f"on_bad must be one of {ON_BAD}, got {on_bad!r}")
    manifest = Path(os.path.abspath(path))
    if not manifest.is_file():
        raise ManifestError(manifest, None, "manifest file not found")
    result = ManifestReadResult(utterances=[])
    seen_ids: set[str] = set()
    with open(manifest, encoding="utf-8") as f:
        for line, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                utt = _parse_line(raw, manifest, line, min_duration_s=min_duration_s,
                                  max_duration_s=max_duration_s)
                if utt.id in seen_ids:
                    raise ValueError(f"duplicate id {utt.id!r}")
            except ValueError as exc:  # AudioError included
                if on_bad == "error":
                    raise ManifestError(manifest, line, str(exc)) from exc
                result.skipped.append((line, str(exc)))
                continue
            seen_ids.add(utt.id)
            result.utterances.append(utt)
    return result

