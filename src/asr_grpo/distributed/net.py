"""Tiny network helpers shared by the driver and the roles."""
from __future__ import annotations

import datetime
import ipaddress
import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free right now on `host` (for MASTER_PORT or a sync group's store)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1, ::ffff:127.x.x.x or "localhost"."""
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:   # another host name
        return False
    return (getattr(address, "ipv4_mapped", None) or address).is_loopback


def loopback_interface() -> str:
    """The name of the network interface holding 127.0.0.1 ("lo" on Linux)."""
    try:
        import psutil

        for name, addresses in psutil.net_if_addrs().items():
            if any(a.family == socket.AF_INET and a.address == "127.0.0.1" for a in addresses):
                return name
    except ImportError:
        pass
    return "lo"


def tcp_store(host: str, port: int, world_size: int, is_master: bool,
              timeout: datetime.timedelta):
    """A torch.distributed TCPStore whose server (on the master) listens on `host` only.
    TCPStore's own server binds every interface; here the master binds the socket and
    hands it over (`master_listen_fd`), so a loopback rendezvous stays on the loopback.
    The master blocks until all `world_size` members have connected."""
    import torch.distributed as dist

    fd = None
    if is_master:
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
        fd = sock.detach()   # the store owns the socket from here on
    return dist.TCPStore(host, port, world_size, is_master, timeout, master_listen_fd=fd)
