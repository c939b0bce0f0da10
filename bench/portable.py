"""Results under bench/results/ are committed, so they must not name the machine that
wrote them: a path inside the repository is written relative to it, one in the temporary
folder under `<tmp>`. tests/bench/test_results_portable.py holds every committed result to it."""
from __future__ import annotations

import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def portable(text: str) -> str:
    """`text` with the repository's absolute path made relative and the temporary folder's
    written `<tmp>`."""
    text = text.replace(f"{REPO}/", "").replace(str(REPO), ".")
    return text.replace(f"{tempfile.gettempdir()}/", "<tmp>/")
