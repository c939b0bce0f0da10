"""A checkpoint that cannot be written for want of space ends the run with one line
naming it, and leaves the previous checkpoint intact (`latest` still names it, it loads,
no partial copy is left taking space).

How the disk fills: `trainer.output_dir` is a tmpfs of 120 MiB mounted for the test (a
real file system that runs out of blocks: writes fail with ENOSPC, torch.save's writer
with a short write). A debug=fast checkpoint takes about 82 MB, so step 1's fits and
step 2's does not. Mounting needs root (CAP_SYS_ADMIN); without it the test is skipped.
The detection itself (errno, rewrapped texts, a nearly empty file system) is unit-tested
below without a mount."""
from __future__ import annotations

import errno
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from asr_grpo.models import step_checkpoints as ckpt

pytestmark = pytest.mark.long   # a real run of a minute or more: `make test-long`, CI's own leg


@pytest.fixture
def small_disk(tmp_path):
    mount = tmp_path / "small_disk"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=120m", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.mark.slow
def test_a_full_disk_ends_the_run_with_one_line_and_keeps_the_last_checkpoint(root, tmp_path, small_disk):
    out = small_disk / "rl"
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"} | {"RAY_ADDRESS": ""}
    done = subprocess.run([sys.executable, "-m", "asr_grpo.run", "debug=fast", f"paths.output_root={root}",
                           "trainer.steps=3", "trainer.save_every=1", "trainer.eval_every=0",
                           f"trainer.output_dir={out}"], env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-5000:]
    ours = [line for line in done.stderr.splitlines() if line.startswith("asr_grpo.run: ")]
    assert len(ours) == 1, done.stderr[-3000:]
    assert ours[0].startswith(f"asr_grpo.run: the checkpoint of step 2 could not be written to {out} (")
    assert ours[0].endswith(f"{out / 'step_000001'} (step 1) is intact: make room, then resume with "
                            f"trainer.resume=true trainer.output_dir={out}")
    assert ckpt.latest_checkpoint(out) == out / "step_000001"
    assert ckpt.read_driver_state(out / "step_000001")["step"] == 1
    assert sorted(p.name for p in out.iterdir()) == ["latest", "step_000001"]   # the partial copy is gone
    from safetensors.torch import load_file

    assert load_file(out / "step_000001" / "hf" / "model.safetensors")


class RayTaskErrorLike(RuntimeError):
    """What ray.get raises for an actor's error: the original in `cause`."""

    def __init__(self, cause: BaseException):
        super().__init__("ray::PolicyRole.save() failed")
        self.cause = cause


@pytest.mark.parametrize("exc, reason", [
    (OSError(errno.ENOSPC, "No space left on device"), "No space left on device"),
    (OSError(errno.EDQUOT, "Disk quota exceeded"), "Disk quota exceeded"),
    (OSError(errno.EFBIG, "File too large"), "File too large"),   # past RLIMIT_FSIZE
    (RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)"),
     "No space left on device"),   # safetensors
    (RayTaskErrorLike(OSError(errno.ENOSPC, "No space left on device")), "No space left on device"),
])
def test_what_counts_as_a_full_disk(tmp_path, exc, reason):
    assert ckpt.disk_full_reason(exc, tmp_path) == reason


def test_a_short_write_counts_only_on_a_nearly_full_file_system(tmp_path, monkeypatch):
    short_write = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")   # torch.save
    assert ckpt.disk_full_reason(short_write, tmp_path) is None   # this disk has room: some other failure
    assert ckpt.disk_full_reason(PermissionError(errno.EACCES, "Permission denied"), tmp_path) is None
    monkeypatch.setattr(ckpt.shutil, "disk_usage", lambda _: SimpleNamespace(free=200_000))
    assert ckpt.disk_full_reason(short_write, tmp_path) == "0.2 MiB left on its file system"
