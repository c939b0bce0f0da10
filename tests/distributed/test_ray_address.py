"""Which Ray a driver uses: placement.ray_address, else RAY_ADDRESS (what `ray job submit`
sets for a job's driver), else a local start; a driver given RAY_ADDRESS attaches to the
running Ray instead of starting a second one."""
from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import pytest

from asr_grpo.config.schema import PlacementConfig
from asr_grpo.distributed.ray_cluster import cluster_address


@pytest.mark.parametrize("configured,env,expected", [
    ("", None, ("", "no address: local start")),
    ("", "127.0.0.1:6379", ("127.0.0.1:6379", "RAY_ADDRESS")),
    ("auto", "127.0.0.1:6379", ("auto", "placement.ray_address")),          # the config wins
    ("10.0.0.1:6379", None, ("10.0.0.1:6379", "placement.ray_address")),
    ("local", "127.0.0.1:6379", ("", "placement.ray_address=local")),      # forced local start
])
def test_the_address_comes_from_the_config_then_ray_address(monkeypatch, configured, env, expected):
    if env is None:
        monkeypatch.delenv("RAY_ADDRESS", raising=False)
    else:
        monkeypatch.setenv("RAY_ADDRESS", env)
    assert cluster_address(replace(PlacementConfig(), ray_address=configured)) == expected


def test_more_than_one_node_without_a_cluster_names_both_ways_to_give_one(monkeypatch):
    from asr_grpo.distributed.ray_cluster import start_ray

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(ValueError, match=r"placement\.num_nodes=2 needs an existing multi-node cluster: set "
                                         r"placement\.ray_address or RAY_ADDRESS"):
        start_ray(PlacementConfig(num_nodes=2))


CHILD = """
import json, ray
from asr_grpo.config.schema import PlacementConfig
from asr_grpo.distributed.ray_cluster import start_ray
s = start_ray(PlacementConfig(), log_to_driver=False)   # placement.ray_address empty: RAY_ADDRESS decides
print(json.dumps({k: s[k] for k in ("joined", "via", "address", "nodes")}
                 | {"node_id": ray.get_runtime_context().get_node_id()}))
"""


@pytest.mark.slow
def test_a_driver_with_ray_address_attaches_to_the_running_ray(monkeypatch, tmp_path):
    """A second driver, started with RAY_ADDRESS as `ray job submit` starts one, joins the Ray
    this process started: same GCS address, same (single) node; no second Ray."""
    import ray

    from asr_grpo.distributed.ray_cluster import shutdown_ray, start_ray

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    if ray.is_initialized():
        pytest.skip("another test's Ray is still up in this process")
    ours = start_ray(PlacementConfig(gpus_per_node=2), num_cpus=2, log_to_driver=False)
    try:
        assert ours["joined"] is False and ours["via"] == "no address: local start"
        child = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=300,
                               cwd=tmp_path, env={**_env(), "RAY_ADDRESS": ours["address"]})
        assert child.returncode == 0, child.stderr[-4000:]
        seen = json.loads(child.stdout.strip().splitlines()[-1])
        assert seen["joined"] is True and seen["via"] == "RAY_ADDRESS"
        assert seen["address"] == ours["address"] and seen["nodes"] == 1
        assert seen["node_id"] == ray.get_runtime_context().get_node_id()
        assert "Started a local Ray instance" not in child.stderr
    finally:
        shutdown_ray()


def _env() -> dict:
    import os

    return {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}


@pytest.mark.parametrize("address,loopback", [
    ("auto", True), ("127.0.0.1:6379", True), ("localhost:6379", True), ("[::1]:6379", True),
    ("10.0.0.1:6379", False), ("head.cluster:6379", False), ("ray://127.0.0.1:10001", False)])
def test_joining_a_loopback_address_keeps_it_on_the_loopback(address, loopback):
    from asr_grpo.distributed.ray_cluster import _on_loopback

    assert _on_loopback(address) is loopback
