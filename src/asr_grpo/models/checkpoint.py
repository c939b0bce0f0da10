"""HF-format checkpoints written atomically: a crash mid-write never leaves a folder
that looks complete, and the previous checkpoint stays loadable."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

COMPLETE_MARKER = "checkpoint_complete.json"


def _fsync_tree(path: Path) -> None:
    for root, _dirs, files in os.walk(path):
        for name in files:
            with open(os.path.join(root, name), "rb") as fh:
                os.fsync(fh.fileno())
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_hf_checkpoint(model, processor, path: str | Path, metadata: dict[str, Any] | None = None) -> Path:
    """save_pretrained into `<path>.tmp-<pid>`, fsync, then rename over `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    model.save_pretrained(tmp, safe_serialization=True)
    processor.save_pretrained(tmp)
    (tmp / COMPLETE_MARKER).write_text(json.dumps(metadata or {}, indent=2, sort_keys=True))
    _fsync_tree(tmp)
    # os.replace cannot replace a non-empty directory: move the old one aside first.
    old = path.with_name(f"{path.name}.old-{os.getpid()}")
    if path.exists():
        os.replace(path, old)
    os.replace(tmp, path)
    if old.exists():
        shutil.rmtree(old)
    return path


def is_complete_checkpoint(path: str | Path) -> bool:
    return (Path(path) / COMPLETE_MARKER).is_file()


def checkpoint_metadata(path: str | Path) -> dict[str, Any]:
    return json.loads((Path(path) / COMPLETE_MARKER).read_text())
