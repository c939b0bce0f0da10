"""Start (or join) the Ray cluster the roles run on.

A local start binds every Ray server to 127.0.0.1 and, on a host without CUDA,
declares `placement.gpus_per_node` LOGICAL GPUs: Ray then schedules placement-group
bundles and fractional-GPU actors exactly as on a GPU node (it only counts, and sets
CUDA_VISIBLE_DEVICES to an id nobody uses), so the colocate/separate layouts are
exercised on a laptop. With real CUDA devices Ray's own detection is used unchanged.

Which Ray: `placement.ray_address` when set ("auto" or an address: join that cluster;
"local": always start one here); when empty, the cluster `RAY_ADDRESS` names, which `ray
job submit` sets for the job's driver, so a submitted `python -m asr_grpo.run` attaches
to the cluster it was submitted to instead of starting a second Ray inside the job; with
neither, a local start.

Ray 2.60 enables token authentication by default (token under ~/.ray/); a driver
joining an existing cluster needs that cluster's token.

Private Ray internals (no public API keeps a Linux node on the loopback): the local start
flips `ray._private.ray_constants.ENABLE_RAY_CLUSTER` and passes `ray.init(_node_ip_address=)`.
pyproject pins the Ray minor they were tested with, and tests/distributed/test_ray_internals.py
fails naming the symbol when a Ray release moves one.
"""
from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from typing import Optional

log = logging.getLogger(__name__)

_started: Optional[dict] = None   # what start_ray did, reported again on reuse
_keep_joined = False              # shutdown_ray leaves a joined cluster connected (see keep_joined_connection)


def cuda_device_count() -> int:
    """CUDA GPUs this process may use (CUDA_VISIBLE_DEVICES honoured), through torch's
    public API; no torch or a broken driver counts as none."""
    try:
        import torch
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:   # no torch, or a broken driver: treat as no CUDA
        return 0


RAY_ADDRESS_ENV = "RAY_ADDRESS"


def cluster_address(placement_cfg) -> tuple[str, str]:
    """(address to join, where it came from); ("", ...) means start a local Ray."""
    configured = str(placement_cfg.ray_address or "")
    if configured == "local":
        return "", "placement.ray_address=local"
    if configured:
        return configured, "placement.ray_address"
    if os.environ.get(RAY_ADDRESS_ENV):
        return os.environ[RAY_ADDRESS_ENV], RAY_ADDRESS_ENV
    return "", "no address: local start"


@contextlib.contextmanager
def _loopback_only():
    """On Linux Ray resolves `_node_ip_address="127.0.0.1"` to the host's routable IP and
    binds its servers there (see ray._private.services.resolve_ip_for_localhost); the
    single-machine mode it uses on macOS/Windows, gated by this flag, keeps everything on
    the loopback. The flag is read only while the node is being started, or while a driver
    resolves the address of the cluster it joins."""
    try:
        from ray._private import ray_constants
        saved = ray_constants.ENABLE_RAY_CLUSTER
    except (ImportError, AttributeError):   # a future Ray: fall back to the kwarg alone
        yield
        return
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved


@contextlib.contextmanager
def _keeping_sigterm_handler():
    """`ray.init` replaces the driver's SIGTERM handler with its own, which exits in the
    middle of whatever runs and ends in an abort with a C++ stack dump. A Python handler
    the driver set before (the entry point's graceful stop, recipes/stop.py) is put back;
    with none, Ray's stays."""
    main = threading.current_thread() is threading.main_thread()
    saved = signal.getsignal(signal.SIGTERM) if main else None
    try:
        yield
    finally:
        if callable(saved):
            signal.signal(signal.SIGTERM, saved)


def _on_loopback(address: str) -> bool:
    """True for "auto" (the cluster on this machine, which may be loopback-only) and for a
    loopback host; a routable address or a Ray Client (ray://) address is left to Ray."""
    if address == "auto":
        return True
    if "://" in address:
        return False
    host = address.rsplit(":", 1)[0].strip("[]") if address.count(":") == 1 or address.startswith("[") else address
    return host == "localhost" or host == "::1" or host.startswith("127.")


def start_ray(placement_cfg, *, num_cpus: Optional[int] = None,
              runtime_env: Optional[dict] = None, log_to_driver: bool = True,
              include_dashboard: bool = False) -> dict:
    """Join `placement.ray_address` if set, else the cluster RAY_ADDRESS names, else start
    a local loopback-only Ray. Idempotent: if Ray is already initialised (by us or anyone),
    it is reused."""
    global _started
    import ray

    if ray.is_initialized():
        summary = cluster_summary()
        if not _started or _started["address"] != summary["address"]:   # not ours
            _started = {"joined": None, "logical_gpus": None, "address": summary["address"]}
        return {**_started, **summary, "reused": True}
    address, source = cluster_address(placement_cfg)
    if address:
        # A loopback-only cluster (the launch/ scripts' default, or another driver's local
        # start) is reached on 127.0.0.1 only if Ray keeps that address as given. In a
        # `ray job submit` driver ray.init also picks up the job's runtime env.
        with _loopback_only() if _on_loopback(address) else contextlib.nullcontext(), _keeping_sigterm_handler():
            ray.init(address=address, runtime_env=runtime_env, log_to_driver=log_to_driver)
        _started = {"joined": True, "logical_gpus": False, "via": source}  # the cluster's own GPUs
    else:
        if int(placement_cfg.num_nodes) > 1:
            raise ValueError(
                f"placement.num_nodes={placement_cfg.num_nodes} needs an existing multi-node "
                f"cluster: set placement.ray_address or RAY_ADDRESS (a local start is one node)")
        logical = bool(placement_cfg.use_logical_gpus) and cuda_device_count() == 0
        with _loopback_only(), _keeping_sigterm_handler():
            # address="local": decided above (placement.ray_address=local wins over RAY_ADDRESS).
            ray.init(address="local", num_cpus=num_cpus,
                     num_gpus=int(placement_cfg.gpus_per_node) if logical else None,
                     include_dashboard=include_dashboard, _node_ip_address="127.0.0.1",
                     log_to_driver=log_to_driver, runtime_env=runtime_env)
        _started = {"joined": False, "logical_gpus": logical, "via": source}
    summary = cluster_summary()
    _started["address"] = summary["address"]
    summary = {**_started, **summary, "reused": False}
    log.info("Ray ready: %s", summary)
    return summary


def cluster_summary() -> dict:
    import ray

    res = ray.cluster_resources()
    node_ip = ray.util.get_node_ip_address()
    return {"address": ray.get_runtime_context().gcs_address, "node_ip": node_ip,
            "loopback_only": node_ip == "127.0.0.1",
            "nodes": sum(1 for n in ray.nodes() if n.get("Alive")),
            "resources": {k: v for k, v in res.items()
                          if not k.startswith("node:") and "_group_" not in k}}


def keep_joined_connection(keep: bool = True) -> None:
    """While set, shutdown_ray() keeps a connection to a joined cluster (placement.ray_address)
    open, so the runs of a sweep share one driver connection: a driver that is itself a Ray
    job loses its working_dir (its code and its cwd) when it disconnects. A local Ray
    started here is still shut down."""
    global _keep_joined
    _keep_joined = keep


def shutdown_ray() -> None:
    global _started
    import ray

    if _keep_joined and _started and _started.get("joined") and ray.is_initialized():
        return
    if ray.is_initialized():
        ray.shutdown()
    _started = None
