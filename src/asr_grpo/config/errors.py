"""Errors the user causes and fixes (a bad key, manifest, audio file or model folder; a full disk).
The commands end on one with a single line that names the problem and no traceback,
which `HYDRA_FULL_ERROR=1` brings back, as it does for Hydra's own errors."""
from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Iterator


class ConfigError(ValueError):
    """What the user gave cannot work; the message names the key or file and why."""


class DiskFull(RuntimeError):
    """A write failed for want of space (the device, a quota, a file-size limit); the
    message names the folder, what was kept and how to continue once there is room."""


def first_line(exc: BaseException) -> str:
    """An exception's message cut to its first line (its type's name when it has none):
    what a one-line report quotes of a cause."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


@contextmanager
def one_line_errors(program: str) -> Iterator[None]:
    """A ConfigError or DiskFull raised inside ends the process: `<program>: <message>` on
    stderr, exit status 1."""
    try:
        yield
    except (ConfigError, DiskFull) as e:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        raise SystemExit(f"{program}: {e}") from None
