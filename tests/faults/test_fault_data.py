"""Bad data, one injected fault at a time: the policy `data.on_bad_audio` either fails
fast naming the manifest file and line, or skips the line and counts it; audio that is
merely unusual (stereo, another sample rate) is converted, never a crash in the model."""
from __future__ import annotations

import numpy as np
import pytest
from fault_injection import SR, corrupt, row, tone, write_manifest, write_wav

from asr_grpo.config.schema import DataConfig
from asr_grpo.data import AsrDataset, AudioError, ManifestError


def empty_file(folder) -> str:
    (folder / "empty.wav").write_bytes(b"")
    return "empty.wav"


# fault -> (builds the manifest row in `folder`, what the error must say). Caught when
# the manifest is read (header and fields), before anything starts.
MANIFEST_FAULTS = {
    "missing audio": (lambda f: row("u", "nowhere.wav"), "audio file not found"),
    "corrupt audio": (lambda f: row("u", corrupt(f)), "unreadable or corrupt audio file"),
    "empty file": (lambda f: row("u", empty_file(f)), "audio file is empty (0 bytes)"),
    "zero-length audio": (lambda f: row("u", write_wav(f, "zero.wav", np.zeros(0, np.float32))),
                          "audio file is empty (0 frames)"),
    "wrong sample rate": (lambda f: row("u", write_wav(f, "lowrate.wav", tone(1.0, 4000), 4000)),
                          "sample rate 4000 Hz is below 8000 Hz"),
    "over-long audio": (lambda f: row("u", write_wav(f, "long.wav", tone(3.0)), 3.0),
                        "longer than the maximum 2.0 s"),
    "missing field": (lambda f: row("u", write_wav(f, "a.wav", tone(1.0)), text=...),
                      "missing required field 'text'"),
    "wrong type": (lambda f: row("u", write_wav(f, "a.wav", tone(1.0)), duration="1.0"),
                   "field 'duration' must be int/float, got str"),
    "empty text": (lambda f: row("u", write_wav(f, "a.wav", tone(1.0)), text="   "), "empty text"),
    "unexpected script": (lambda f: row("u", write_wav(f, "a.wav", tone(1.0)), text="включи свет"),
                          "unexpected script for language 'en': CYRILLIC"),
    "no Chinese in zh": (lambda f: row("u", write_wav(f, "a.wav", tone(1.0)), language="zh"),
                         "text for language 'zh' has no Chinese character"),
}
# Caught when the samples are read (the header looks fine).
LOAD_FAULTS = {
    "clipped to silence": (lambda f: row("u", write_wav(f, "silent.wav", np.zeros(SR, np.float32))),
                           "audio is silent"),
    "NaN samples": (lambda f: row("u", write_wav(f, "nan.wav", np.full(SR, np.nan, np.float32), subtype="FLOAT")),
                    "NaN or infinite samples"),
}


def manifest(folder, bad: dict) -> str:
    """Good line, bad line, good line: the bad one is line 2."""
    good = write_wav(folder, "good.wav", tone(1.0))
    return write_manifest(folder / "train.jsonl", [row("g1", good), bad, row("g2", good)])


def data_cfg(policy: str) -> DataConfig:
    return DataConfig(on_bad_audio=policy, max_duration_s=2.0)


@pytest.mark.parametrize("fault", list(MANIFEST_FAULTS))
def test_manifest_fault_fails_fast_naming_file_and_line_or_is_skipped(tmp_path, fault):
    build, problem = MANIFEST_FAULTS[fault]
    path = manifest(tmp_path, build(tmp_path))
    with pytest.raises(ManifestError) as err:
        AsrDataset(path, data_cfg("error"))
    assert f"{path}, line 2: " in str(err.value) and problem in str(err.value)
    skipping = AsrDataset(path, data_cfg("skip"))
    assert [u.id for u in skipping.utterances] == ["g1", "g2"]
    assert [line for line, _ in skipping.skipped] == [2] and problem in skipping.skipped[0][1]


@pytest.mark.parametrize("fault", list(LOAD_FAULTS))
def test_sample_fault_fails_naming_file_and_line_or_is_skipped(tmp_path, fault):
    build, problem = LOAD_FAULTS[fault]
    path = manifest(tmp_path, build(tmp_path))
    failing = AsrDataset(path, data_cfg("error"))
    with pytest.raises(AudioError) as err:
        failing.load(1)
    assert f"(manifest {path}, line 2)" in str(err.value) and problem in str(err.value)
    skipping = AsrDataset(path, data_cfg("skip"))
    assert skipping.load(1) is None and skipping.load(1) is None   # counted once
    assert [line for line, _ in skipping.skipped] == [2] and problem in skipping.skipped[0][1]
    assert skipping.load(0)["id"] == "g1" and skipping.load(2)["id"] == "g2"


def test_a_manifest_with_no_usable_audio_says_so(tmp_path):
    silent = write_wav(tmp_path, "silent.wav", np.zeros(SR, np.float32))
    path = write_manifest(tmp_path / "all_bad.jsonl", [row("s", silent)])
    with pytest.raises(ManifestError, match=r"no utterance has usable audio \(the train split; last problem"):
        AsrDataset(path, data_cfg("skip"), split="train").load(0)


def test_an_empty_manifest_is_an_error_naming_file_and_split(tmp_path):
    """Not a dev CER of 0 or an RL run on no prompts: the file and the split are named."""
    empty = tmp_path / "dev.jsonl"
    empty.write_text("\n")   # blank lines are no utterances
    with pytest.raises(ManifestError, match=f"^{empty}: the dev split has no utterances"):
        AsrDataset(empty, data_cfg("error"), split="dev")


def test_a_manifest_whose_lines_are_all_skipped_is_an_error_naming_the_first(tmp_path):
    path = write_manifest(tmp_path / "rl.jsonl", [row("a", "nowhere.wav"), row("b", corrupt(tmp_path))])
    with pytest.raises(ManifestError) as err:
        AsrDataset(path, data_cfg("skip"), split="rl")
    message = str(err.value)
    assert message.startswith(f"{path}: the rl split has no usable utterance: ")
    assert "skipped all 2 lines (line 1: " in message and "audio file not found" in message


@pytest.mark.parametrize("name, audio, sr", [("stereo.wav", tone(1.0, channels=2), SR),
                                             ("cd.wav", tone(1.0, 44100), 44100),
                                             ("phone.wav", tone(1.0, 8000), 8000)])
def test_stereo_and_other_rates_become_16k_mono(tmp_path, name, audio, sr):
    path = manifest(tmp_path, row("odd", write_wav(tmp_path, name, audio, sr, subtype="FLOAT")))
    item = AsrDataset(path, data_cfg("error")).load(1)
    assert item["audio"].ndim == 1 and item["audio"].dtype == np.float32
    assert abs(len(item["audio"]) - SR) <= 1
    assert float(np.abs(item["audio"]).max()) > 0.1
