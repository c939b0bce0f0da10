"""One real two-node Ray cluster on this machine (a head and a worker node, loopback only)
brought up with the launch/ scripts, and one short sweep submitted to it as a Ray job
with launch/submit.sh: overlap none|oppo x seed 0|1, placement=separate across both
nodes. The launch, sweep and compare tests all read what that sweep logged. Then, on the
same cluster, a plain `ray job submit -- python -m asr_grpo.run debug=fast` (the driver
attaches through RAY_ADDRESS)."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LAUNCH = REPO / "launch"
SWEEP_EXPERIMENT = "wf-sweep"
SWEEP_OVERRIDES = ["-m", "debug=fast", "overlap=none,oppo", "seed=0,1", "placement=separate",
                   "placement.num_nodes=2", "placement.gpus_per_node=2", "trainer.save_every=2",
                   f"logger.experiment_name={SWEEP_EXPERIMENT}", "logger.system_metrics_interval_s=1"]
LOOPBACK = ("127.0.0.1", "::1", "::ffff:127.0.0.1")


def _free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def _node_ports() -> dict[str, str]:
    """Ports of one node's own servers: two nodes share this host."""
    return {k: _free_port() for k in ("DASHBOARD_AGENT_PORT", "DASHBOARD_AGENT_GRPC_PORT", "METRICS_PORT",
                                      "RUNTIME_ENV_AGENT_PORT")}


def _listening(pids: list[int]) -> list[tuple[int, str, int]]:
    """(pid, address, port) of every TCP socket these processes and their children listen on."""
    import psutil

    procs = []
    for pid in pids:
        try:
            parent = psutil.Process(pid)
            procs += [parent, *parent.children(recursive=True)]
        except psutil.NoSuchProcess:
            pass
    out = []
    for p in procs:
        try:
            conns = p.net_connections(kind="tcp")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        out += [(p.pid, c.laddr.ip, c.laddr.port) for c in conns if c.status == psutil.CONN_LISTEN]
    return out


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the node's `ray start --block`, which stops that node's Ray processes;
    its own process group (started by us) is killed if anything is left after that."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@pytest.fixture(scope="session")
def cluster_sweep(root):
    temp = tempfile.mkdtemp(prefix="rlwf", dir="/tmp")   # short: Ray's socket paths have a length limit
    env = {**os.environ, "PYTHON": sys.executable, "BLOCK": "1", "NUM_CPUS": "1",
           "RAY_PORT": _free_port(), "DASHBOARD_PORT": _free_port(), "RAY_USAGE_STATS_ENABLED": "0"}
    nodes: list[subprocess.Popen] = []
    logs = Path(temp)

    def start(script: str, gpus: str, **extra) -> None:
        """Start a node and wait for `ray start` to report it up. Ray gives a raylet 30 s to
        register, which a starved shared machine can miss: a node that dies starting is
        started again (twice at most). Each node has a temp dir of its own, as on separate
        machines: a node's runtime-env agent deletes the job's working_dir copy in its
        temp dir once its own workers stop using it, the driver's cwd if they shared one."""
        node_temp = Path(temp) / script.split("_")[1].split(".")[0]   # head / worker
        node_temp.mkdir(exist_ok=True)
        node_env = {**env, "NUM_GPUS": gpus, "RAY_TEMP_DIR": str(node_temp), **_node_ports(), **extra}
        for attempt in range(3):
            log = logs / f"{script}.{attempt}.log"
            proc = subprocess.Popen([str(LAUNCH / script)], env=node_env, start_new_session=True,
                                    stdout=open(log, "w"), stderr=subprocess.STDOUT)
            nodes.append(proc)
            deadline = time.monotonic() + 600
            while proc.poll() is None and "Ray runtime started." not in log.read_text():
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{script} not up after 600 s:\n{log.read_text()[-3000:]}")
                time.sleep(1)
            if proc.poll() is None:
                return
        raise RuntimeError(f"{script} failed 3 times; the last:\n{log.read_text()[-3000:]}")

    def wait_for(n: int) -> list[dict]:
        r = subprocess.run([str(LAUNCH / "wait_for_nodes.sh"), str(n)], env={**env, "TIMEOUT_S": "300"},
                           capture_output=True, text=True)
        assert r.returncode == 0, f"cluster did not reach {n} nodes: {r.stderr}"
        return json.loads(r.stdout)

    try:
        # The worker node holds 2 logical GPUs, the head 1: the 3 bundles of placement=separate
        # (actor, reference, rollout) cannot fit on either node alone.
        start("start_head.sh", "1", RAY_CLIENT_PORT=_free_port())
        start("start_worker.sh", "2")
        cluster_nodes = wait_for(2)
        listening = _listening([p.pid for p in nodes])
        t0 = time.monotonic()
        job = subprocess.run([str(LAUNCH / "submit.sh"), *SWEEP_OVERRIDES],
                             env={**env, "OUTPUT_ROOT": str(root), "JOB_ID": f"wf-{os.getpid()}"},
                             capture_output=True, text=True, timeout=1500)
        seconds = time.monotonic() - t0
        attach = submit_plain_job(env, Path(root) / "attach") if job.returncode == 0 else None
    finally:
        for proc in reversed(nodes):
            _stop(proc)
    output = job.stdout + job.stderr
    found = re.search(r"python -m asr_grpo\.compare sweep=(\S+)", output)
    assert job.returncode == 0 and found, f"sweep job failed (rc {job.returncode}):\n{output[-8000:]}"
    shutil.rmtree(temp, ignore_errors=True)   # kept when something failed: its node logs
    return {"root": root, "tracking_uri": f"sqlite:///{root}/mlflow.db", "sweep": found.group(1),
            "output": output, "nodes": cluster_nodes, "listening": listening, "job_seconds": seconds,
            "attach": attach}


def submit_plain_job(env: dict, out: Path) -> dict:
    """`ray job submit -- python -m asr_grpo.run debug=fast` as a user types it: Ray's own CLI,
    no runtime env and no `placement.ray_address`, so the driver can only find the cluster
    through the RAY_ADDRESS the job server sets for it. Its own output root and experiment
    keep it out of the sweep's store."""
    ray_cli = Path(sys.executable).with_name("ray")
    t0 = time.monotonic()
    r = subprocess.run([str(ray_cli), "job", "submit", f"--address=http://127.0.0.1:{env['DASHBOARD_PORT']}",
                        f"--submission-id=wf-attach-{os.getpid()}", "--",
                        sys.executable, "-m", "asr_grpo.run", "debug=fast", f"paths.output_root={out}",
                        "logger.experiment_name=wf-attach"],
                       env={**env, "RAY_AUTH_MODE": "token"}, capture_output=True, text=True, timeout=900)
    return {"returncode": r.returncode, "output": r.stdout + r.stderr, "root": out,
            "tracking_uri": f"sqlite:///{out}/mlflow.db", "seconds": time.monotonic() - t0}
