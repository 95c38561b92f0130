"""Reading a stored tensor where a Ray worker runs: tensors that pickle to metadata only (:func:`portable`),
and elements ``start .. stop`` of a logical tensor assembled from only those bytes of its stored pieces
(:func:`assemble_range`, docs/ray.md "Splitting huge tensors"), with its replica checks over the range."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from validator.errors import InputError
from validator.runs.reassembly import LogicalTensor, replica_note
from validator.runs.view import TensorRef
from validator.store.blob_read import open_blob_range, open_blob_tensor, open_file_range, open_file_tensor

__all__ = ["Check", "assemble_range", "portable", "read_range", "replica_checks", "replica_notes"]


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



def replica_checks(t: LogicalTensor) -> list[tuple[TensorRef, TensorRef]]:
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


def read_range(r: TensorRef, blob_url: str | None, lo: int, hi: int) -> Any:
    """Elements ``lo .. hi`` of one stored tensor, reading only their bytes (1-D)."""
    if r.location is not None:
        path, offset = r.location
        return open_file_range(str(path), offset, r.dtype, lo, hi)
    if r.sha256 is not None and blob_url is not None:
        return open_blob_range(blob_url, r.sha256, r.dtype, r.nbytes, lo, hi)
    raise InputError(f"{r.origin}: tensor {r.name!r} cannot be read in ranges by Ray workers")


# a replica check over a range: (bitwise equal there, the largest finite |difference| there or None)
Check = tuple[bool, float | None]


def check_range(first: Any, other: Any) -> Check:
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
    the replica checks over what was read (aligned with :func:`replica_checks`, None where not read)."""
    import torch

    checks_of = replica_checks(t)
    found: list[Check | None] = [None] * len(checks_of)

    def check(ref0: TensorRef, first: Any, lo: int, hi: int) -> None:
        for k, (c0, r) in enumerate(checks_of):
            if c0 is ref0:
                if r.sha256 is not None and r.sha256 == ref0.sha256:
                    got: Check = (True, None)
                else:
                    got = check_range(first, read_range(r, blob_url, lo, hi))
                found[k] = got

    kind = t.kind
    if kind in ("full", "replicated"):
        first = read_range(t.shards[0], blob_url, start, stop)
        check(t.shards[0], first, start, stop)
        return first, found
    if kind == "partial":
        ordered = sorted(t.shards, key=lambda r: r.shard.index)
        if len(ordered) == 1:
            return read_range(ordered[0], blob_url, start, stop), found
        total = read_range(ordered[0], blob_url, start, stop).to(torch.float64)
        for r in ordered[1:]:
            total = total + read_range(r, blob_url, start, stop).to(torch.float64)
        return total, found
    pieces = t.split_pieces()
    dim = t.shards[0].shard.dim or 0
    if dim == 0:  # each piece is a run of the logical tensor's elements
        parts, offset = [], 0
        for ref in pieces:
            n = math.prod(ref.shape)
            lo, hi = max(start, offset), min(stop, offset + n)
            if hi > lo:
                x = read_range(ref, blob_url, lo - offset, hi - offset)
                check(ref, x, lo - offset, hi - offset)
                parts.append(x)
            offset += n
        return (torch.cat(parts) if len(parts) > 1 else parts[0]), found
    width = math.prod(t.shape()[dim:])  # elements of one logical row of the dims from `dim` on
    o0, o1 = start // width, -(-stop // width)
    rows = []
    for ref in pieces:
        w = math.prod(ref.shape[dim:])
        x = read_range(ref, blob_url, o0 * w, o1 * w)
        check(ref, x, o0 * w, o1 * w)
        rows.append(x.view(o1 - o0, w))
    flat = torch.cat(rows, dim=1).reshape(-1)
    return flat[start - o0 * width : stop - o0 * width].clone(), found


def replica_notes(t: LogicalTensor, found: list[list[Check | None]]) -> list[str]:
    """``t.notes`` as ``t.materialize()`` leaves them, from the replica checks of all its ranges."""
    notes = list(t.notes)
    for k, (ref0, r) in enumerate(replica_checks(t)):
        got = [c for c in (f[k] for f in found) if c is not None]
        if all(eq for eq, _ in got):
            continue
        worsts = [w for _, w in got if w is not None]
        worst = max(worsts) if worsts else float("nan")
        notes.append(replica_note(ref0, r, worst))
    return notes

