"""A real `mlflow server` on the loopback that can be stopped and started again (same
store, same port): the tracking server a cluster run logs to, made to blink. Used by
`bench/chaos_soak.py` and `tests/tracking/test_mlflow_server_blink.py`."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def answers(url: str) -> bool:
    """Whether a GET of `url` answers 200 within a second."""
    try:
        return urllib.request.urlopen(url, timeout=1).status == 200
    except OSError:
        return False


def wait_until(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout_s:.0f} s for {what}")
        time.sleep(0.5)


class MlflowServer:
    """`mlflow server` on 127.0.0.1 over a SQLite store in `folder`, in a session of its
    own (its workers go with it)."""

    def __init__(self, folder: Path):
        self.folder, self.port, self.proc = Path(folder), free_port(), None
        self.uri = f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 300) -> None:
        cli = Path(sys.executable).with_name("mlflow")
        self.proc = subprocess.Popen([str(cli), "server", "--backend-store-uri", f"sqlite:///{self.folder}/store.db",
                                      "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1"],
                                     cwd=self.folder, start_new_session=True,
                                     stdout=open(self.folder / "server.log", "a"), stderr=subprocess.STDOUT)
        wait_until(self.healthy, timeout_s, "the MLflow server to answer")

    def healthy(self) -> bool:
        return answers(f"{self.uri}/health")

    def stop(self) -> None:
        """Gone at once, as a crashed or unreachable server."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        wait_until(lambda: not self.healthy(), 30, "the MLflow server to go")
