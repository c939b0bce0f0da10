"""bench/lora_memory.py end to end at the tiny size (the real sizes take minutes): both
modes of SFT run in processes of their own and land in the JSON, LoRA training a small
share of the weights, with no machine path in the result."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers import BENCH_DIR

pytestmark = pytest.mark.long   # a real run of a minute or more: `make test-long`, CI's own leg


@pytest.mark.slow
def test_sft_full_and_lora_are_measured_side_by_side(tmp_path):
    out = tmp_path / "result"
    subprocess.run([sys.executable, str(BENCH_DIR / "lora_memory.py"), "--model", "tiny_qwen3_asr", "--steps", "2",
                    "--batch", "2", "--root", str(tmp_path / "root"), "--out", str(out)], check=True, timeout=600)
    text = (out / "lora_memory.json").read_text()
    assert str(tmp_path) not in text and str(BENCH_DIR.parent) not in text   # no machine paths
    result = json.loads(text)
    full, lora = result["results"]["sft"]["full"], result["results"]["sft"]["lora_r8"]
    for mode in (full, lora):
        assert len(mode["step_s"]) == 2 and mode["peak_rss_gb"] > 0 and mode["median_step_s"] > 0
    assert full["params_trainable"] == full["params_total"]   # SFT trains every weight
    assert 0 < lora["params_trainable"] < 0.2 * lora["params_total"] and lora["params_total"] > full["params_total"]
    assert result["machine"]["cpu"] and result["machine"]["commit"]
