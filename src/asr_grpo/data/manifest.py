"""JSON-lines manifests: one utterance per line with
`{"id", "audio", "text", "language", "keywords", "duration"}` (`id`, `keywords`
optional), or NeMo-style `{"audio_filepath", "text", "duration", "lang"}` (`lang`
optional); the two spellings may be mixed. `language`/`lang` is any language Qwen3-ASR
transcribes (`data.languages`); a line without one takes `default_language`.

`read_manifest` validates every line up front, including a header-only check of the
audio file, so a bad line fails (or is skipped and counted) before training starts.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from asr_grpo.config.errors import ConfigError
from asr_grpo.data.audio import check_audio_file
from asr_grpo.data.languages import LANGUAGES, canonical_code, script_problem

__all__ = ["LANGUAGES", "ManifestError", "ManifestReadResult", "Utterance", "manifest_digest",
           "read_manifest", "script_problem"]

ON_BAD = ("error", "skip")
# The manifest's duration may be rounded; a larger gap means it points at the wrong file.
DURATION_TOLERANCE_S = 0.5

# field -> (its spellings, project's first then NeMo's; the types it may have)
_FIELDS: dict[str, tuple[tuple[str, ...], tuple[type, ...]]] = {
    "audio": (("audio", "audio_filepath"), (str,)), "text": (("text",), (str,)),
    "duration": (("duration",), (int, float)), "id": (("id",), (str,)),
    "language": (("language", "lang"), (str,))}
_OPTIONAL = {"id", "language"}


class ManifestError(ConfigError):
    """A manifest (or one of its lines) is malformed, empty or references unusable audio:
    the user's data to fix, so the commands print it as one line."""

    def __init__(self, manifest: str | Path, line: int | None, problem: str) -> None:
        where = f"{manifest}, line {line}" if line is not None else str(manifest)
        super().__init__(f"{where}: {problem}")
        self.manifest = str(manifest)
        self.line = line
        self.problem = problem


@dataclass
class Utterance:
    id: str
    audio: str                # absolute path
    text: str
    language: str             # a code of data.languages.LANGUAGES
    keywords: list[str]
    duration: float           # seconds, from the audio file's header
    manifest: str
    line: int                 # 1-based line in `manifest`


@dataclass
class ManifestReadResult:
    utterances: list[Utterance]
    skipped: list[tuple[int, str]] = field(default_factory=list)   # (line, reason)


def _fields(row: dict) -> dict:
    """The line's fields under the project's names, type-checked; NeMo's spellings
    accepted. A missing optional field is left out."""
    out = {}
    for field_name, (names, types) in _FIELDS.items():
        present = [n for n in names if n in row]
        if not present:
            if field_name in _OPTIONAL:
                continue
            also = "".join(f" (or {n!r})" for n in names[1:])
            raise ValueError(f"missing required field {field_name!r}{also}")
        if len(present) > 1 and row[present[0]] != row[present[1]]:
            raise ValueError(f"fields {present[0]!r} and {present[1]!r} disagree")
        key = present[0]
        # bool is an int subclass, but never a valid duration.
        if not isinstance(row[key], types) or isinstance(row[key], bool):
            raise ValueError(f"field {key!r} must be {'/'.join(t.__name__ for t in types)}, "
                             f"got {type(row[key]).__name__}")
        out[field_name] = row[key]
    return out


def _parse_line(raw: str, manifest: Path, line: int, *, min_duration_s: float,
                max_duration_s: float | None, default_language: str = "") -> Utterance:
    """Validate one line; raises ValueError (plain or AudioError) describing the problem."""
    try:
        row = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"invalid JSON ({exc})") from exc
    if not isinstance(row, dict):
        raise ValueError(f"expected a JSON object, got {type(row).__name__}")
    fields = _fields(row)
    if "language" not in fields:
        if not default_language:
            raise ValueError("no field 'language' (or 'lang'), and no data.default_language "
                             "to use instead")
        fields["language"] = default_language
    language = canonical_code(fields["language"])
    fields.setdefault("id", fields["audio"])     # NeMo has no ids: the path as written
    if row.get("offset", 0):
        raise ValueError(f"field 'offset' is {row['offset']}: segments of a longer file are not "
                         "supported; cut them into files of their own")
    if not fields["text"].strip():
        raise ValueError("empty text")
    if (problem := script_problem(fields["text"], language)) is not None:
        raise ValueError(problem)
    if not fields["id"].strip() or not fields["audio"].strip():
        raise ValueError("empty id or audio path")
    keywords = row.get("keywords", [])
    if not isinstance(keywords, list) or not all(isinstance(k, str) for k in keywords):
        raise ValueError("field 'keywords' must be a list of strings")
    if not math.isfinite(fields["duration"]) or fields["duration"] <= 0:
        raise ValueError(f"field 'duration' must be a positive number, got {fields['duration']}")

    audio = Path(os.path.abspath(manifest.parent / fields["audio"]))  # absolute paths stay
    info = check_audio_file(audio, min_duration_s=min_duration_s, max_duration_s=max_duration_s)
    duration = info.frames / info.samplerate
    if abs(duration - fields["duration"]) > DURATION_TOLERANCE_S:
        raise ValueError(f"duration {fields['duration']} s in the manifest but {audio} "
                         f"lasts {duration:.3f} s")
    return Utterance(id=fields["id"], audio=str(audio), text=fields["text"], language=language,
                     keywords=list(keywords), duration=duration, manifest=str(manifest),
                     line=line)


def read_manifest(path: str | Path, *, on_bad: str = "error", min_duration_s: float = 0.0,
                  max_duration_s: float | None = None, default_language: str = "") -> ManifestReadResult:
    """Read and validate a manifest.

    on_bad="error" raises `ManifestError` (manifest path, line number, problem) at the
    first bad line; on_bad="skip" drops bad lines and lists them in `skipped`. Blank
    lines are ignored; duplicate ids are bad lines. `default_language` (a code, e.g.
    "de") is the language of lines that state none; empty: such a line is bad.
    """
    if on_bad not in ON_BAD:
        raise ValueError(f"on_bad must be one of {ON_BAD}, got {on_bad!r}")
    if default_language:
        try:
            default_language = canonical_code(default_language)
        except ValueError as exc:
            raise ConfigError(f"data.default_language: {exc}") from None
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
                                  max_duration_s=max_duration_s, default_language=default_language)
                if utt.id in seen_ids:
                    raise ValueError(f"duplicate id {utt.id!r} (a line without one is named "
                                     f"by its audio path)")
            except ValueError as exc:  # AudioError included
                if on_bad == "error":
                    raise ManifestError(manifest, line, str(exc)) from exc
                result.skipped.append((line, str(exc)))
                continue
            seen_ids.add(utt.id)
            result.utterances.append(utt)
    return result


def manifest_digest(path: str | Path) -> str:
    """SHA-256 of the manifest file's bytes: which data a checkpoint was trained on."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()
