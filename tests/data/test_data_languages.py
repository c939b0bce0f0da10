"""The language table: Qwen3-ASR's languages, their scripts, and what manifests may say;
the example NeMo-style German manifest under examples/manifests."""
import json
from pathlib import Path

import pytest
import soundfile as sf

from asr_grpo.config.schema import DataConfig
from asr_grpo.data import AsrDataset, read_manifest
from asr_grpo.data.languages import (
    LANGUAGE_CODES,
    LANGUAGE_NAMES,
    LANGUAGES,
    canonical_code,
    language,
    script_of,
    script_problem,
    script_share,
)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "manifests" / "de.jsonl"


def test_the_table_is_the_one_qwen3_asr_prompts_with():
    """The processor forces the language by these names; a code it does not know fails there."""
    from transformers.models.qwen3_asr.processing_qwen3_asr import LANGUAGE_CODE_TO_NAME

    assert LANGUAGE_NAMES == LANGUAGE_CODE_TO_NAME
    assert LANGUAGE_CODES == {name: code for code, name in LANGUAGE_NAMES.items()}
    assert all(lang.scripts for lang in LANGUAGES.values())
    assert {c for c, lang in LANGUAGES.items() if lang.unspaced} == {"zh", "yue", "ja", "th"}


@pytest.mark.parametrize("ch, script", [
    ("a", "LATIN"), ("ß", "LATIN"), ("ố", "LATIN"), ("Ａ", "LATIN"), ("ª", "LATIN"),
    ("ж", "CYRILLIC"), ("λ", "GREEK"), ("ب", "ARABIC"), ("क", "DEVANAGARI"), ("ไ", "THAI"),
    ("\u0e31", "THAI"),               # a Thai vowel sign: a mark, but of the Thai script
    ("漢", "CJK"), ("々", "CJK"), ("あ", "HIRAGANA"), ("ア", "KATAKANA"), ("ｱ", "KATAKANA"),
    ("ー", "KATAKANA"), ("한", "HANGUL"),
    ("1", None), (" ", None), ("!", None), ("\u02bc", None),   # digit, space, punctuation, modifier
])
def test_script_of(ch, script):
    assert script_of(ch) == script


@pytest.mark.parametrize("value, code", [
    ("de", "de"), ("DE", "de"), ("en-US", "en"), ("pt_BR", "pt"), ("zh-TW", "zh"),
    ("yue", "yue"), ("fil-PH", "fil"), ("German", "de"), ("japanese", "ja"),
])
def test_canonical_code(value, code):
    assert canonical_code(value) == code


@pytest.mark.parametrize("value", ["xx", "", "klingon", "sr", "d"])
def test_unknown_language_fails_clearly(value):
    with pytest.raises(ValueError, match=r"unknown language .*Qwen3-ASR transcribes \(ar, cs, "):
        canonical_code(value)
    with pytest.raises(ValueError, match="unknown language code"):
        language(value)


@pytest.mark.parametrize("text, code, problem", [
    ("Grüße aus München", "de", None),
    ("Доброе утро, Anna", "ru", None),                     # Latin names inside Cyrillic
    ("Доброе утро", "de", "unexpected script for language 'de': CYRILLIC"),
    ("good morning", "ru", "text for language 'ru' has no Cyrillic letter"),
    ("東京でiPhoneを買った", "ja", None),
    ("good morning", "ja", "has no Chinese character or Hiragana letter or Katakana letter"),
    ("안녕하세요 韓國", "ko", None),                          # Hanja are allowed in Korean
    ("สวัสดีครับ", "th", None),
    ("สวัสดีครับ", "en", "unexpected script for language 'en': THAI"),
    ("5 km", "de", None),                                  # no letters of another script
])
def test_script_problem(text, code, problem):
    found = script_problem(text, code)
    assert found is None if problem is None else problem in found


def test_script_share():
    assert script_share("Guten Morgen", "de") == 1.0
    assert script_share("Guten Morgen", "ru") == 0.0
    assert script_share("привет bob", "ru") == pytest.approx(6 / 9)
    assert script_share("", "ja") == 0.0


def test_example_german_manifest_is_nemo_style_and_loads():
    rows = [json.loads(line) for line in EXAMPLE.read_text(encoding="utf-8").splitlines()]
    assert len(rows) >= 3
    assert all(set(row) == {"audio_filepath", "text", "duration", "lang"} for row in rows)
    result = read_manifest(EXAMPLE)                       # every line valid, as committed
    assert result.skipped == [] and {u.language for u in result.utterances} == {"de"}
    for utt in result.utterances:
        info = sf.info(utt.audio)
        assert (info.samplerate, info.channels) == (16000, 1) and 1.0 <= info.duration <= 2.0
        assert Path(utt.audio).stat().st_size < 64_000
    ds = AsrDataset(EXAMPLE, DataConfig())
    item = ds[0]
    assert item["language"] == "de" and item["audio"].ndim == 1 and abs(item["audio"]).max() > 0.05


def test_dataset_passes_data_default_language(tmp_path):
    rows = [json.loads(line) for line in EXAMPLE.read_text(encoding="utf-8").splitlines()]
    lines = [{k: v for k, v in row.items() if k != "lang"} for row in rows]
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps(dict(r, audio_filepath=str(EXAMPLE.parent / r["audio_filepath"])))
                                + "\n" for r in lines), encoding="utf-8")
    with pytest.raises(ValueError, match="line 1: no field 'language'"):
        AsrDataset(manifest, DataConfig())
    assert {u.language for u in AsrDataset(manifest, DataConfig(default_language="de")).utterances} == {"de"}
