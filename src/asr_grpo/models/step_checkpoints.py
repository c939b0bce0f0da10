"""RL checkpoints: `<output_dir>/step_<k>/{hf,ds,driver_state.json}` written into a temp
folder (`.step_<k>.partial`), fsynced and renamed when complete; `latest` is a one-line
file replaced atomically, so it never points at a partial checkpoint. A process killed
mid-write leaves the previous checkpoint and `latest` as they were (and a `.partial`
folder that `discard_partials` removes); one killed while re-saving an existing step
leaves that step's old copy aside, which `latest_checkpoint` puts back."""
from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

from asr_grpo.models.checkpoint import fsync_path, fsync_tree

LATEST = "latest"
DRIVER_STATE = "driver_state.json"


def step_dir(output_dir: str | Path, step: int) -> Path:
    return Path(output_dir) / f"step_{step:06d}"


def staging_dir(output_dir: str | Path, step: int) -> Path:
    path = Path(output_dir) / f".step_{step:06d}.partial"
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path


def _aside(final: Path) -> Path:
    return final.with_name(f".{final.name}.old")


def commit(output_dir: str | Path, staging: Path, step: int, driver_state: dict, keep_last: int = 0) -> Path:
    """Write the driver state, fsync every file and folder, rename the staging folder
    into place, then move `latest`; with `keep_last` > 0, delete all but that many of
    the newest step checkpoints up to this one (only after `latest` points at the new
    one). Later steps in the folder (an earlier run's, in a folder a fresh run reuses)
    are left alone: counted among the newest, they would delete the checkpoint just made."""
    (staging / DRIVER_STATE).write_text(json.dumps(driver_state, indent=2, sort_keys=True))
    fsync_tree(staging)
    final = step_dir(output_dir, step)
    old = _aside(final)
    if final.exists():   # re-saving a step: keep the old copy until the new one is in place
        if old.exists():
            shutil.rmtree(old)
        os.replace(final, old)
    os.replace(staging, final)
    fsync_path(output_dir)
    tmp = Path(output_dir) / f".{LATEST}.tmp"
    tmp.write_text(final.name + "\n")
    fsync_path(tmp)
    os.replace(tmp, Path(output_dir) / LATEST)
    fsync_path(output_dir)
    if old.exists():
        shutil.rmtree(old)
    if keep_last > 0:
        upto = [p for p in sorted(Path(output_dir).glob("step_*")) if p.name <= final.name]   # zero-padded
        for stale in upto[:-keep_last]:
            shutil.rmtree(stale)
    return final


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    pointer = Path(output_dir) / LATEST
    if not pointer.is_file():
        return None
    path = Path(output_dir) / pointer.read_text().strip()
    if not path.exists() and (_aside(path) / DRIVER_STATE).is_file():
        os.replace(_aside(path), path)   # killed while re-saving this step: the old copy is whole
    if not (path / DRIVER_STATE).is_file():
        raise FileNotFoundError(f"{pointer} points at {path}, which is not a complete checkpoint")
    return path


def discard_partials(output_dir: str | Path) -> list[str]:
    """Remove the staging folders of saves that never finished (and old copies left
    aside next to their replacement); returns their names."""
    out = Path(output_dir)
    gone = sorted(p.name for p in out.glob(".step_*.partial") if p.is_dir())
    gone += sorted(p.name for p in out.glob(".step_*.old") if (out / p.name[1:-len(".old")]).is_dir())
    for name in gone:
        shutil.rmtree(Path(output_dir) / name)
    return gone


def read_driver_state(path: Path) -> dict:
    return json.loads((path / DRIVER_STATE).read_text())


_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
_FULL_TEXTS = ("No space left on device", "Disk quota exceeded", "File too large")
FULL_BELOW_BYTES = 1 << 20


def disk_full_reason(exc: BaseException, output_dir: str | Path) -> str | None:
    """Why a failed save failed for want of space, or None. The error says so itself (an
    OSError's errno, or its text where a library rewrapped it, as safetensors and a Ray
    task error do), or does not (torch.save's writer reports only a short write), when the
    file system of `output_dir` has under 1 MiB left."""
    seen, todo = set(), [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in _FULL_ERRNOS:
            return os.strerror(e.errno)
        for text in _FULL_TEXTS:
            if text in str(e):
                return text
        todo += [getattr(e, "cause", None), e.__cause__, e.__context__]   # a Ray task error's own `cause`
    try:
        free = shutil.disk_usage(output_dir).free
    except OSError:
        return None
    return f"{free / 2**20:.1f} MiB left on its file system" if free < FULL_BELOW_BYTES else None
