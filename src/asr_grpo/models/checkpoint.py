"""HF-format checkpoints written atomically: a crash mid-write never leaves a folder
that looks complete, and the previous checkpoint stays loadable. The one moment a
folder is missing (old copy moved aside, new one not yet in) is repaired by
`is_complete_checkpoint`, which puts the newest complete copy back."""
from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any, Callable

COMPLETE_MARKER = "checkpoint_complete.json"


def fsync_path(path: str | Path) -> None:
    """fsync a file or a folder (a folder's fsync makes its renames durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(path: str | Path) -> None:
    """fsync every file and folder under `path`, `path` last."""
    for root, _dirs, files in os.walk(path, topdown=False):
        for name in files:
            fsync_path(os.path.join(root, name))
        fsync_path(root)


def save_hf_checkpoint(model, processor, path: str | Path, metadata: dict[str, Any] | None = None, *,
                       state_dict: dict[str, Any] | None = None,
                       write_extra: Callable[[Path], None] | None = None) -> Path:
    """save_pretrained into `<path>.tmp-<pid>`, fsync, then rename over `path`.
    `state_dict`: the weights to write in place of the model's own (a LoRA model's merged
    ones); `write_extra(folder)` adds files before the folder is marked complete."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    model.save_pretrained(tmp, safe_serialization=True, state_dict=state_dict)
    processor.save_pretrained(tmp)
    if write_extra is not None:
        write_extra(tmp)
    (tmp / COMPLETE_MARKER).write_text(json.dumps(metadata or {}, indent=2, sort_keys=True))
    fsync_tree(tmp)
    # os.replace cannot replace a non-empty directory: move the old one aside first.
    old = path.with_name(f"{path.name}.old-{os.getpid()}")
    if path.exists():
        os.replace(path, old)
    os.replace(tmp, path)
    fsync_path(path.parent)
    if old.exists():
        shutil.rmtree(old)
    return path


def recover_interrupted_save(path: str | Path) -> bool:
    """A save killed between its two renames leaves no folder at `path` but a complete
    new copy (`.tmp-<pid>`) and the old one (`.old-<pid>`): move the new one (else the
    old one) back into place. Returns whether it did."""
    path = Path(path)
    if path.exists() or not path.parent.is_dir():
        return False
    for pattern in (f"{path.name}.tmp-*", f"{path.name}.old-*"):   # the newer copy first
        for candidate in sorted(path.parent.glob(pattern)):
            if (candidate / COMPLETE_MARKER).is_file():
                os.replace(candidate, path)
                return True
    return False


def is_complete_checkpoint(path: str | Path) -> bool:
    recover_interrupted_save(path)
    return (Path(path) / COMPLETE_MARKER).is_file()


WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
# What the processor loads beside the weights: a tokenizer (any one of these) and the
# audio feature extractor's settings (either file, by transformers version).
TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "tokenizer.model")
FEATURE_EXTRACTOR_FILES = ("preprocessor_config.json", "processor_config.json")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def checkpoint_problem(path: str | Path) -> str | None:
    """Why `path` cannot serve as a model to load (None: it can).

    The completion marker belongs to this project's own atomic saves (a folder of ours
    never lacks it). Any other folder that `from_pretrained` reads qualifies: a
    `config.json` beside its weights and the processor's tokenizer and feature-extractor
    files, as `save_pretrained` of model and processor or a download leaves them. A name
    that is no local path but looks like `org/name` is left to `from_pretrained` (a hub
    id, where a hub is reachable).
    """
    text = str(path)
    if not text:
        return "no path given"
    p = Path(path)
    recover_interrupted_save(p)
    if not p.exists():
        if _HUB_ID.match(text) and not text.startswith((".", "/")):
            return None
        return f"{text} does not exist"
    if not p.is_dir():
        return f"{text} is a file, not a checkpoint folder"
    if (p / COMPLETE_MARKER).is_file():
        return None
    if not (p / "config.json").is_file():
        return f"{text} has no config.json (not a save_pretrained folder)"
    if not any((p / name).is_file() for name in WEIGHT_FILES):
        return f"{text} has a config.json but no weights ({' or '.join(WEIGHT_FILES[::2])})"
    processor = (("tokenizer", TOKENIZER_FILES), ("feature extractor config", FEATURE_EXTRACTOR_FILES))
    missing = [f"no {what} ({' or '.join(names)})" for what, names in processor
               if not any((p / name).is_file() for name in names)]
    if missing:   # transformers would fail on it with an OSError that names neither
        return (f"{text} has a model but no processor: {'; '.join(missing)}; save the processor "
                f"beside it (processor.save_pretrained)")
    return None


def checkpoint_metadata(path: str | Path) -> dict[str, Any]:
    return json.loads((Path(path) / COMPLETE_MARKER).read_text())
