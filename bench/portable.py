"""Results under bench/results/ are committed, so they must not name the machine that
wrote them: a path inside the repository is written relative to it, one in the temporary
folder under `<tmp>`. tests/bench/test_results_portable.py holds every committed result to it."""
from __future__ import annotations

import platform
import subprocess
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def portable(text: str) -> str:
    """`text` with the repository's absolute path made relative and the temporary folder's
    written `<tmp>`."""
    text = text.replace(f"{REPO}/", "").replace(str(REPO), ".")
    return text.replace(f"{tempfile.gettempdir()}/", "<tmp>/")


def code_commit() -> str | None:
    """The short hash of the repository's HEAD, the code a result measured (None outside a
    git checkout)."""
    try:
        done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None


def cpu_name() -> str:
    """The CPU's model name (results compare only within one machine, so they name it)."""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()
