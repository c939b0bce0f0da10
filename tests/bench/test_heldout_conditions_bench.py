"""bench/heldout_conditions.py tabulates checkpoints' CER per evaluation set, each held-out
set against dev and the worst condition's ratio."""
from __future__ import annotations

from helpers import load_bench_script


def test_the_table_gives_each_set_against_dev_and_the_worst_condition():
    bench = load_bench_script("heldout_conditions")
    results = {"plain": {"dev": {"cer": 0.20}, "heldout_voices": {"cer": 0.25},
                         "heldout_conditions/room": {"cer": 0.32}, "heldout_conditions/phone": {"cer": 0.44}},
               "augmented": {"dev": {"cer": 0.20}, "heldout_voices": {"cer": 0.24},
                             "heldout_conditions/room": {"cer": 0.26}, "heldout_conditions/phone": {"cer": 0.28}}}
    lines = bench.table(results).splitlines()
    assert lines[0] == ("| checkpoint | dev | heldout_voices | heldout_conditions/room | heldout_conditions/phone "
                        "| worst condition / dev |")
    assert lines[2] == "| plain | 20.0% | 25.0% (1.25x) | 32.0% (1.60x) | 44.0% (2.20x) | 2.20x |"
    assert lines[3].endswith("| 28.0% (1.40x) | 1.40x |")
