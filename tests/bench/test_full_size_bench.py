"""bench/full_size.py's parts: the corpus it hands the checkpoint builder is debug=fast's
(so SFT and RL reuse the corpus the tokenizer was trained on), and its memory sampler sees
a child process's allocation."""
from __future__ import annotations

import subprocess
import sys

import psutil
from helpers import compose_cfg, load_bench_script


def test_the_builder_gets_debug_fast_s_corpus(tmp_path):
    bench = load_bench_script("full_size")
    corpus = compose_cfg(tmp_path).data.corpus
    assert {o.split("=")[0].removeprefix("data.corpus."): int(o.split("=")[1]) for o in bench.DEBUG_CORPUS} == {
        k: corpus[k] for k in corpus if k.startswith("num_")}


def test_peak_memory_sees_what_a_child_process_allocates():
    bench = load_bench_script("full_size")
    code = "import time; b = bytearray(300 * 2**20); b[::4096] = b'x' * len(b[::4096]); time.sleep(1.5)"
    proc = subprocess.Popen([sys.executable, "-c", code])
    with bench.PeakMemory(psutil.Process(proc.pid), every_s=0.1) as peak:
        proc.wait(timeout=60)
    assert peak.total >= 250 * 2**20 and peak.by_role["command"] == max(peak.by_role.values())


def test_a_timed_out_stage_is_stopped_with_its_children(tmp_path):
    bench = load_bench_script("full_size")
    code = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
            "print('started', flush=True); time.sleep(60)")
    res = bench.run_stage("stuck", [sys.executable, "-c", code], tmp_path, timeout_s=3, log=tmp_path / "s.log")
    assert res["rc"] == "timeout" and "started" in res["output_tail"]
    leftover = [p for p in psutil.process_iter(["cmdline"]) if "time.sleep(60)" in " ".join(p.info["cmdline"] or [])
                and p.pid != psutil.Process().pid]
    assert not leftover
