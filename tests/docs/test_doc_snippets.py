"""The docs' Python snippets run as written, from the folder a user runs them in."""
from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import soundfile as sf
from helpers import noise_audio

DOCS = Path(__file__).resolve().parents[2] / "docs"


def python_block(doc: str, containing: str) -> str:
    """The one ```python block of docs/<doc> that contains `containing`."""
    blocks = [b for b in re.findall(r"```python\n(.*?)```", (DOCS / doc).read_text(), re.S) if containing in b]
    assert len(blocks) == 1, f"{doc}: {len(blocks)} python blocks hold {containing!r}"
    return blocks[0]


def run_snippet(code: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "<docs snippet>", "exec"), {"__name__": "__main__"})
    return out.getvalue()


def test_the_registered_model_snippet_transcribes_and_leaves_no_stray_store(tmp_path, monkeypatch, tiny_model,
                                                                           tiny_processor):
    """A model registered as `compare` registers it (a pyfunc around the HF folder, version 1
    of asr-grpo-rl in outputs/mlflow.db); the snippet loads it by name and transcribes."""
    import mlflow

    from asr_grpo.models import save_hf_checkpoint
    from asr_grpo.serving import save_transcriber
    from asr_grpo.tracking.mlflow_run import ensure_experiment
    from asr_grpo.tracking.registry import MODEL_ARTIFACT

    monkeypatch.chdir(tmp_path)
    uri = "sqlite:///outputs/mlflow.db"
    Path("outputs").mkdir()
    client = mlflow.MlflowClient(uri)
    run_id = client.create_run(ensure_experiment(client, "asr-grpo", uri)).info.run_id
    packaged = save_transcriber(save_hf_checkpoint(tiny_model, tiny_processor, tmp_path / "hf"), tmp_path / "pkg")
    client.log_artifacts(run_id, str(packaged), MODEL_ARTIFACT)
    client.create_registered_model("asr-grpo-rl")
    client.create_model_version("asr-grpo-rl", source=f"runs:/{run_id}/{MODEL_ARTIFACT}", run_id=run_id)
    sf.write("utt.wav", noise_audio(1.0, 0), 16000)

    before = mlflow.get_tracking_uri()
    try:
        printed = run_snippet(python_block("sweeps-and-reports.md", "mlflow.pyfunc.load_model"))
    finally:   # the snippet sets the process-wide URI: later tests keep theirs
        mlflow.set_tracking_uri(before)
    transcripts = eval(printed.strip())   # the snippet prints the list predict returns
    assert isinstance(transcripts, list) and len(transcripts) == 1 and isinstance(transcripts[0], str)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("mlflow")) == []


def test_the_checkpoint_building_commands_write_what_plain_transformers_loads(tmp_path, monkeypatch):
    """docs/own-model-and-data.md, "A checkpoint without a hub": its shell lines (all but
    the published sizes', minutes of CPU) in a fresh folder, then its Python block."""
    import shlex
    import subprocess
    import sys

    block = re.search(r"```bash\n(printf .*?)```", (DOCS / "own-model-and-data.md").read_text(), re.S).group(1)
    lines = [line for line in block.splitlines() if "qwen3_asr_" not in line]
    assert any(line.startswith("python -m asr_grpo.init_checkpoint") for line in lines)
    for line in lines:
        if line.startswith("python "):
            line = f"{shlex.quote(sys.executable)} {line[len('python '):]}"
        subprocess.run(line, shell=True, check=True, cwd=tmp_path, timeout=300, capture_output=True)
    monkeypatch.chdir(tmp_path)
    params, vocab = map(int, run_snippet(python_block("own-model-and-data.md", "from_pretrained")).split())
    assert params > 1_000_000 and 0 < vocab <= 300


def test_a_given_tokenizer_is_used_as_it_is_and_one_lacking_the_chat_tokens_is_refused(tmp_path, monkeypatch,
                                                                                      tiny_processor):
    import pytest
    from helpers import call_main

    from asr_grpo.models import load_processor

    given = tmp_path / "given"
    tiny_processor.tokenizer.save_pretrained(given)
    call_main("asr_grpo.init_checkpoint", [f"tokenizer={given}", f"output_dir={tmp_path / 'ckpt'}"], monkeypatch)
    assert load_processor(str(tmp_path / "ckpt")).tokenizer.get_vocab() == tiny_processor.tokenizer.get_vocab()

    bare = tmp_path / "bare"
    tokenizer = tiny_processor.tokenizer.__class__.from_pretrained(given)
    tokenizer.chat_template = None
    tokenizer.save_pretrained(bare)
    with pytest.raises(SystemExit) as exited:
        call_main("asr_grpo.init_checkpoint", [f"tokenizer={bare}", f"output_dir={tmp_path / 'no'}"], monkeypatch)
    assert f"tokenizer={bare}: lacks a chat template" in exited.value.code and not (tmp_path / "no").exists()
