"""This process's connection to a Ray cluster (docs/ray.md): checked before Ray is asked, made once (Ray allows
one per process), watched while a comparison runs, and left when the cluster is lost.

The one piece of module state is :data:`_CLUSTER`, the cache of that one connection (Ray's own is per process
too): the address it was made to, the head's GCS address, and the lock that makes concurrent comparisons of a
server connect once. Ray is imported only when a comparison runs on it.
"""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from validator.errors import ValidatorError
from validator.settings import ExecutorSettings, ray_hostport

__all__ = ["CONNECT_TIMEOUT_S", "JOIN_TIMEOUT_S", "RAY_INSTALL", "RayUnavailable", "check_joinable", "check_reachable", "connect", "connected", "disconnect",
           "head_address", "head_answers", "import_ray", "leave", "lost"]

RAY_INSTALL = "pip install 'validator[ray]'"
CONNECT_TIMEOUT_S = 3.0  # whether something speaking gRPC answers at an address: known within this
JOIN_TIMEOUT_S = 5.0  # whether Ray can join the cluster there (a probe process): known within this (docs/ray.md)


class RayUnavailable(ValidatorError):
    """No Ray (not installed), no cluster, or the cluster was lost: the comparison did not run (exit 2)."""


@dataclass
class _Connection:
    """The cache of this process's connection: ``address`` as asked for (None: not connected) and ``gcs``,
    HOST:PORT of the connected cluster's head (None: unknown)."""

    address: str | None = None
    gcs: str | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)  # a server's background comparisons may start together


_CLUSTER = _Connection()


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise RayUnavailable(f"--executor ray needs Ray, which is not installed here: {RAY_INSTALL}") from None
    return ray


# An HTTP/2 client's opening (the connection preface and an empty SETTINGS frame): Ray's GCS and Ray Client
# ports are gRPC servers, which answer with a SETTINGS frame of their own; anything else (an HTTP/1 server,
# a database) answers otherwise or not at all.
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
_H2_SETTINGS = 4  # the frame type in byte 3 of a frame header


def _local_head(ray: Any) -> str | None:
    """The head address ``ray.init(address="auto")`` would use (the cluster `ray start` began on this machine),
    None when there is none or Ray does not say (then ray.init reports it)."""
    try:
        from ray._private import services

        return services.canonicalize_bootstrap_address("auto")
    except Exception:  # no cluster (ConnectionError), or a Ray whose private API differs
        return None


def check_reachable(address: str) -> None:
    """Fail fast, with a clear message, when nothing listens at ``HOST:PORT`` or what listens is not a gRPC
    server (Ray's GCS or Ray Client): ray.init would wait minutes. Bounded by CONNECT_TIMEOUT_S in all.
    ``""``: nothing to check."""
    if not address:
        return
    host, port = ray_hostport(address)
    deadline = time.monotonic() + CONNECT_TIMEOUT_S
    try:
        sock = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S)
    except (OSError, UnicodeError) as exc:
        raise RayUnavailable(
            f"no Ray cluster answers at {address} ({getattr(exc, 'strerror', None) or exc}); start one (`ray start "
            "--head`) or point --executor ray=HOST:PORT at its head (docs/ray.md)"
        ) from None
    got = b""
    with sock:
        try:
            sock.sendall(_H2_PREFACE)
            while len(got) < 9:
                sock.settimeout(max(0.05, deadline - time.monotonic()))
                chunk = sock.recv(9 - len(got))
                if not chunk:
                    break
                got += chunk
        except OSError:
            pass
    if len(got) < 9 or got[3] != _H2_SETTINGS:
        seen = f"it answered {got[:16]!r}" if got else f"nothing answered within {CONNECT_TIMEOUT_S:g} s"
        raise RayUnavailable(
            f"{address} accepts connections but is not a Ray cluster's head ({seen}, not gRPC); point --executor "
            "ray=HOST:PORT at the head's GCS port (6379 by default) or ray://HOST:PORT at its Ray Client port (docs/ray.md)"
        )


# A driver that joins the cluster and leaves at once. Its own process: a server that accepts Ray's
# connection and then stalls keeps ray.init waiting for minutes, after which Ray ends the process it runs in.
_JOIN_PROBE = """
import logging, sys
import ray
ray.init(address=sys.argv[1], namespace="validator", logging_level=logging.ERROR, log_to_driver=False)
ray.shutdown()
"""


def check_joinable(target: str, timeout: float = JOIN_TIMEOUT_S) -> None:
    """Fail, with a clear message and within ``timeout`` seconds, when Ray cannot join the cluster at
    ``target`` (an address, or ``auto``): what ray.init in this process would otherwise wait on, unbounded."""
    where = "on this machine (no RAY_ADDRESS set)" if target == "auto" else f"at {target}"
    try:
        got = subprocess.run(
            [sys.executable, "-c", _JOIN_PROBE, target], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, timeout=timeout, check=False,
        )
    except subprocess.TimeoutExpired:
        raise RayUnavailable(
            f"the Ray cluster {where} did not let a driver join within {timeout:g} s: what answers there speaks gRPC "
            "but is not a working Ray head; point --executor ray=HOST:PORT at the head's GCS port (docs/ray.md)"
        ) from None
    if got.returncode != 0:
        lines = [ln for ln in got.stderr.decode(errors="replace").splitlines() if ln.strip()]
        raise RayUnavailable(f"cannot connect to a Ray cluster {where}: {(lines or ['no reason given'])[-1][:500]}; see docs/ray.md")


def connected() -> str | None:
    """The address this process is connected to (as asked for), None when it is not."""
    return _CLUSTER.address


def connect(address: str | None) -> Any:
    """Connect this process to the cluster once (Ray allows one per process); returns the ``ray`` module.
    ``address`` None: ``RAY_ADDRESS``, else the cluster of this machine."""
    with _CLUSTER.lock:
        return _connect(address)


def _connect(address: str | None) -> Any:
    ray = import_ray()
    target = address or ExecutorSettings.from_env().ray_address or "auto"
    if ray.is_initialized():
        if _CLUSTER.address is not None and target != _CLUSTER.address:
            raise RayUnavailable(f"this process is already connected to the Ray cluster at {_CLUSTER.address}, not {target}")
        return ray
    check_reachable(target if target != "auto" else _local_head(ray) or "")
    check_joinable(target)
    _errors_to_stderr()
    try:
        ray.init(
            address=target,
            namespace="validator",
            logging_level=logging.ERROR,
            log_to_driver=False,
            configure_logging=True,
        )
    except (ConnectionError, RuntimeError, ValueError) as exc:
        where = "on this machine (no RAY_ADDRESS set)" if target == "auto" else f"at {target}"
        raise RayUnavailable(f"cannot connect to a Ray cluster {where}: {exc}; see docs/ray.md") from None
    _CLUSTER.address = target
    try:
        context: Any = ray.get_runtime_context()
        _CLUSTER.gcs = str(context.gcs_address)
    except (AttributeError, RuntimeError):
        _CLUSTER.gcs = target if target != "auto" else None
    return ray


def disconnect() -> None:
    """Leave the cluster this process is connected to, if any (before the cluster goes away on purpose:
    a driver left connected to a stopped cluster is ended by Ray a minute later)."""
    with _CLUSTER.lock:
        if _CLUSTER.address is None:
            return
        leave(import_ray())


def head_answers() -> bool:
    """Whether the head's GCS port still accepts a connection (a plain TCP connect: asking Ray itself would
    block for a minute when the head is gone, after which Ray ends this process)."""
    gcs = _CLUSTER.gcs
    if gcs is None:
        return True
    host, _, port = gcs.removeprefix("ray://").rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except (OSError, ValueError):
        return False
    return True


def head_address() -> str | None:
    """HOST:PORT of the connected cluster's head, when known."""
    return _CLUSTER.gcs


def leave(ray: Any) -> None:
    """Leave a lost cluster, so that Ray does not end this process (a server) when its head stays gone;
    bounded: Ray's shutdown may wait on the dead head."""
    t = threading.Thread(target=ray.shutdown, name="ray-shutdown", daemon=True)
    t.start()
    t.join(timeout=10.0)
    _CLUSTER.address = _CLUSTER.gcs = None


def _errors_to_stderr() -> None:
    """Ray's driver prints the cluster's error notes ("a worker died...") to stdout, where they would break
    ``--json``; send them to stderr. (Ray looks the printer up at each message: replacing it is enough.)"""
    try:
        from ray._private import worker
    except ImportError:
        return
    printer = getattr(worker, "print_to_stdstream", None)
    if printer is None or getattr(printer, "_validator_stderr", False):
        return

    def to_stderr(data: dict[str, Any], ignore_prefix: bool) -> None:
        printer({**data, "is_err": True}, ignore_prefix=ignore_prefix)

    to_stderr._validator_stderr = True  # type: ignore[attr-defined]
    worker.print_to_stdstream = to_stderr


def lost(exc: BaseException) -> RayUnavailable:
    """The error of a cluster lost during a comparison."""
    return RayUnavailable(f"the Ray cluster was lost during the comparison ({type(exc).__name__}: {exc}); nothing was stored")
