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
cluster: at least four tasks per CPU when the pairs allow), a pair larger than that alone. A pair larger
than ``range_bytes`` (``VALIDATOR_RAY_RANGE_BYTES``, default :data:`RANGE_BYTES`) is cut into element
ranges (:func:`plan_ranges`), a task each: the task reads only its range of each stored piece
(:func:`assemble_range`) and returns the engine's range partials (``validator.numerics.ranges``); the
driver merges them in the engine's own order (:func:`merge_measured`), the same bits as the whole pair.

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
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from validator.errors import InputError, ValidatorError
from validator.runs.reassembly import LogicalTensor
from validator.runs.tensorfile import ITEMSIZES
from validator.runs.view import TensorRef
from validator.settings import ExecutorSpec, parse_executor, ray_hostport
from validator.store.blob_read import open_blob_range, open_blob_tensor, open_file_range, open_file_tensor

if TYPE_CHECKING:
    from validator.judging.compare import Measured, Pair

__all__ = [
    "ExecutorSpec", "RayExecutor", "RayUnavailable", "disconnect", "parse_executor", "pair_memory", "plan_batches", "plan_ranges",
]

RAY_INSTALL = "pip install 'validator[ray]'"
BATCH_BYTES = 256 << 20  # pairs are packed into one task until their tensors hold this many bytes...
BATCH_PAIRS = 256  # ...or this many pairs
RANGE_BYTES = 1 << 30  # a pair holding more bytes (A's and B's shards) is measured in ranges of at most this many
MAX_RETRIES = 3  # Ray runs a task again this many times when its worker process or node dies
CONNECT_TIMEOUT_S = 3.0  # whether a cluster answers at an address: known within this (docs/ray.md promises 5 s)
LOST_AFTER_S = 30.0  # a cluster with no node able to run a task for this long is lost
HEAD_CHECK_S = 2.0  # while waiting for results, whether the head still answers is checked this often


class RayUnavailable(ValidatorError):
    """No Ray (not installed), no cluster, or the cluster was lost: the comparison did not run (exit 2)."""


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
    ``bound`` bytes of both tensors (``bytes_per_element``: A's item size plus B's), for range tasks. Cuts
    fall on edges of the pair's row blocks (``floors.block_edges``) where they can; a block larger than
    ``bound`` is cut inside, at the first element of one of the engine's rows of partials
    (``numerics.ranges.is_cut``: an edge plus a multiple of ``ROW``), so a range is never smaller than one
    such row. One range when the pair fits. Every range merges exactly (``numerics.ranges.merge``)."""
    from validator.numerics.floors import block_edges
    from validator.numerics.ranges import ROW

    edges = block_edges(shape)
    limit = max(1, bound // max(1, bytes_per_element))  # elements per range
    step = max(ROW, limit // ROW * ROW)  # inside a block: whole rows
    out: list[tuple[int, int]] = []
    start = edges[0]
    for lo, hi in zip(edges, edges[1:]):
        if hi - start <= limit or hi == lo:
            continue
        if lo > start:
            out.append((start, lo))
            start = lo
        while hi - start > limit and start + step < hi:
            out.append((start, start + step))
            start += step
    if edges[-1] > start or not out:
        out.append((start, edges[-1]))
    return out


def _portable_ref(r: TensorRef, blob_url: str | None) -> TensorRef:
    """``r`` with a loader a worker can run: from its file (by absolute path) or from the blob store (no
    ``read_into``: it holds this process's blob store)."""
    loader: Callable[[], Any]
    if r.location is not None:
        path, offset = r.location
        loader = functools.partial(open_file_tensor, str(Path(path).resolve()), offset, r.nbytes, r.dtype, r.shape)
        return replace(r, loader=loader, location=(Path(path).resolve(), offset), read_into=None)
    if r.sha256 is not None and blob_url is not None:
        loader = functools.partial(open_blob_tensor, blob_url, r.sha256, r.dtype, r.shape, r.nbytes)
        return replace(r, loader=loader, read_into=None)  # the store's reader stays here
    raise InputError(
        f"{r.origin}: tensor {r.name!r} cannot be read by Ray workers: they read stored runs from the blob store "
        "and bundles or .safetensors files from a filesystem they share; compare this run without --executor ray, "
        "or ingest it first"
    )


def portable(t: LogicalTensor, blob_url: str | None) -> LogicalTensor:
    """A copy of ``t`` that pickles to metadata only and loads its shards where it is unpickled."""
    return LogicalTensor(t.name, t.coords, [_portable_ref(r, blob_url) for r in t.shards], list(t.notes))


# -- ranges of a huge pair (docs/ray.md, "Splitting huge tensors") ---------------------------------


def _assembled_dtype(t: LogicalTensor) -> str:
    """The dtype of ``t.materialize()``: a partial sum of several stages is added in float64."""
    return "float64" if t.kind == "partial" and len(t.shards) > 1 else t.dtype


def splittable(la: LogicalTensor, lb: LogicalTensor) -> bool:
    """Whether a pair can be measured in ranges: equal shapes, and float dtypes the CPU engine reads
    (``numerics.ranges.rangeable``; integer and boolean pairs are measured whole)."""
    from validator.numerics.backends.common import FLOAT_DTYPES
    from validator.runs.tensorfile import torch_dtype

    if la.shape() != lb.shape() or not la.shards or not lb.shards:
        return False
    try:
        return torch_dtype(_assembled_dtype(la)) in FLOAT_DTYPES and torch_dtype(_assembled_dtype(lb)) in FLOAT_DTYPES
    except (InputError, KeyError, ValueError):
        return False


def _outer_row(t: LogicalTensor) -> int:
    """Elements a range task may read past each end of its range: a split tensor along a dim other than
    the first is read in whole rows of its dims from the split one on."""
    if t.kind != "split":
        return 0
    dim = t.shards[0].shard.dim or 0
    return math.prod(t.shape()[dim:]) if dim > 0 else 0


def range_memory(la: LogicalTensor, lb: LogicalTensor, rounding: bool, start: int, stop: int) -> int:
    """An upper estimate of the bytes one range task needs: :func:`pair_memory`'s terms for the range's
    share of the pair (and the whole rows read around it), plus the engine's scratch."""
    numel = max(1, math.prod(la.shape()))
    n = stop - start
    total = 0
    for t in (la, lb):
        frac = min(1.0, (n + 2 * _outer_row(t)) / numel)
        total += int(tensor_memory(t) * frac)
    extra = n * 8 if rounding else 0
    return total + extra + 2 * n * 8 + (16 << 20)  # the float64 NaN count pieces, at most


def _replica_checks(t: LogicalTensor) -> list[tuple[TensorRef, TensorRef]]:
    """(the copy used, another copy) of every check ``t.materialize()`` makes, in its order."""
    if t.kind == "replicated":
        return [(t.shards[0], r) for r in t.shards[1:]]
    if t.kind != "split":
        return []
    by_index: dict[int, list[TensorRef]] = {}
    for r in t.shards:
        by_index.setdefault(r.shard.index, []).append(r)
    out = []
    for i in sorted(by_index):
        reps = sorted(by_index[i], key=lambda r: r.shard.replica)
        out += [(reps[0], r) for r in reps[1:]]
    return out


def _read_range(r: TensorRef, blob_url: str | None, lo: int, hi: int) -> Any:
    """Elements ``lo .. hi`` of one stored tensor, reading only their bytes (1-D)."""
    if r.location is not None:
        path, offset = r.location
        return open_file_range(str(path), offset, r.dtype, lo, hi)
    if r.sha256 is not None and blob_url is not None:
        return open_blob_range(blob_url, r.sha256, r.dtype, r.nbytes, lo, hi)
    raise InputError(f"{r.origin}: tensor {r.name!r} cannot be read in ranges by Ray workers")


# a replica check over a range: (bitwise equal there, the largest finite |difference| there or None)
Check = tuple[bool, float | None]


def _check_range(first: Any, other: Any) -> Check:
    """What ``LogicalTensor._check_replicas`` finds, over one range (merged over the ranges by the driver)."""
    import torch

    if torch.equal(first, other):
        return True, (0.0 if bool(torch.isfinite(first.to(torch.float64)).any()) else None)
    diff = (other.to(torch.float64) - first.to(torch.float64)).abs()
    finite = torch.isfinite(diff)
    return False, (float(diff[finite].max()) if bool(finite.any()) else None)


def assemble_range(t: LogicalTensor, start: int, stop: int, blob_url: str | None) -> tuple[Any, list[Check | None]]:
    """Elements ``start .. stop`` of ``t.materialize()`` (1-D, the same values), reading only those elements
    of each stored piece (a split along a dim other than the first: whole rows of the dims from it on), and
    the replica checks over what was read (aligned with :func:`_replica_checks`, None where not read)."""
    import torch

    checks_of = _replica_checks(t)
    found: list[Check | None] = [None] * len(checks_of)

    def check(ref0: TensorRef, first: Any, lo: int, hi: int) -> None:
        for k, (c0, r) in enumerate(checks_of):
            if c0 is ref0:
                if r.sha256 is not None and r.sha256 == ref0.sha256:
                    got: Check = (True, None)
                else:
                    got = _check_range(first, _read_range(r, blob_url, lo, hi))
                found[k] = got

    kind = t.kind
    if kind in ("full", "replicated"):
        first = _read_range(t.shards[0], blob_url, start, stop)
        check(t.shards[0], first, start, stop)
        return first, found
    if kind == "partial":
        ordered = sorted(t.shards, key=lambda r: r.shard.index)
        if len(ordered) == 1:
            return _read_range(ordered[0], blob_url, start, stop), found
        total = _read_range(ordered[0], blob_url, start, stop).to(torch.float64)
        for r in ordered[1:]:
            total = total + _read_range(r, blob_url, start, stop).to(torch.float64)
        return total, found
    pieces = t._split_pieces()
    dim = t.shards[0].shard.dim or 0
    if dim == 0:  # each piece is a run of the logical tensor's elements
        parts, offset = [], 0
        for ref in pieces:
            n = math.prod(ref.shape)
            lo, hi = max(start, offset), min(stop, offset + n)
            if hi > lo:
                x = _read_range(ref, blob_url, lo - offset, hi - offset)
                check(ref, x, lo - offset, hi - offset)
                parts.append(x)
            offset += n
        return (torch.cat(parts) if len(parts) > 1 else parts[0]), found
    width = math.prod(t.shape()[dim:])  # elements of one logical row of the dims from `dim` on
    o0, o1 = start // width, -(-stop // width)
    rows = []
    for ref in pieces:
        w = math.prod(ref.shape[dim:])
        x = _read_range(ref, blob_url, o0 * w, o1 * w)
        check(ref, x, o0 * w, o1 * w)
        rows.append(x.view(o1 - o0, w))
    flat = torch.cat(rows, dim=1).reshape(-1)
    return flat[start - o0 * width : stop - o0 * width].clone(), found


def replica_notes(t: LogicalTensor, found: list[list[Check | None]]) -> list[str]:
    """``t.notes`` as ``t.materialize()`` leaves them, from the replica checks of all its ranges."""
    notes = list(t.notes)
    for k, (ref0, r) in enumerate(_replica_checks(t)):
        got = [c for c in (f[k] for f in found) if c is not None]
        if all(eq for eq, _ in got):
            continue
        worsts = [w for _, w in got if w is not None]
        worst = max(worsts) if worsts else float("nan")
        notes.append(f"replicas disagree: {r.origin} ({r.shard}) differs from {ref0.origin} ({ref0.shard}), max |diff| {worst:.3g}")
    return notes


@dataclass
class RangeResult:
    """One range task's answer: the pair's range partials, the rounding floor's (or None), and the replica
    checks of A and of B over the range."""

    pair: Any  # numerics.ranges.RangePartials
    rounding: Any
    checks_a: list[Check | None]
    checks_b: list[Check | None]


def _measure_range(la: LogicalTensor, lb: LogicalTensor, rounding_dtype: str | None, start: int, stop: int, blob_url: str | None) -> list[Any]:
    """The body of a range task: elements ``start .. stop`` of the pair, assembled and measured."""
    from validator.numerics.ranges import measure_range, rounding_range

    _use_assigned_cpus()
    shape = la.shape()
    try:
        ta, checks_a = assemble_range(la, start, stop, blob_url)
        tb, checks_b = assemble_range(lb, start, stop, blob_url)
        part = measure_range(ta, tb, shape, start)
        rounding = rounding_range(ta, rounding_dtype, shape, start) if rounding_dtype else None
    except (ValidatorError, OSError) as exc:
        return [_Failed(exc)]
    return [RangeResult(part, rounding, checks_a, checks_b)]


def merge_measured(pair: Pair, results: list[RangeResult]) -> Measured:
    """A split pair's ``Measured`` from its ranges' results in order: the bits ``compare._measure`` gives
    for the whole pair (``numerics.ranges.merge``), the replica notes rebuilt from the ranges' checks."""
    from validator.judging.compare import Measured
    from validator.numerics.ranges import merge

    la, lb, _ = pair
    m, blocks = merge([x.pair for x in results])
    rounding = merge([x.rounding for x in results])[1] if results[0].rounding is not None else None
    notes = [f"A: {n}" for n in replica_notes(la, [x.checks_a for x in results])]
    notes += [f"B: {n}" for n in replica_notes(lb, [x.checks_b for x in results])]
    return Measured(m, None, notes, blocks=blocks, rounding=rounding)


# -- the task (runs on a worker) ------------------------------------------------------------------


@dataclass
class _Failed:
    """An error a task met that the user can act on (a missing blob, an unreadable file), sent back whole."""

    error: BaseException


def _measure_batch(measure: Callable[[LogicalTensor, LogicalTensor, bool], Measured], pairs: list[Pair]) -> list[Any]:
    """The body of a task: ``measure`` each pair in order, on the CPUs Ray assigned to the task."""
    _use_assigned_cpus()
    out: list[Any] = []
    for la, lb, rounding in pairs:
        try:
            out.append(measure(la, lb, rounding))
        except (ValidatorError, OSError) as exc:
            return [_Failed(exc)]
    return out


def _use_assigned_cpus() -> None:
    """The engine's numba threads: as many as the CPUs Ray assigned to the task."""
    try:
        import numba
        import ray

        if not ray.is_initialized():  # not in a Ray worker (a test calling a task's body)
            return
        context: Any = ray.get_runtime_context()
        config: Any = numba.config
        cpus = context.get_assigned_resources().get("CPU", 1.0)
        numba.set_num_threads(max(1, min(int(cpus), config.NUMBA_NUM_THREADS)))
    except (ImportError, ValueError, RuntimeError, AssertionError):  # not in a task (Ray asserts it)
        pass


# -- the driver --------------------------------------------------------------------------------


def _import_ray() -> Any:
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


def _check_reachable(address: str) -> None:
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
    _check_reachable(target if target != "auto" else _local_head(ray) or "")
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


@dataclass
class _Job:
    """One task: a batch of pairs (``span`` None), or elements ``span`` of one pair (``last``: its last range)."""

    pairs: list[int]
    span: tuple[int, int] | None
    last: bool
    memory: int


def _rounding_dtype(la: LogicalTensor, lb: LogicalTensor, rounding: bool) -> str | None:
    """The dtype the reference is rounded to for its rounding floor, as ``compare._measure_batch`` decides it."""
    from validator.numerics.floors import more_precise

    return lb.dtype if rounding and more_precise(la.dtype, lb.dtype) else None


def _checked(results: list[Any]) -> list[Any]:
    """A task's results, or the error it met raised here."""
    if results and isinstance(results[0], _Failed):
        err = results[0].error
        if isinstance(err, OSError):  # most likely a path the workers do not see as the driver does
            where = f"{err.filename}: " if err.filename else ""
            raise InputError(
                f"a Ray worker cannot read {where}{err.strerror or err}; the workers must see bundles and "
                "local blob stores at the same path as this machine (docs/ray.md)"
            )
        raise err
    return results


@dataclass
class _Watch:
    """When a wait for results last looked at the cluster's head, and last got a result."""

    last_check: float = field(default_factory=time.monotonic)
    last_progress: float = field(default_factory=time.monotonic)


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
        range_bytes: int | None = RANGE_BYTES,
    ) -> None:
        self.address = address
        self.blob_url = blob_url
        self.max_retries = max_retries
        self.cpus_per_task = cpus_per_task
        self.batch_bytes = batch_bytes
        self.batch_pairs = batch_pairs
        self.in_flight = in_flight
        self.fresh_workers = fresh_workers
        self.range_bytes = range_bytes
        self.tasks_submitted = 0
        self.range_tasks = 0  # tasks that measured a range of a split pair
        self._lost_head = False

    def __call__(self, measure: Callable[[LogicalTensor, LogicalTensor, bool], Measured], pairs: list[Pair]) -> Iterator[Measured]:
        if not pairs:
            return iter(())
        shipped = [(portable(la, self.blob_url), portable(lb, self.blob_url), r) for la, lb, r in pairs]  # before connecting: bad input first
        ray = connect(self.address)
        return self._run(ray, measure, shipped)

    def _plan(self, pairs: list[Pair], batch_bytes: int) -> list[_Job]:
        """The tasks, in the pairs' order: batches of consecutive pairs (:func:`plan_batches`), and for each
        pair above ``range_bytes`` that can be split, its ranges (:func:`plan_ranges`), a task each."""
        jobs: list[_Job] = []
        run: list[int] = []

        def flush() -> None:
            for batch in plan_batches([pairs[i] for i in run], batch_bytes=batch_bytes, batch_pairs=self.batch_pairs):
                idx = [run[k] for k in batch]
                jobs.append(_Job(idx, None, False, max(pair_memory(*pairs[i]) for i in idx)))
            run.clear()

        for i, (la, lb, r) in enumerate(pairs):
            spans: list[tuple[int, int]] = []
            size = sum(x.nbytes for x in la.shards) + sum(x.nbytes for x in lb.shards)
            if self.range_bytes is not None and size > self.range_bytes and splittable(la, lb):
                per = _itemsize(la.dtype) + _itemsize(lb.dtype)
                spans = plan_ranges(la.shape(), per, self.range_bytes)
            if len(spans) <= 1:
                run.append(i)
                continue
            flush()
            for k, (lo, hi) in enumerate(spans):
                jobs.append(_Job([i], (lo, hi), k == len(spans) - 1, range_memory(la, lb, r, lo, hi)))
        flush()
        return jobs

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
        jobs = self._plan(pairs, batch_bytes)
        worst = max(range(len(jobs)), key=lambda j: jobs[j].memory)
        if node_mem and jobs[worst].memory > node_mem:
            la = pairs[jobs[worst].pairs[0]][0]
            raise InputError(
                f"tensor {la.label!r} needs about {jobs[worst].memory / 2**30:.1f} GiB to compare, more than any Ray node "
                f"offers ({node_mem / 2**30:.1f} GiB of its memory resource)"
            )
        remote = ray.remote(max_calls=1) if self.fresh_workers else ray.remote
        batch_task, range_task = remote(_measure_batch), remote(_measure_range)
        measure_ref = ray.put(measure)
        window = self.in_flight or max(2, int(2 * cpus / self.cpus_per_task))
        pending: dict[Any, int] = {}
        done: dict[int, list[Any]] = {}
        ranges: dict[int, list[RangeResult]] = {}
        submitted = 0
        watch = _Watch()
        self._lost_head = False
        lost = False

        def options(name: str, memory: int) -> dict[str, Any]:
            opts: dict[str, Any] = {"num_cpus": self.cpus_per_task, "max_retries": self.max_retries, "retry_exceptions": False, "name": name}
            if node_mem:
                opts["memory"] = min(memory, int(node_mem))
            return opts

        try:
            for j in range(len(jobs)):
                while submitted < len(jobs) and len(pending) < window:
                    job = jobs[submitted]
                    opts = options(f"validator.measure[{submitted}]", job.memory)
                    if job.span is None:
                        ref = batch_task.options(**opts).remote(measure_ref, [pairs[i] for i in job.pairs])
                    else:
                        la, lb, r = pairs[job.pairs[0]]
                        ref = range_task.options(**opts).remote(la, lb, _rounding_dtype(la, lb, r), *job.span, self.blob_url)
                        self.range_tasks += 1
                    pending[ref] = submitted
                    submitted += 1
                    self.tasks_submitted += 1
                while j not in done:
                    for ref, value in self._wait(ray, list(pending), watch):
                        done[pending.pop(ref)] = value
                results = _checked(done.pop(j))
                job = jobs[j]
                if job.span is None:
                    yield from results
                    continue
                got = ranges.setdefault(job.pairs[0], [])
                got.append(results[0])
                if job.last:
                    del ranges[job.pairs[0]]
                    yield merge_measured(pairs[job.pairs[0]], got)
        except rex.RayTaskError as exc:  # an error in our code on a worker: not a fault Ray retries
            raise ValidatorError(f"a comparison task failed on the Ray cluster: {exc.cause!r}") from None
        except (rex.RayError, ConnectionError) as exc:  # worker or node gone past its retries, object lost, GCS gone
            lost = True
            raise _lost(ray, exc) from None
        finally:
            if lost or self._lost_head:
                _disconnect(ray)
            else:
                for ref in pending:
                    with contextlib.suppress(Exception):
                        ray.cancel(ref, force=True)

    def _check_head(self) -> None:
        if not _head_answers():
            self._lost_head = True
            raise RayUnavailable(
                f"the Ray cluster was lost during the comparison: its head at {_GCS} no longer answers; nothing was stored"
            )

    def _wait(self, ray: Any, refs: list[Any], watch: _Watch) -> list[tuple[Any, Any]]:
        """Up to a second's wait for any of ``refs``: the results that came, as (ref, value). Without one, the
        head is checked every HEAD_CHECK_S and the workers after LOST_AFTER_S without a result."""
        ready, _ = ray.wait(refs, num_returns=1, timeout=1.0)
        got = [(ref, ray.get(ref)) for ref in ready]
        now = time.monotonic()
        if got:
            watch.last_progress = now
            return got
        if now - watch.last_check > HEAD_CHECK_S:
            watch.last_check = now
            self._check_head()
        if now - watch.last_progress > LOST_AFTER_S:
            self._check_alive(ray)
            watch.last_progress = time.monotonic()
        return got

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
    range_bytes = range_bytes_setting()
    address = spec.address or os.environ.get("RAY_ADDRESS")
    if address and address != "auto":
        _check_reachable(address)  # before the comparison reads anything: no cluster is the first error
    return RayExecutor(spec.address, blob_url=blob_url, range_bytes=range_bytes)


RANGE_BYTES_ENV = "VALIDATOR_RAY_RANGE_BYTES"


def range_bytes_setting() -> int | None:
    """The bound above which a pair is measured in ranges: ``VALIDATOR_RAY_RANGE_BYTES`` (bytes of A's and
    B's shards; ``0``: never split), else :data:`RANGE_BYTES`."""
    text = os.environ.get(RANGE_BYTES_ENV, "").strip()
    if not text:
        return RANGE_BYTES
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise InputError(f"{RANGE_BYTES_ENV}={text!r}: use a number of bytes (0: never split a pair)")
    return value or None
