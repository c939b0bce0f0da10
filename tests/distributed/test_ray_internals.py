"""The private Ray internals the project still relies on, where no public API does the job.

Each check fails naming the symbol, what uses it and what breaks without it, so a Ray
release that moves one fails here loudly instead of degrading quietly (a "local" Ray
listening on the network, bundle indices reported as None). pyproject pins the Ray minor
they were tested with; the last test keeps that pin and the installed Ray in step."""
from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# (symbol, who uses it, what it does there)
INTERNALS = [
    ("ray._private.ray_constants.ENABLE_RAY_CLUSTER", "asr_grpo.distributed.ray_cluster._loopback_only",
     "a local start keeps its servers on 127.0.0.1 instead of the host's routable IP"),
    ("ray._private.ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR", "asr_grpo.distributed.ray_node (_SWITCH)",
     "the processes a loopback `ray start` node spawns resolve their own address to 127.0.0.1"),
    ("ray._private.services.get_node_ip_address", "asr_grpo.distributed.ray_node.keep_loopback",
     "`ray start --node-ip-address=127.0.0.1` stays on the loopback"),
    ("ray._private.services.resolve_ip_for_localhost", "ray.init(_node_ip_address=...) in ray_cluster.start_ray",
     "the function that swaps 127.0.0.1 for the routable IP (what the two switches above defeat)"),
    ("ray._raylet.CoreWorker.resource_ids", "asr_grpo.distributed.role_group.where_am_i",
     "the placement-group bundle a rank really holds (placement.json's bundle_index)"),
    ("ray.actor.ActorHandle._actor_id", "asr_grpo.distributed.role_group.RoleGroup.rank_of",
     "which rank a RayActorError's dead actor was (fault handling)"),
]


def resolve(symbol: str):
    """The object a dotted name names, importing the longest module prefix."""
    parts = symbol.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(symbol)


@pytest.mark.parametrize("symbol,user,purpose", INTERNALS, ids=[s for s, _, _ in INTERNALS])
def test_private_ray_symbol_is_still_there(symbol, user, purpose):
    import ray

    try:
        resolve(symbol)
    except (ImportError, AttributeError) as e:
        pytest.fail(f"Ray {ray.__version__} no longer has the private symbol {symbol} ({e}); {user} uses it so that "
                    f"{purpose}. Find its new home (or a public API) before moving the Ray pin in pyproject.")


def test_the_loopback_switches_still_do_what_the_project_relies_on():
    import ray
    from ray._private import ray_constants, services

    assert ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR == "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", (
        f"Ray {ray.__version__} renamed the env var ray_node sets (asr_grpo.distributed.ray_node._SWITCH): "
        f"{ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR}")
    from asr_grpo.distributed.ray_node import _SWITCH
    assert _SWITCH == ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR
    src = inspect.getsource(services.get_node_ip_address)
    assert "ENABLE_RAY_CLUSTER" in src, (
        f"Ray {ray.__version__}: ray._private.services.get_node_ip_address no longer reads "
        f"ray_constants.ENABLE_RAY_CLUSTER, so ray_cluster._loopback_only no longer keeps a local Ray on 127.0.0.1")
    assert "get_node_ip_address" in inspect.getsource(services.resolve_ip_for_localhost), (
        f"Ray {ray.__version__}: resolve_ip_for_localhost no longer goes through get_node_ip_address, "
        f"which ray_node.keep_loopback patches")
    init_src = inspect.getsource(ray.init)
    assert '"_node_ip_address"' in init_src, (
        f"Ray {ray.__version__}: ray.init no longer takes the private _node_ip_address kwarg "
        f"that ray_cluster.start_ray passes for a local start")
    actor_src = inspect.getsource(importlib.import_module("ray.actor"))
    for method in ("__ray_ready__", "__ray_call__"):   # RoleGroup.wait_ready, pids, placement_report
        assert f"def {method}(" in actor_src, f"Ray {ray.__version__}: actors lost {method}, which RoleGroup calls"


def test_pyproject_pins_the_installed_ray_minor():
    import ray

    text = (REPO / "pyproject.toml").read_text()
    m = re.search(r'"ray\[default\]>=(\d+)\.(\d+)[^,"]*,<(\d+)\.(\d+)"', text)
    assert m, 'pyproject.toml must pin Ray to one tested minor: "ray[default]>=X.Y,<X.Y+1"'
    low, high = (int(m[1]), int(m[2])), (int(m[3]), int(m[4]))
    assert high == (low[0], low[1] + 1), f"the Ray pin spans more than one minor: >={low}, <{high}"
    installed = tuple(int(x) for x in ray.__version__.split(".")[:2])
    assert installed == low, f"installed Ray {ray.__version__} is not the pinned, tested minor {low[0]}.{low[1]}"
