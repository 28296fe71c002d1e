"""What a batch may ask of the machine or the Ray cluster, checked before any work (no torch, no
ray here): --workers and --threads against the cores and GPUs there are, and whether a Ray
address answers at all (Ray itself retries a dead address for minutes without a word).

Each check returns the one sentence that refuses the request, or None.
"""

from __future__ import annotations

import os
import socket
from typing import Optional, Tuple

RAY_CONNECT_TIMEOUT_S = 10.0  # a cluster that does not accept a connection within this is not there
RAY_DEFAULT_PORT = 6379  # the port `ray start --head` listens on when none is given
RAY_LOCAL_NAMES = ("auto", "local")  # addresses Ray resolves on this machine itself (fast to fail)


def machine_cores() -> int:
    return os.cpu_count() or 1


def threads_problem(threads: int, cores: int, where: str = "this machine") -> Optional[str]:
    """--threads past the cores of the machine a worker runs on (torch crashes far past them)."""
    if threads > cores:
        return (f"--threads {threads} is more than the {cores} cores of {where}; use {cores} at most "
                "(0 lets sjd-pac choose).")
    return None


def workers_problem(workers: int, cpus: int, gpus: int, on_gpu: bool, where: str) -> Optional[str]:
    """--workers past what the machine or cluster has: one GPU per GPU worker, one core at least
    per CPU worker (each worker is a process holding its own copy of the model)."""
    if on_gpu and workers > gpus:
        return (f"--workers {workers} asks for a GPU each, but {where} has {gpus}; use --workers {gpus} at most "
                "(or --device cpu).")
    if not on_gpu and workers > cpus:
        return (f"--workers {workers} asks for a CPU core each at least, but {where} has {cpus}; use --workers "
                f"{cpus} at most.")
    return None


def ray_host_port(address: str) -> Tuple[str, int]:
    """("host", port) of a Ray address: host:port, ray://host:port, [v6]:port, or a host alone."""
    text = address.split("://", 1)[-1].rstrip("/")
    host, colon, port = text.rpartition(":")
    if not colon or "]" in port:  # no port (an IPv6 address in brackets has colons of its own)
        host, port = text, str(RAY_DEFAULT_PORT)
    return host.strip("[]"), int(port)


def ray_address_problem(address: str, timeout: float = RAY_CONNECT_TIMEOUT_S) -> Optional[str]:
    """Whether a Ray cluster's address accepts a connection within `timeout` seconds."""
    if address in RAY_LOCAL_NAMES:
        return None
    try:
        host, port = ray_host_port(address)
    except ValueError:
        return (f"--ray-address {address!r} is not an address; give host:port (the head node's, e.g. "
                f"10.0.0.5:{RAY_DEFAULT_PORT}) or auto.")
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except socket.timeout:
        reason = f"no answer within {timeout:g} s"
    except OSError as exc:
        reason = (exc.strerror or type(exc).__name__).lower()
    return (f"cannot reach the Ray cluster at {address} ({reason}); start it there with `ray start --head`, "
            "or check --ray-address.")
