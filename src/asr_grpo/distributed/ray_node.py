"""`python -m asr_grpo.distributed.ray_node <ray CLI args>`: the `ray` command line, run by
the launch/ scripts, that keeps a node on the loopback when asked to.

On Linux, `ray start --node-ip-address=127.0.0.1` does not stay on 127.0.0.1: Ray swaps
a loopback address for the host's routable IP (ray._private.services.
resolve_ip_for_localhost) and binds its servers there, so a "local" head and worker
would listen on the network. With `--node-ip-address` 127.0.0.1 (or localhost), this
wrapper makes the address stay what was asked and sets RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0
for the processes the node starts (raylet, agents, workers, job drivers), so their own
address look-ups give the loopback too (the same switch asr_grpo.distributed.ray_cluster
uses for a local start). Every other command line goes to Ray untouched.
"""
from __future__ import annotations

import logging
import os
import sys

log = logging.getLogger(__name__)
LOOPBACK = ("127.0.0.1", "localhost")
_SWITCH = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"   # False: Ray's single-machine address look-ups


def node_ip_arg(argv: list[str]) -> str | None:
    for i, arg in enumerate(argv):
        if arg.startswith("--node-ip-address="):
            return arg.split("=", 1)[1]
        if arg == "--node-ip-address" and i + 1 < len(argv):
            return argv[i + 1]
    return None


def keep_loopback() -> bool:
    """Patch this process's Ray so 127.0.0.1 stays 127.0.0.1; False if Ray moved the
    private function (the node then binds the routable IP, as plain `ray start` would)."""
    try:
        import ray.util
        from ray._private import services
    except ImportError:
        return False
    if not hasattr(services, "get_node_ip_address"):
        return False
    services.get_node_ip_address = ray.util.get_node_ip_address = lambda address=None: "127.0.0.1"
    # Children (raylet and everything it starts) resolve their own addresses: single-machine mode.
    # Set after Ray's constants were read here, so `ray start --address` may still add a worker node.
    os.environ[_SWITCH] = "0"
    return True


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["start"] and node_ip_arg(argv) in LOOPBACK and not keep_loopback():
        log.warning("could not keep the Ray node on the loopback: this Ray binds the host's routable IP")
    from ray.scripts.scripts import main as ray_cli

    sys.argv = ["ray", *argv]
    ray_cli()


if __name__ == "__main__":
    main()
