"""The languages a manifest may declare: the 30 Qwen3-ASR transcribes, by ISO 639 code.

Each has the name Qwen3-ASR's prompt and output use (`language <Name><asr_text>...`,
the same table as transformers' `Qwen3ASRProcessor`), the scripts its letters are
written in, and whether its words are separated by spaces. Manifest validation
(`data.manifest`), CER/WER normalisation and the language-consistency reward
(`rewards.text`, `rewards.components`) and the text LM's prompts all read this table.

Scripts are told from a letter's Unicode name (`script_of`): LATIN, CYRILLIC, GREEK,
ARABIC, DEVANAGARI, THAI, HANGUL, HIRAGANA, KATAKANA, CJK (Chinese characters, also
used in Japanese and Korean), ...
"""
from __future__ import annotations

import unicodedata
from dataclasses import dataclass


@dataclass(frozen=True)
class Language:
    code: str                       # ISO 639-1 (639-2/3 for `fil`, `yue`)
    name: str                       # as in `language <Name><asr_text>`
    scripts: frozenset[str]         # the scripts its own letters are written in
    unspaced: bool = False          # words not separated by spaces (scored per character)
    also: frozenset[str] = frozenset()   # other scripts a transcript may hold (Kanji in Korean)

    @property
    def allowed_scripts(self) -> frozenset[str]:
        """Scripts a transcript may use: its own, `also`, and Latin (embedded names and
        words, as in today's Mandarin corpus)."""
        return self.scripts | self.also | {"LATIN"}


def _languages(scripts: str, unspaced: bool = False, also: str = "", **names: str) -> dict[str, Language]:
    return {code: Language(code, name, frozenset(scripts.split()), unspaced, frozenset(also.split()))
            for code, name in names.items()}


LANGUAGES: dict[str, Language] = dict(sorted({
    **_languages("LATIN", cs="Czech", da="Danish", nl="Dutch", en="English", fil="Filipino",
                 fi="Finnish", fr="French", de="German", hu="Hungarian", id="Indonesian",
                 it="Italian", ms="Malay", pl="Polish", pt="Portuguese", ro="Romanian",
                 es="Spanish", sv="Swedish", tr="Turkish", vi="Vietnamese"),
    **_languages("CYRILLIC", ru="Russian", mk="Macedonian"),
    **_languages("ARABIC", ar="Arabic", fa="Persian"),
    **_languages("GREEK", el="Greek"),
    **_languages("DEVANAGARI", hi="Hindi"),
    **_languages("HANGUL", also="CJK", ko="Korean"),
    **_languages("CJK", unspaced=True, zh="Chinese", yue="Cantonese"),
    **_languages("CJK HIRAGANA KATAKANA", unspaced=True, ja="Japanese"),
    **_languages("THAI", unspaced=True, th="Thai"),
}.items()))

LANGUAGE_NAMES: dict[str, str] = {code: lang.name for code, lang in LANGUAGES.items()}
LANGUAGE_CODES: dict[str, str] = {name: code for code, name in LANGUAGE_NAMES.items()}

# Unicode-name prefixes that are not the script's name.
_SCRIPT_ALIASES = {"IDEOGRAPHIC": "CJK"}       # 々 IDEOGRAPHIC ITERATION MARK, 〆
_NOT_A_SCRIPT = frozenset({"MODIFIER"})       # ʼ MODIFIER LETTER APOSTROPHE and the like
# How an error message names a letter of a script.
_SCRIPT_WORDS = {"CJK": "Chinese character"}


def script_of(ch: str) -> str | None:
    """The script of a letter or combining mark from its Unicode name (LATIN, CJK,
    CYRILLIC, THAI, ...; compatibility forms such as full-width letters count as the
    letter they stand for), or None for anything else (digits, punctuation, spaces,
    unnamed code points, modifier letters)."""
    ch = unicodedata.normalize("NFKC", ch)[:1] or ch     # ª -> a, ℓ -> l, ｱ -> ア, µ -> μ
    name = unicodedata.name(ch, "").removeprefix("FULLWIDTH ").removeprefix("HALFWIDTH ")
    head = name.split(" ")[0].split("-")[0]
    if not head or head in _NOT_A_SCRIPT or not (ch.isalpha() or unicodedata.category(ch)[0] == "M"):
        return None
    return _SCRIPT_ALIASES.get(head, head)


def language(code: str) -> Language:
    """The entry for a canonical code; ValueError naming the known codes otherwise."""
    try:
        return LANGUAGES[code]
    except (KeyError, TypeError):
        raise ValueError(f"unknown language code {code!r}; known: {sorted(LANGUAGES)}") from None


def canonical_code(value: str) -> str:
    """A manifest's language as a code of `LANGUAGES`: the code in any case, a region
    tag dropped (`en-US`, `pt_BR`), or the English name (`German`)."""
    key = value.strip().lower().replace("_", "-")
    for candidate in (key, key.split("-")[0]):
        if candidate in LANGUAGES:
            return candidate
    by_name = {name.lower(): code for name, code in LANGUAGE_CODES.items()}
    if key in by_name:
        return by_name[key]
    raise ValueError(f"unknown language {value!r}: not one of the {len(LANGUAGES)} languages "
                     f"Qwen3-ASR transcribes ({', '.join(sorted(LANGUAGES))})")


def script_share(text: str, code: str) -> float:
    """Share of the letters of `text` that are written in the language's own scripts
    (Latin words in a Chinese transcript count against it); 0.0 when `text` has none."""
    scripts = [s for ch in text if ch.isalpha() and (s := script_of(ch)) is not None]
    if not scripts:
        return 0.0
    own = language(code).scripts
    return sum(s in own for s in scripts) / len(scripts)


def letter_scripts(text: str) -> dict[str, str]:
    """{script: first letter of it} over the letters of `text` (combining marks left out)."""
    found: dict[str, str] = {}
    for ch in text:
        if ch.isalpha() and (script := script_of(ch)) is not None:
            found.setdefault(script, ch)
    return found


def script_problem(text: str, code: str) -> str | None:
    """Why `text` cannot be a transcript in language `code` (letters of a script the
    language is not written in, or a non-Latin language without one letter of its own
    script), or None."""
    lang = language(code)
    found = letter_scripts(text)
    unexpected = {k: v for k, v in found.items() if k not in lang.allowed_scripts}
    if unexpected:
        return (f"text in an unexpected script for language {code!r}: "
                + ", ".join(f"{k} (e.g. {v!r})" for k, v in sorted(unexpected.items())))
    if lang.scripts != {"LATIN"} and not lang.scripts & found.keys():
        words = " or ".join(_SCRIPT_WORDS.get(s, f"{s.title()} letter") for s in sorted(lang.scripts))
        return f"text for language {code!r} has no {words}"
    return None
