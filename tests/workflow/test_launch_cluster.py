"""launch/: a head and a worker node started by the scripts on this machine, a sweep
submitted to them as a Ray job; checked on Ray's own placement data and sockets."""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from asr_grpo.tracking.selection import select_runs

pytestmark = [pytest.mark.slow, pytest.mark.cluster, pytest.mark.timeout(1800)]   # the session fixture brings up a cluster and a sweep


def test_two_nodes_joined_on_the_loopback_only(cluster_sweep):
    nodes = cluster_sweep["nodes"]
    assert len(nodes) == 2 and {n["state"] for n in nodes} == {"ALIVE"}
    assert sorted(n["is_head_node"] for n in nodes) == [False, True]
    assert {n["node_ip"] for n in nodes} == {"127.0.0.1"}
    listening = cluster_sweep["listening"]
    assert len(listening) >= 6   # GCS, raylets, object managers, agents, dashboard, ...
    exposed = [x for x in listening if x[1] not in ("127.0.0.1", "::1", "::ffff:127.0.0.1")]
    assert not exposed, f"Ray servers listening beyond the loopback: {exposed}"


def test_roles_of_every_job_span_both_nodes_as_planned(cluster_sweep):
    client = MlflowClient(cluster_sweep["tracking_uri"])
    node_ids = {n["node_id"] for n in cluster_sweep["nodes"]}
    runs = select_runs(client, sweep=cluster_sweep["sweep"]).runs
    assert len(runs) == 4
    for run in runs:
        placement = json.loads(Path(client.download_artifacts(run.info.run_id, "placement.json")).read_text())
        ranks = [r for role in placement.values() for r in role]
        assert {r["role"] for r in ranks} >= {"actor", "ref", "rollout", "reward"}
        assert all(r["as_planned"] for r in ranks), ranks
        gpu_nodes = {r["node_id"] for r in ranks if r["bundle_index"] is not None}
        assert gpu_nodes == node_ids, (run.info.run_name, gpu_nodes, node_ids)   # across both nodes
        # the bundle each rank holds sits on the node Ray ran the rank on
        assert all(r["bundle_node_id"] == r["node_id"] for r in ranks if r["bundle_index"] is not None)


def test_a_plain_ray_job_submit_driver_attaches_to_the_cluster(cluster_sweep):
    """`ray job submit -- python -m asr_grpo.run debug=fast`, no address given: the driver joins
    the cluster through RAY_ADDRESS (one Ray), and every rank runs on one of its nodes."""
    attach = cluster_sweep["attach"]
    assert attach is not None and attach["returncode"] == 0, \
        f"the plain job failed:\n{attach and attach['output'][-8000:]}"
    output = attach["output"]
    assert "Started a local Ray instance" not in output, "the job's driver started a second Ray"
    ready = re.search(r"Ray ready: (\{.*\})", output)
    assert ready, f"no 'Ray ready' line in the job's output:\n{output[-4000:]}"
    summary = ast.literal_eval(ready.group(1))
    assert summary["joined"] is True and summary["via"] == "RAY_ADDRESS" and summary["nodes"] == 2, summary
    client = MlflowClient(attach["tracking_uri"])
    runs = client.search_runs([e.experiment_id for e in client.search_experiments() if e.name == "wf-attach"])
    assert runs and {r.info.status for r in runs} == {"FINISHED"}   # the debug SFT's run and the RL run
    rl = [r for r in runs if "placement.json" in {a.path for a in client.list_artifacts(r.info.run_id)}]
    assert len(rl) == 1, [r.info.run_name for r in runs]
    placement = json.loads(Path(client.download_artifacts(rl[0].info.run_id, "placement.json")).read_text())
    ranks = [r for role in placement.values() for r in role]
    node_ids = {n["node_id"] for n in cluster_sweep["nodes"]}
    assert ranks and {r["node_id"] for r in ranks} <= node_ids, (ranks, node_ids)
    print(f"plain ray job submit of debug=fast: {attach['seconds']:.0f} s")
