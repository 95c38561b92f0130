"""Comparisons measured on a Ray cluster, where the tensors are (docs/ray.md).

The driver (the process running ``compare_runs``) plans tasks: a batch of logical tensor pairs each, small
pairs packed together and a large pair alone. A task receives the pairs as metadata only (names, shard
layout, dtype, shape and, for each shard, where its bytes are: a blob's sha256 and the store's URL, or a
safetensors file on a filesystem every worker mounts and the byte offset in it), reads the bytes itself,
runs the project's own measurement on each pair (``validator.judging.compare._measure``, sent by
reference, so the code is the same as in one process) and returns the small results. The driver judges
them exactly as ``compare_runs`` does in one process, so the comparison document is the same, bit for bit.
No tensor byte passes through the driver.

Tasks: consecutive pairs up to ``BATCH_BYTES`` of tensors (fewer when the comparison is small next to the
cluster: at least four tasks per CPU when the pairs allow), a pair larger than that alone.

Memory: a task reserves (Ray's ``memory`` resource) the most one of its pairs needs, an estimate of the
assembled tensors' bytes (:func:`pair_memory`); Ray then never runs more tasks on a node than its memory
holds, and a pair larger than every node is refused before anything runs.

Faults: a task whose worker process or node dies is run again by Ray (``max_retries``), with the same
result, as measurements are pure functions of the bytes. No cluster, or a cluster lost during the
comparison: a :class:`~validator.errors.ValidatorError` (exit 2) and nothing stored.

This module imports Ray only when a comparison runs on it; parsing ``--executor`` never does.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from validator.errors import InputError, ValidatorError
from validator.runs.reassembly import LogicalTensor
from validator.runs.tensorfile import ITEMSIZES
from validator.runs.view import TensorRef
from validator.store.blob_read import open_blob_tensor, open_file_tensor

if TYPE_CHECKING:
    from validator.judging.compare import Measured, Pair

__all__ = [
    "ExecutorSpec", "RayExecutor", "RayUnavailable", "disconnect", "parse_executor", "pair_memory", "plan_batches", "plan_ranges",
]

RAY_INSTALL = "pip install 'validator[ray]'"
BATCH_BYTES = 256 << 20  # pairs are packed into one task until their tensors hold this many bytes...
BATCH_PAIRS = 256  # ...or this many pairs
MAX_RETRIES = 3  # Ray runs a task again this many times when its worker process or node dies
CONNECT_TIMEOUT_S = 5.0
LOST_AFTER_S = 30.0  # a cluster with no node able to run a task for this long is lost
HEAD_CHECK_S = 2.0  # while waiting for results, whether the head still answers is checked this often


class RayUnavailable(ValidatorError):
    """No Ray (not installed), no cluster, or the cluster was lost: the comparison did not run (exit 2)."""


@dataclass(frozen=True)
class ExecutorSpec:
    """Where a comparison measures its pairs: ``local`` (this process) or ``ray`` (``address`` None: the
    cluster of ``RAY_ADDRESS`` or of this machine)."""

    kind: str = "local"
    address: str | None = None

    def __str__(self) -> str:
        return self.kind if self.address is None else f"{self.kind}={self.address}"


def parse_executor(text: str | None) -> ExecutorSpec:
    """``local``, ``ray`` or ``ray=ADDRESS`` (``HOST:PORT`` of the head's GCS, or ``ray://HOST:PORT``)."""
    if not text or text == "local":
        return ExecutorSpec()
    kind, sep, address = text.partition("=")
    if kind != "ray" or (sep and not address.strip()):
        raise InputError(f"executor {text!r}: use local, ray or ray=ADDRESS (HOST:PORT of the Ray head, or ray://HOST:PORT)")
    return ExecutorSpec("ray", address.strip() or None)


# -- planning (no Ray needed) -------------------------------------------------------------------


def _itemsize(dtype: str) -> int:
    return ITEMSIZES.get(dtype, 8)


def tensor_memory(t: LogicalTensor) -> int:
    """Bytes held while ``t.materialize()`` runs and its result lives: a split tensor holds its pieces and
    their concatenation; a partial sum two float64 tensors and one piece; copies being checked against
    each other one more copy and a float64 difference."""
    numel = math.prod(t.shape())
    size = numel * _itemsize(t.dtype)
    kind = t.kind
    if kind == "split":
        return 2 * size + (size + 8 * numel if len(t.shards) > len({r.shard.index for r in t.shards}) else 0)
    if kind == "partial" and len(t.shards) > 1:
        return 16 * numel + size
    if kind == "replicated" and len(t.shards) > 1:
        return 2 * size + 16 * numel
    return size


def pair_memory(la: LogicalTensor, lb: LogicalTensor, rounding: bool) -> int:
    """An upper estimate of the bytes one task needs to measure a pair: both tensors assembled, the
    reference rounded to the candidate's dtype when its rounding floor is measured, and the engine's
    scratch (a row of sums per block, small)."""
    extra = math.prod(la.shape()) * 8 if rounding else 0
    return tensor_memory(la) + tensor_memory(lb) + extra + (16 << 20)


def plan_batches(pairs: list[Pair], *, batch_bytes: int = BATCH_BYTES, batch_pairs: int = BATCH_PAIRS) -> list[list[int]]:
    """Indices of ``pairs`` grouped into tasks, in order: consecutive pairs until ``batch_bytes`` of
    tensor bytes or ``batch_pairs`` pairs; a pair larger than ``batch_bytes`` is a task of its own."""
    out: list[list[int]] = []
    cur: list[int] = []
    cur_bytes = 0
    for i, (la, lb, _) in enumerate(pairs):
        size = sum(r.nbytes for r in la.shards) + sum(r.nbytes for r in lb.shards)
        if cur and (cur_bytes + size > batch_bytes or len(cur) >= batch_pairs):
            out.append(cur)
            cur, cur_bytes = [], 0
        cur.append(i)
        cur_bytes += size
    if cur:
        out.append(cur)
    return out


def plan_ranges(shape: tuple[int, ...], bytes_per_element: int, bound: int) -> list[tuple[int, int]]:
    """Element ranges (row-major, ``start, stop``) that cut a pair of ``shape`` into pieces of at most
    ``bound`` bytes of both tensors (``bytes_per_element``: A's item size plus B's), for range tasks. Every
    cut is on an edge of the pair's row blocks (``floors.block_edges``: the blocks whose sums the bootstrap
    interval resamples), so each block's sums come whole from one task; a block larger than ``bound`` is a
    range of its own. One range when the pair fits.

    Not used by :class:`RayExecutor` yet: the engine's totals do not merge bit for bit across ranges
    (docs/ray.md, "Splitting huge tensors")."""
    from validator.numerics.floors import block_edges

    edges = block_edges(shape)
    out: list[tuple[int, int]] = []
    start = edges[0]
    for lo, hi in zip(edges, edges[1:]):
        if hi > start and lo > start and (hi - start) * bytes_per_element > bound:
            out.append((start, lo))
            start = lo
    if edges[-1] > start or not out:
        out.append((start, edges[-1]))
    return out


def _portable_ref(r: TensorRef, blob_url: str | None) -> TensorRef:
    """``r`` with a loader a worker can run: from its file (by absolute path) or from the blob store."""
    loader: Callable[[], Any]
    if r.location is not None:
        path, offset = r.location
        loader = functools.partial(open_file_tensor, str(Path(path).resolve()), offset, r.nbytes, r.dtype, r.shape)
        return replace(r, loader=loader, location=(Path(path).resolve(), offset))
    if r.sha256 is not None and blob_url is not None:
        loader = functools.partial(open_blob_tensor, blob_url, r.sha256, r.dtype, r.shape, r.nbytes)
        return replace(r, loader=loader)
    raise InputError(
        f"{r.origin}: tensor {r.name!r} cannot be read by Ray workers: they read stored runs from the blob store "
        "and bundles or .safetensors files from a filesystem they share; compare this run without --executor ray, "
        "or ingest it first"
    )


def portable(t: LogicalTensor, blob_url: str | None) -> LogicalTensor:
    """A copy of ``t`` that pickles to metadata only and loads its shards where it is unpickled."""
    return LogicalTensor(t.name, t.coords, [_portable_ref(r, blob_url) for r in t.shards], list(t.notes))


# -- the task (runs on a worker) ------------------------------------------------------------------


@dataclass
class _Failed:
    """An error a task met that the user can act on (a missing blob, an unreadable file), sent back whole."""

    error: BaseException


def _measure_batch(measure: Callable[[LogicalTensor, LogicalTensor, bool], Measured], pairs: list[Pair]) -> list[Any]:
    """The body of a task: ``measure`` each pair in order, on the CPUs Ray assigned to the task."""
    try:
        import numba
        import ray

        context: Any = ray.get_runtime_context()
        config: Any = numba.config
        cpus = context.get_assigned_resources().get("CPU", 1.0)
        numba.set_num_threads(max(1, min(int(cpus), config.NUMBA_NUM_THREADS)))
    except (ImportError, ValueError, RuntimeError):
        pass
    out: list[Any] = []
    for la, lb, rounding in pairs:
        try:
            out.append(measure(la, lb, rounding))
        except (ValidatorError, OSError) as exc:
            return [_Failed(exc)]
    return out


# -- the driver --------------------------------------------------------------------------------


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise RayUnavailable(f"--executor ray needs Ray, which is not installed here: {RAY_INSTALL}") from None
    return ray


def _check_reachable(address: str) -> None:
    """Fail fast, with a clear message, when nothing listens at ``HOST:PORT`` (ray.init would wait)."""
    hostport = address.removeprefix("ray://")
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit():
        raise InputError(f"Ray address {address!r}: use HOST:PORT (the head's GCS port, 6379 by default) or ray://HOST:PORT")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        raise RayUnavailable(
            f"no Ray cluster answers at {address} ({exc.strerror or exc}); start one (`ray start --head`) or point "
            "--executor ray=HOST:PORT at its head (docs/ray.md)"
        ) from None


_CONNECTED: str | None = None
_GCS: str | None = None  # HOST:PORT of the connected cluster's head
_CONNECT_LOCK = threading.Lock()  # a server's background comparisons may start together


def connect(address: str | None) -> Any:
    """Connect this process to the cluster once (Ray allows one per process); returns the ``ray`` module."""
    with _CONNECT_LOCK:
        return _connect(address)


def _connect(address: str | None) -> Any:
    global _CONNECTED, _GCS
    ray = _import_ray()
    target = address or os.environ.get("RAY_ADDRESS") or "auto"
    if ray.is_initialized():
        if _CONNECTED is not None and target != _CONNECTED:
            raise RayUnavailable(f"this process is already connected to the Ray cluster at {_CONNECTED}, not {target}")
        return ray
    if target != "auto":
        _check_reachable(target)
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
    _CONNECTED = target
    try:
        context: Any = ray.get_runtime_context()
        _GCS = str(context.gcs_address)
    except (AttributeError, RuntimeError):
        _GCS = target if target != "auto" else None
    return ray


def disconnect() -> None:
    """Leave the cluster this process is connected to, if any (before the cluster goes away on purpose:
    a driver left connected to a stopped cluster is ended by Ray a minute later)."""
    with _CONNECT_LOCK:
        if _CONNECTED is None:
            return
        _disconnect(_import_ray())


def _head_answers() -> bool:
    """Whether the head's GCS port still accepts a connection (a plain TCP connect: asking Ray itself would
    block for a minute when the head is gone, after which Ray ends this process)."""
    if _GCS is None:
        return True
    host, _, port = _GCS.removeprefix("ray://").rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except (OSError, ValueError):
        return False
    return True


def _disconnect(ray: Any) -> None:
    """Leave a lost cluster, so that Ray does not end this process (a server) when its head stays gone;
    bounded: Ray's shutdown may wait on the dead head."""
    global _CONNECTED, _GCS
    t = threading.Thread(target=ray.shutdown, name="ray-shutdown", daemon=True)
    t.start()
    t.join(timeout=10.0)
    _CONNECTED = _GCS = None


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


def _lost(ray: Any, exc: BaseException) -> RayUnavailable:
    return RayUnavailable(f"the Ray cluster was lost during the comparison ({type(exc).__name__}: {exc}); nothing was stored")


class RayExecutor:
    """A ``PairExecutor`` (validator.judging.compare) on a Ray cluster.

    ``blob_url``: the blob store as the workers reach it (``s3://...``, or ``file://PATH`` of a directory
    they all mount at the same path); needed for stored runs. ``in_flight``: tasks submitted ahead of the
    results consumed (default: two per CPU of the cluster). ``fresh_workers``: each task in a new worker
    process (Ray's ``max_calls=1``): whatever a task allocated goes back to the node when it ends, at the
    cost of a process start and the imports (torch, numba) per task."""

    def __init__(
        self,
        address: str | None = None,
        *,
        blob_url: str | None = None,
        max_retries: int = MAX_RETRIES,
        cpus_per_task: float = 1.0,
        batch_bytes: int = BATCH_BYTES,
        batch_pairs: int = BATCH_PAIRS,
        in_flight: int | None = None,
        fresh_workers: bool = False,
    ) -> None:
        self.address = address
        self.blob_url = blob_url
        self.max_retries = max_retries
        self.cpus_per_task = cpus_per_task
        self.batch_bytes = batch_bytes
        self.batch_pairs = batch_pairs
        self.in_flight = in_flight
        self.fresh_workers = fresh_workers
        self.tasks_submitted = 0

    def __call__(self, measure: Callable[[LogicalTensor, LogicalTensor, bool], Measured], pairs: list[Pair]) -> Iterator[Measured]:
        if not pairs:
            return iter(())
        shipped = [(portable(la, self.blob_url), portable(lb, self.blob_url), r) for la, lb, r in pairs]  # before connecting: bad input first
        ray = connect(self.address)
        return self._run(ray, measure, shipped)

    def _run(self, ray: Any, measure: Callable[..., Measured], pairs: list[Pair]) -> Iterator[Measured]:
        from ray import exceptions as rex

        try:
            nodes = [n for n in ray.nodes() if n.get("Alive")]
        except Exception as exc:  # any failure to talk to the cluster is a lost cluster
            raise _lost(ray, exc) from None
        node_mem = max((n.get("Resources", {}).get("memory", 0.0) for n in nodes), default=0.0)
        cpus = sum(n.get("Resources", {}).get("CPU", 0.0) for n in nodes)
        if cpus < self.cpus_per_task:
            raise RayUnavailable(f"the Ray cluster at {_CONNECTED} has no node with {self.cpus_per_task:g} CPU(s) to run a task")
        # at least four tasks per task slot when the pairs allow it, so that every worker has work to the end
        total = sum(r.nbytes for la, lb, _ in pairs for r in (*la.shards, *lb.shards))
        slots = max(1, int(cpus / self.cpus_per_task))
        batch_bytes = max(1, min(self.batch_bytes, total // (4 * slots)))
        batches = plan_batches(pairs, batch_bytes=batch_bytes, batch_pairs=self.batch_pairs)
        memory = [max(pair_memory(*pairs[i]) for i in b) for b in batches]
        worst = max(range(len(batches)), key=lambda j: memory[j])
        if node_mem and memory[worst] > node_mem:
            la = pairs[batches[worst][0]][0]
            raise InputError(
                f"tensor {la.label!r} needs about {memory[worst] / 2**30:.1f} GiB to compare, more than any Ray node "
                f"offers ({node_mem / 2**30:.1f} GiB of its memory resource)"
            )
        task = ray.remote(max_calls=1)(_measure_batch) if self.fresh_workers else ray.remote(_measure_batch)
        measure_ref = ray.put(measure)
        window = self.in_flight or max(2, int(2 * cpus / self.cpus_per_task))
        pending: dict[Any, int] = {}
        done: dict[int, list[Any]] = {}
        submitted = 0
        last_progress = last_check = time.monotonic()
        lost = False
        try:
            for j in range(len(batches)):
                while submitted < len(batches) and len(pending) < window:
                    opts: dict[str, Any] = {
                        "num_cpus": self.cpus_per_task,
                        "max_retries": self.max_retries,
                        "retry_exceptions": False,
                        "name": f"validator.measure[{submitted}]",
                    }
                    if node_mem:
                        opts["memory"] = min(memory[submitted], int(node_mem))
                    ref = task.options(**opts).remote(measure_ref, [pairs[i] for i in batches[submitted]])
                    pending[ref] = submitted
                    submitted += 1
                    self.tasks_submitted += 1
                while j not in done:
                    ready, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)
                    for ref in ready:
                        done[pending.pop(ref)] = ray.get(ref)
                        last_progress = time.monotonic()
                    now = time.monotonic()
                    if not ready and now - last_check > HEAD_CHECK_S:
                        last_check = now
                        if not _head_answers():
                            lost = True
                            raise RayUnavailable(
                                f"the Ray cluster was lost during the comparison: its head at {_GCS} no longer answers; "
                                "nothing was stored"
                            )
                    if not ready and now - last_progress > LOST_AFTER_S:
                        self._check_alive(ray)
                        last_progress = time.monotonic()
                results = done.pop(j)
                if results and isinstance(results[0], _Failed):
                    err = results[0].error
                    if isinstance(err, OSError):  # most likely a path the workers do not see as the driver does
                        where = f"{err.filename}: " if err.filename else ""
                        raise InputError(
                            f"a Ray worker cannot read {where}{err.strerror or err}; the workers must see bundles and "
                            "local blob stores at the same path as this machine (docs/ray.md)"
                        )
                    raise err
                yield from results
        except rex.RayTaskError as exc:  # an error in our code on a worker: not a fault Ray retries
            raise ValidatorError(f"a comparison task failed on the Ray cluster: {exc.cause!r}") from None
        except (rex.RayError, ConnectionError) as exc:  # worker or node gone past its retries, object lost, GCS gone
            lost = True
            raise _lost(ray, exc) from None
        finally:
            if lost:
                _disconnect(ray)
            else:
                for ref in pending:
                    with contextlib.suppress(Exception):
                        ray.cancel(ref, force=True)

    def _check_alive(self, ray: Any) -> None:
        try:
            alive = [n for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU", 0.0) >= self.cpus_per_task]
        except Exception as exc:
            raise _lost(ray, exc) from None
        if not alive:
            raise RayUnavailable(
                f"the Ray cluster at {_CONNECTED} has had no live node able to run a task for {LOST_AFTER_S:g} s; nothing was stored"
            )


def make_executor(spec: ExecutorSpec, *, blob_url: str | None = None) -> RayExecutor | None:
    """The executor ``spec`` names (None: measure in this process)."""
    if spec.kind == "local":
        return None
    import importlib.util

    if importlib.util.find_spec("ray") is None:  # without importing it
        raise RayUnavailable(f"--executor ray needs Ray, which is not installed here: {RAY_INSTALL}")
    address = spec.address or os.environ.get("RAY_ADDRESS")
    if address and address != "auto":
        _check_reachable(address)  # before the comparison reads anything: no cluster is the first error
    return RayExecutor(spec.address, blob_url=blob_url)
