import json

import numpy as np
import pytest

from asr_grpo.data.manifest import ManifestError, read_manifest


def _row(**overrides):
    row = {"id": "u1", "audio": "wavs/a.wav", "text": "hello there", "language": "en",
           "keywords": ["hello"], "duration": 1.0}
    row.update(overrides)
    return {k: v for k, v in row.items() if v is not ...}   # ... drops a field


def _write(tmp_path, lines):
    path = tmp_path / "m.jsonl"
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines),
                    encoding="utf-8")
    return path


@pytest.fixture
def wav(make_wav):
    return make_wav("wavs/a.wav", 1.0)


def test_good_manifest(tmp_path, wav, make_wav):
    other = make_wav("elsewhere/b.wav", 2.0)
    path = _write(tmp_path, [_row(), "", _row(id="u2", audio=str(other), keywords=...,
                                              language="zh", text="你好", duration=2.0)])
    result = read_manifest(path)
    assert result.skipped == []
    first, second = result.utterances
    assert first.audio == str(wav) and first.keywords == ["hello"] and first.line == 1
    assert first.manifest == str(path) and first.duration == pytest.approx(1.0)
    assert second.audio == str(other) and second.keywords == [] and second.line == 3


BAD_LINES = {
    "invalid JSON": '{"id": "u1", "audio": ',
    "expected a JSON object": "[1, 2]",
    "missing required field 'text'": _row(text=...),
    "field 'duration' must be int/float, got str": _row(duration="1.0"),
    "field 'id' must be str": _row(id=5),
    "unknown language 'xx'": _row(language="xx"),
    "missing required field 'audio' (or 'audio_filepath')": {"path": "wavs/a.wav", "transcript": "hi",
                                                             "duration": 1.0, "lang": "en"},
    "no field 'language' (or 'lang'), and no data.default_language": _row(language=...),
    "fields 'audio' and 'audio_filepath' disagree": _row(audio_filepath="wavs/other.wav"),
    "field 'lang' must be str": {"audio_filepath": "wavs/a.wav", "text": "hi", "duration": 1.0, "lang": 7},
    "field 'offset' is 2.5: segments of a longer file are not supported": _row(offset=2.5),
    "unexpected script for language 'de': CYRILLIC": _row(language="de", text="Доброе утро"),
    "text for language 'ru' has no Cyrillic letter": _row(language="ru", text="hello"),
    "text for language 'ja' has no Chinese character or Hiragana letter or Katakana letter": _row(language="ja"),
    "empty text": _row(text="  "),
    "'keywords' must be a list of strings": _row(keywords="hello"),
    "audio file not found": _row(audio="wavs/missing.wav"),
    "in the manifest but": _row(duration=5.0),
    "longer than the maximum": _row(audio="wavs/long.wav", duration=3.0),
}


@pytest.mark.parametrize("problem", list(BAD_LINES))
def test_bad_line_raises_naming_manifest_and_line(tmp_path, wav, make_wav, problem):
    make_wav("wavs/long.wav", 3.0)
    path = _write(tmp_path, [_row(id="good"), BAD_LINES[problem]])
    with pytest.raises(ManifestError) as exc:
        read_manifest(path, max_duration_s=2.0)
    message = str(exc.value)
    assert f"{path}, line 2" in message and problem in message
    assert exc.value.line == 2


def test_corrupt_and_empty_audio_lines(tmp_path, wav, make_wav):
    (tmp_path / "wavs" / "bad.wav").write_bytes(b"not audio at all" * 10)
    make_wav("wavs/empty.wav", audio=np.zeros(0, np.float32))
    for name, problem in [("bad.wav", "unreadable or corrupt"), ("empty.wav", "empty")]:
        path = _write(tmp_path, [_row(audio=f"wavs/{name}")])
        with pytest.raises(ManifestError, match=problem) as exc:
            read_manifest(path)
        assert name in str(exc.value) and "line 1" in str(exc.value)


def test_duplicate_ids(tmp_path, wav):
    with pytest.raises(ManifestError, match="line 2: duplicate id 'u1'"):
        read_manifest(_write(tmp_path, [_row(), _row()]))


def test_skip_mode_counts_bad_lines_and_keeps_good(tmp_path, wav):
    lines = [_row(id="a"), "not json", _row(id="b", language="xx"), _row(id="c"),
             _row(id="d", audio="wavs/gone.wav")]
    result = read_manifest(_write(tmp_path, lines), on_bad="skip")
    assert [u.id for u in result.utterances] == ["a", "c"]
    assert [line for line, _ in result.skipped] == [2, 3, 5]
    assert "unknown language 'xx'" in result.skipped[1][1]


def test_missing_manifest_and_bad_mode(tmp_path):
    with pytest.raises(ManifestError, match="manifest file not found"):
        read_manifest(tmp_path / "none.jsonl")
    with pytest.raises(ValueError, match="on_bad"):
        read_manifest(tmp_path / "none.jsonl", on_bad="ignore")


def _nemo(audio="wavs/a.wav", text="Guten Tag", duration=1.0, lang="de", **extra):
    row = {"audio_filepath": audio, "text": text, "duration": duration, "lang": lang, **extra}
    return {k: v for k, v in row.items() if v is not ...}


def test_nemo_lines_load_with_paths_relative_to_the_manifest(tmp_path, make_wav, monkeypatch):
    make_wav("data/wavs/a.wav", 1.0)
    make_wav("data/wavs/b.wav", 1.5)
    manifest = tmp_path / "data" / "train.jsonl"
    manifest.write_text(json.dumps(_nemo()) + "\n"
                        + json.dumps(_nemo("wavs/b.wav", "Wie spät ist es?", 1.5, "de")) + "\n",
                        encoding="utf-8")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)    # relative paths follow the manifest, not the working folder
    first, second = read_manifest("../data/train.jsonl").utterances
    assert first.audio == str(tmp_path / "data" / "wavs" / "a.wav")
    assert second.audio == str(tmp_path / "data" / "wavs" / "b.wav")
    assert (first.id, first.text, first.language, first.keywords) == ("wavs/a.wav", "Guten Tag", "de", [])
    assert second.language == "de" and second.duration == pytest.approx(1.5) and second.line == 2


def test_mixed_manifest_of_both_spellings_and_languages(tmp_path, wav, make_wav):
    for i in range(2, 8):
        make_wav(f"wavs/{i}.wav", 1.0)
    lines = [
        _row(),                                                        # project keys, en
        _nemo("wavs/2.wav", text="Grüße aus München."),                # NeMo, de
        _nemo("wavs/3.wav", text="今日はいい天気です。", lang="ja"),      # NeMo, ja
        _row(id="ru-1", text="Доброе утро", language="ru", keywords=["утро"]),
        _nemo("wavs/4.wav", text="Bonjour à tous", lang=...),          # no language: the default
        {"id": "pt-1", "audio_filepath": "wavs/a.wav", "text": "Bom dia", "duration": 1.0,
         "language": "pt-BR"},                                         # mixed keys, region tag
        _nemo("wavs/5.wav", text="Buenos días", lang="Spanish"),       # a language name
        _nemo("wavs/6.wav", text="สวัสดีครับ", lang="TH"),
    ]
    result = read_manifest(_write(tmp_path, lines), default_language="fr")
    assert [u.language for u in result.utterances] == ["en", "de", "ja", "ru", "fr", "pt", "es", "th"]
    assert result.utterances[3].keywords == ["утро"] and result.utterances[5].id == "pt-1"
    assert result.skipped == []


def test_nemo_line_without_language_needs_a_default(tmp_path, wav, make_wav):
    make_wav("wavs/b.wav", 1.0)
    path = _write(tmp_path, [_nemo(lang="de"), _nemo("wavs/b.wav", lang=...)])
    with pytest.raises(ManifestError, match=r"line 2: no field 'language' \(or 'lang'\)") as exc:
        read_manifest(path)
    assert exc.value.line == 2 and str(path) in str(exc.value)
    assert [u.language for u in read_manifest(path, default_language="de").utterances] == ["de", "de"]
    with pytest.raises(ValueError, match="data.default_language: unknown language 'xx'"):
        read_manifest(path, default_language="xx")


def test_unknown_language_code_fails_naming_the_line(tmp_path, wav, make_wav):
    make_wav("wavs/b.wav", 1.0)
    path = _write(tmp_path, [_nemo(), _nemo("wavs/b.wav"), _nemo("wavs/c.wav", lang="klingon")])
    with pytest.raises(ManifestError) as exc:
        read_manifest(path)
    message = str(exc.value)
    assert f"{path}, line 3: unknown language 'klingon'" in message
    assert "Qwen3-ASR" in message and "de" in message and exc.value.line == 3


def test_nemo_lines_without_ids_are_named_by_their_audio(tmp_path, wav):
    with pytest.raises(ManifestError, match="line 2: duplicate id 'wavs/a.wav' .*audio path"):
        read_manifest(_write(tmp_path, [_nemo(), _nemo(text="Guten Abend")]))
