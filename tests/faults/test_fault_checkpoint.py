"""Interrupted checkpoints: a process SIGKILLed while it writes a checkpoint leaves the
previous one intact and loadable, and `latest` never points at a partial one. The
writer (ckpt_writer.py) saves through the real code paths in a loop; the test kills it
the moment a save is half-written, then loads what is there."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from fault_injection import wait_for
from safetensors.torch import load_file

from asr_grpo.models import checkpoint_metadata, is_complete_checkpoint, load_model
from asr_grpo.models import step_checkpoints as ckpt
from asr_grpo.models.checkpoint import COMPLETE_MARKER

pytestmark = pytest.mark.slow
WRITER = Path(__file__).with_name("ckpt_writer.py")
OPTIMIZER_FLOATS = 12 * 1024 * 1024   # as in ckpt_writer.py


def kill_mid_write(out: Path, mode: str, completed, mid_write, attempts: int = 3) -> None:
    """Run the writer and SIGKILL it once a save has completed and another is half
    written; retried (a new writer) if the kill landed between two saves."""
    for _ in range(attempts):
        proc = subprocess.Popen([sys.executable, str(WRITER), str(out), mode],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            wait_for(lambda proc=proc: proc.poll() is not None or (completed() and mid_write()), 600, "a save in progress",
                     period_s=0.001)
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == -signal.SIGKILL, proc.stderr.read()
        if mid_write():
            return
    pytest.fail(f"the writer was never killed in the middle of a save in {attempts} tries")


def assert_whole(hf: Path, step: int) -> None:
    """The HF folder of save `step`: complete, loadable with transformers, its weights."""
    assert is_complete_checkpoint(hf) and checkpoint_metadata(hf)["step"] == step
    model, _ = load_model(str(hf))
    assert torch.all(model.get_input_embeddings().weight[0] == float(step))


def test_rl_checkpoint_killed_mid_write_leaves_latest_on_the_previous_one(tmp_path):
    out = tmp_path / "rl"
    kill_mid_write(out, "rl", completed=lambda: (out / ckpt.LATEST).is_file(),
                   mid_write=lambda: any(out.glob(".step_*.partial")))
    latest = ckpt.latest_checkpoint(out)
    step = ckpt.read_driver_state(latest)["step"]
    assert latest == ckpt.step_dir(out, step)
    assert_whole(latest / "hf", step)
    assert load_file(str(latest / "optimizer.safetensors"))["state"].numel() == OPTIMIZER_FLOATS
    partial = sorted(p.name for p in out.glob(".step_*.partial"))
    assert partial == [f".step_{step + 1:06d}.partial"]   # the save that was cut short
    assert ckpt.discard_partials(out) == partial and not any(out.glob(".step_*"))
    assert ckpt.latest_checkpoint(out) == latest


def test_hf_checkpoint_killed_mid_write_stays_loadable(tmp_path):
    sft = tmp_path / "sft"
    kill_mid_write(tmp_path, "hf", completed=lambda: (sft / COMPLETE_MARKER).is_file(),
                   mid_write=lambda: any(tmp_path.glob("sft.tmp-*")))
    assert_whole(sft, checkpoint_metadata(sft)["step"])


def test_a_kill_between_the_two_renames_is_repaired(tmp_path):
    """The one instant a checkpoint folder is missing: the old copy moved aside, the new
    one not yet in. RL: `latest` names a step being re-saved; HF: the SFT folder."""
    out = tmp_path / "rl"
    out.mkdir()
    staging = ckpt.staging_dir(out, 3)
    (staging / "weights.txt").write_text("step 3")
    final = ckpt.commit(out, staging, 3, {"step": 3})
    os.replace(final, out / ".step_000003.old")   # what commit() does first when re-saving step 3
    assert ckpt.latest_checkpoint(out) == final and (final / "weights.txt").read_text() == "step 3"

    sft = tmp_path / "sft"
    (tmp_path / "sft.tmp-42").mkdir()
    (tmp_path / "sft.tmp-42" / COMPLETE_MARKER).write_text('{"step": 2}')
    (tmp_path / "sft.old-42").mkdir()
    (tmp_path / "sft.old-42" / COMPLETE_MARKER).write_text('{"step": 1}')
    assert is_complete_checkpoint(sft) and checkpoint_metadata(sft) == {"step": 2}   # the newer copy


def test_keep_last_never_deletes_the_checkpoint_just_made(tmp_path):
    """A fresh run in a folder an earlier, longer run left checkpoints in: rotation keeps
    the newest up to the step just saved, and leaves the later ones alone."""
    out = tmp_path / "rl"
    out.mkdir()
    for step in (199, 200):   # the earlier run's
        ckpt.commit(out, ckpt.staging_dir(out, step), step, {"step": step}, keep_last=2)
    for step in (1, 2, 3):
        made = ckpt.commit(out, ckpt.staging_dir(out, step), step, {"step": step}, keep_last=2)
        assert ckpt.latest_checkpoint(out) == made   # the pointer names a whole checkpoint
    assert sorted(p.name for p in out.glob("step_*")) == ["step_000002", "step_000003", "step_000199", "step_000200"]
