"""RL checkpoints: `<output_dir>/step_<k>/{hf,ds,driver_state.json}` written into a temp
folder and renamed when complete; `latest` is a one-line file replaced atomically, so
it never points at a partial checkpoint."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

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


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def commit(output_dir: str | Path, staging: Path, step: int, driver_state: dict) -> Path:
    """Write the driver state, fsync, rename the staging folder into place, move `latest`."""
    (staging / DRIVER_STATE).write_text(json.dumps(driver_state, indent=2, sort_keys=True))
    for root, _dirs, files in os.walk(staging):
        for name in files:
            _fsync_path(Path(root) / name)
    final = step_dir(output_dir, step)
    if final.exists():
        shutil.rmtree(final)
    os.replace(staging, final)
    _fsync_path(Path(output_dir))
    tmp = Path(output_dir) / f".{LATEST}.tmp"
    tmp.write_text(final.name + "\n")
    with open(tmp, "rb") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, Path(output_dir) / LATEST)
    return final


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    pointer = Path(output_dir) / LATEST
    if not pointer.is_file():
        return None
    path = Path(output_dir) / pointer.read_text().strip()
    if not (path / DRIVER_STATE).is_file():
        raise FileNotFoundError(f"{pointer} points at {path}, which is not a complete checkpoint")
    return path


def read_driver_state(path: Path) -> dict:
    return json.loads((path / DRIVER_STATE).read_text())
