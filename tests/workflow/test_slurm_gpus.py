"""launch/slurm_gpus.sh: the GPU count per node launch/slurm_ray.sbatch reads from a Slurm
job's environment, run with bash under the environments Slurm gives its forms of asking."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "launch" / "slurm_gpus.sh"
SLURM_VARS = ("SLURM_GPUS_PER_NODE", "SLURM_GPUS_ON_NODE", "SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES")


def gpus(**env) -> tuple[int, str, str]:
    """(return code, stdout, stderr) of slurm_gpus_per_node under exactly these Slurm variables."""
    base = {k: v for k, v in os.environ.items() if k not in SLURM_VARS}
    r = subprocess.run(["bash", "-c", f'set -euo pipefail; source "{SCRIPT}"; slurm_gpus_per_node'],
                       env={**base, **env}, capture_output=True, text=True, timeout=30)
    return r.returncode, r.stdout.strip(), r.stderr.strip()


@pytest.mark.parametrize("env,count", [
    ({"SLURM_GPUS_PER_NODE": "8"}, "8"),                            # --gpus-per-node=8
    ({"SLURM_GPUS_PER_NODE": "a100:4"}, "4"),                       # --gpus-per-node=a100:4
    ({"SLURM_GPUS_PER_NODE": "gpu:h100:2"}, "2"),
    ({"SLURM_GPUS_PER_NODE": "a100:4,v100:2"}, "6"),                # two types
    ({"SLURM_GPUS_PER_NODE": "08"}, "8"),                           # not octal
    ({"SLURM_GPUS_PER_NODE": "a100:4", "SLURM_GPUS_ON_NODE": "2"}, "4"),   # the job's ask wins
    ({"SLURM_GPUS_ON_NODE": "4", "CUDA_VISIBLE_DEVICES": "0,1"}, "4"),     # --gres=gpu:4
    ({"SLURM_JOB_GPUS": "0,1,2"}, "3"),                             # --gres, older Slurm
    ({"SLURM_JOB_GPUS": "0-3,6"}, "5"),
    ({"CUDA_VISIBLE_DEVICES": "0,1"}, "2"),
    ({"CUDA_VISIBLE_DEVICES": "GPU-8f2d41c6-5f3e-4c1e-9a5b-1d2e3f4a5b6c,GPU-0a1b2c3d-0000-1111-2222-333344445555"},
     "2"),                                                          # UUIDs, not ranges
    ({"SLURM_JOB_GPUS": "", "CUDA_VISIBLE_DEVICES": "3"}, "1"),
], ids=lambda v: ",".join(f"{k}={x}" for k, x in v.items()) if isinstance(v, dict) else v)
def test_gpus_per_node_from_every_form_slurm_uses(env, count):
    assert gpus(**env) == (0, count, "")


def test_no_gpu_variables_says_so_without_a_count():
    assert gpus() == (1, "", "")
    assert gpus(CUDA_VISIBLE_DEVICES="NoDevFiles") == (1, "", "")


@pytest.mark.parametrize("var,value", [("SLURM_GPUS_PER_NODE", "a100:many"), ("SLURM_GPUS_PER_NODE", "a100:"),
                                       ("SLURM_GPUS_ON_NODE", "4(x2)")])
def test_an_unreadable_value_is_an_error_naming_it(var, value):
    rc, out, err = gpus(**{var: value})
    assert rc == 2 and out == "" and f"{var}={value}" in err


def test_the_sbatch_script_uses_the_parsed_count():
    text = SCRIPT.with_name("slurm_ray.sbatch").read_text()
    assert 'source "$HERE/slurm_gpus.sh"' in text and "GPUS=$(slurm_gpus_per_node)" in text
    assert "NUM_GPUS=$GPUS" in text and "placement.gpus_per_node=$GPUS" in text
    assert "NUM_GPUS=${SLURM_GPUS_PER_NODE" not in text
