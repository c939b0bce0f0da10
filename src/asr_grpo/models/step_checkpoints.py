"""RL checkpoints: `<output_dir>/step_<k>/{hf,ds,driver_state.json}` written into a temp
folder (`.step_<k>.partial`), fsynced and renamed when complete; `latest` is a one-line
file replaced atomically, so it never points at a partial checkpoint. A process killed
mid-write leaves the previous checkpoint and `latest` as they were (and a `.partial`
folder that `discard_partials` removes); one killed while re-saving an existing step
leaves that step's old copy aside, which `latest_checkpoint` puts back."""
from __future__ import annotations

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
    the newest step checkpoints (only after `latest` points at the new one)."""
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
        for stale in sorted(Path(output_dir).glob("step_*"))[:-keep_last]:
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
