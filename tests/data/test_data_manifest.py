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
    "unknown language 'fr'": _row(language="fr"),
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
    lines = [_row(id="a"), "not json", _row(id="b", language="de"), _row(id="c"),
             _row(id="d", audio="wavs/gone.wav")]
    result = read_manifest(_write(tmp_path, lines), on_bad="skip")
    assert [u.id for u in result.utterances] == ["a", "c"]
    assert [line for line, _ in result.skipped] == [2, 3, 5]
    assert "unknown language 'de'" in result.skipped[1][1]


def test_missing_manifest_and_bad_mode(tmp_path):
    with pytest.raises(ManifestError, match="manifest file not found"):
        read_manifest(tmp_path / "none.jsonl")
    with pytest.raises(ValueError, match="on_bad"):
        read_manifest(tmp_path / "none.jsonl", on_bad="ignore")
