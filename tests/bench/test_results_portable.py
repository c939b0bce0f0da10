"""Committed benchmark results name no machine: no absolute path of the build machine
(its temporary folder, a checkout or home directory) in any file under bench/results/,
and bench/portable.py, which the scripts write through, rewrites such paths."""
from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path

from helpers import load_bench_script

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results"
# An absolute path under a folder that only exists on the machine that wrote it.
MACHINE_PATH = re.compile(
    r"(?<![\w.<>-])/(?:tmp|var/folders|private|work|root|home|Users|mnt|scratch)/[^\s\"'`)]*")


def committed_results() -> list[Path]:
    """Every file under bench/results/ that git tracks (all of them outside a git checkout)."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "bench/results"], cwd=REPO, check=True,
                             capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return sorted(p for p in RESULTS.rglob("*") if p.is_file())
    return [REPO / name for name in out.split("\0") if name]


def test_committed_results_hold_no_machine_paths():
    files = committed_results()
    assert any(f.suffix == ".json" for f in files), "no results found under bench/results/"
    hits = []
    for path in files:
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            hits += [f"{path.relative_to(REPO)}:{n}: {m}" for m in MACHINE_PATH.findall(line)]
    assert not hits, "machine paths in committed results (write them through bench/portable.py):\n" + \
        "\n".join(hits[:20])


def test_the_pattern_finds_machine_paths_and_spares_placeholders():
    assert MACHINE_PATH.findall("paths.output_root=/tmp/soak-8hstujko x") == ["/tmp/soak-8hstujko"]
    assert MACHINE_PATH.findall('"fitted from /work/main/bench/results/a.json"') == \
        ["/work/main/bench/results/a.json"]
    assert not MACHINE_PATH.findall(
        "paths.output_root=<tmp>/soak-1 bench/results/gpu_h200/a.json outputs/tmp/x sqlite:///outputs/m.db")


def test_portable_makes_repo_paths_relative_and_hides_the_temporary_folder():
    portable = load_bench_script("portable").portable
    tmp = Path(tempfile.gettempdir()) / "soak-abc"
    text = f"fitted from {REPO}/bench/results/gpu_h200/a.json; paths.output_root={tmp}; cwd {REPO}"
    assert portable(text) == \
        "fitted from bench/results/gpu_h200/a.json; paths.output_root=<tmp>/soak-abc; cwd ."
    assert not MACHINE_PATH.findall(portable(f"sft.output_dir={REPO}/outputs/checkpoints/sft-tiny-wide"))
