"""A user's bad input, through the commands as typed (`python -m asr_grpo.run`,
`python -m asr_grpo.sft`): one line naming the problem, exit status 1, no traceback, and
the run stops before anything is built, trained or tracked, so no MLflow run is left
FAILED. The commands run in this process (their Hydra `main`, given the argv a shell
would give it); one fault per command also runs in a subprocess, for what the terminal
shows."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from fault_injection import corrupt, row, tone, write_manifest, write_wav
from helpers import call_main

from asr_grpo.data import ManifestError

BOTH = ("asr_grpo.run", "asr_grpo.sft")


def user_files(folder: Path) -> dict[str, str]:
    """Good train and dev manifests (one utterance each) and the bad files the faults name."""
    folder.mkdir()
    good = write_wav(folder, "good.wav", tone(1.0))
    model_only = folder / "model-only"   # a model's config and weights, no processor files
    model_only.mkdir()
    (model_only / "config.json").write_text("{}")
    (model_only / "model.safetensors").write_bytes(b"")
    return {"train": write_manifest(folder / "train.jsonl", [row("t", good)]),
            "dev": write_manifest(folder / "dev.jsonl", [row("d", good)]),
            "empty": write_manifest(folder / "empty.jsonl", []),
            "missing_wav": write_manifest(folder / "missing_wav.jsonl", [row("t", good), row("m", "nowhere.wav")]),
            "corrupt_wav": write_manifest(folder / "corrupt_wav.jsonl", [row("c", corrupt(folder))]),
            "nothing": str(folder / "nothing"), "model_only": str(model_only)}


# fault -> (the commands it is tried on, the keys it sets (None: unset), what the one line
# must say), all of the user's files `f`.
FAULTS = {
    "a missing WAV": (BOTH, lambda f: {"data.train_manifest": f["missing_wav"]},
                      lambda f: [f"{f['missing_wav']}, line 2: ", "nowhere.wav: audio file not found"]),
    "a corrupt WAV": (BOTH, lambda f: {"data.dev_manifest": f["corrupt_wav"]},
                      lambda f: [f"{f['corrupt_wav']}, line 1: ", "unreadable or corrupt audio file"]),
    "an empty dev manifest": (BOTH, lambda f: {"data.dev_manifest": f["empty"]},
                              lambda f: [f"{f['empty']}: the dev split has no utterances"]),
    "an empty train manifest": (BOTH, lambda f: {"data.train_manifest": f["empty"]},
                                lambda f: [f"{f['empty']}: the train split has no utterances"]),
    "an empty RL manifest": (("asr_grpo.run",), lambda f: {"data.rl_manifest": f["empty"]},
                             lambda f: [f"{f['empty']}: the rl split has no utterances"]),
    "a dev manifest with no usable line": (
        BOTH, lambda f: {"data.dev_manifest": f["corrupt_wav"], "data.on_bad_audio": "skip"},
        lambda f: [f"{f['corrupt_wav']}: the dev split has no usable utterance", "unreadable or corrupt"]),
    "a dev manifest that is not there": (BOTH, lambda f: {"data.dev_manifest": f["nothing"]},
                                         lambda f: [f"data.dev_manifest: {f['nothing']} does not exist"]),
    "a test manifest alone": (
        BOTH, lambda f: {"data.train_manifest": None, "data.dev_manifest": None, "data.test_manifest": f["dev"]},
        lambda f: ["missing: data.train_manifest, data.dev_manifest"]),
    "a model.path that does not exist": (BOTH, lambda f: {"model.path": f["nothing"]},
                                         lambda f: [f"model.path='{f['nothing']}': {f['nothing']} does not exist"]),
    "a model folder without processor files": (
        BOTH, lambda f: {"model.path": f["model_only"]},
        lambda f: [f"model.path='{f['model_only']}': {f['model_only']} has a model but no processor",
                   "no tokenizer (tokenizer.json or vocab.json or tokenizer.model)",
                   "no feature extractor config (preprocessor_config.json or processor_config.json)"]),
}


def command_line(out: Path, files: dict[str, str], fault: str) -> list[str]:
    keys = {"data.train_manifest": files["train"], "data.dev_manifest": files["dev"], **FAULTS[fault][1](files)}
    return ["debug=fast", f"paths.output_root={out}", f"logger.tracking_uri=sqlite:///{out}/mlflow.db",
            *(f"{k}={v}" for k, v in keys.items() if v is not None)]


def assert_nothing_started(out: Path) -> None:
    assert not (out / "mlflow.db").exists(), "an MLflow run was opened"
    assert not (out / "corpus").exists() and not (out / "checkpoints").exists()
    ray = sys.modules.get("ray")
    assert ray is None or not ray.is_initialized()


@pytest.mark.parametrize("command, fault", [(c, f) for f, (commands, *_) in FAULTS.items() for c in commands])
def test_a_bad_input_ends_the_command_with_one_line_naming_it(tmp_path, monkeypatch, capfd, command, fault):
    files, out = user_files(tmp_path / "mine"), tmp_path / "out"
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    with pytest.raises(SystemExit) as exited:
        call_main(command, command_line(out, files, fault), monkeypatch)
    message = exited.value.code   # what the interpreter prints to stderr, with exit status 1
    assert isinstance(message, str) and message.startswith(f"{command}: ") and "\n" not in message
    for needle in FAULTS[fault][2](files):
        assert needle in message
    assert "Traceback" not in capfd.readouterr().err
    assert_nothing_started(out)


def test_hydra_full_error_shows_the_traceback(tmp_path, monkeypatch):
    files, out = user_files(tmp_path / "mine"), tmp_path / "out"
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
    with pytest.raises(ManifestError, match="the dev split has no utterances"):
        call_main("asr_grpo.sft", command_line(out, files, "an empty dev manifest"), monkeypatch)
    assert_nothing_started(out)


@pytest.mark.parametrize("command, fault", [("asr_grpo.run", "a corrupt WAV"), ("asr_grpo.sft", "an empty dev manifest")])
def test_the_terminal_shows_the_one_line_and_exit_status_1(tmp_path, command, fault):
    files, out = user_files(tmp_path / "mine"), tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"} | {"RAY_ADDRESS": ""}
    done = subprocess.run([sys.executable, "-m", command, *command_line(out, files, fault)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    ours = [line for line in done.stderr.splitlines() if line.startswith(f"{command}: ")]
    assert len(ours) == 1 and all(needle in ours[0] for needle in FAULTS[fault][2](files))
    assert_nothing_started(out)
