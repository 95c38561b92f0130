"""Planning a comparison's tasks, with no Ray: which pairs go together, where a huge pair is cut into element
ranges, and how much memory each task reserves (docs/ray.md)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from validator.errors import InputError
from validator.runs.reassembly import LogicalTensor
from validator.runs.tensorfile import ITEMSIZES
from validator.settings import RANGE_BYTES

if TYPE_CHECKING:
    from validator.judging.compare import PairToMeasure

__all__ = [
    "BATCH_BYTES", "BATCH_PAIRS", "RANGE_BYTES", "Job", "itemsize", "outer_row", "pair_memory", "plan_batches", "plan_jobs", "plan_ranges",
    "range_memory", "rounding_dtype", "splittable", "tensor_memory",
]

BATCH_BYTES = 256 << 20  # pairs are packed into one task until their tensors hold this many bytes...
BATCH_PAIRS = 256  # ...or this many pairs


def itemsize(dtype: str) -> int:
    return ITEMSIZES.get(dtype, 8)


def tensor_memory(t: LogicalTensor) -> int:
    """Bytes held while ``t.materialize()`` runs and its result lives: a split tensor holds its pieces and
    their concatenation; a partial sum two float64 tensors and one piece; copies being checked against
    each other one more copy and a float64 difference."""
    numel = math.prod(t.shape())
    size = numel * itemsize(t.dtype)
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


def plan_batches(pairs: list[PairToMeasure], *, batch_bytes: int = BATCH_BYTES, batch_pairs: int = BATCH_PAIRS) -> list[list[int]]:
    """Indices of ``pairs`` grouped into tasks, in order: consecutive pairs until ``batch_bytes`` of
    tensor bytes or ``batch_pairs`` pairs; a pair larger than ``batch_bytes`` is a task of its own."""
    out: list[list[int]] = []
    cur: list[int] = []
    cur_bytes = 0
    for i, p in enumerate(pairs):
        size = sum(r.nbytes for r in p.a.shards) + sum(r.nbytes for r in p.b.shards)
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



def assembled_dtype(t: LogicalTensor) -> str:
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
        return torch_dtype(assembled_dtype(la)) in FLOAT_DTYPES and torch_dtype(assembled_dtype(lb)) in FLOAT_DTYPES
    except (InputError, KeyError, ValueError):
        return False


def outer_row(t: LogicalTensor) -> int:
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
        frac = min(1.0, (n + 2 * outer_row(t)) / numel)
        total += int(tensor_memory(t) * frac)
    extra = n * 8 if rounding else 0
    return total + extra + 2 * n * 8 + (16 << 20)  # the float64 NaN count pieces, at most



@dataclass
class Job:
    """One task: a batch of pairs (``span`` None), or elements ``span`` of one pair (``last``: its last range)."""

    pairs: list[int]
    span: tuple[int, int] | None
    last: bool
    memory: int


def rounding_dtype(la: LogicalTensor, lb: LogicalTensor, rounding: bool) -> str | None:
    """The dtype the reference is rounded to for its rounding floor, as ``compare._measure_batch`` decides it."""
    from validator.numerics.floors import more_precise

    return lb.dtype if rounding and more_precise(la.dtype, lb.dtype) else None



def plan_jobs(
    pairs: list[PairToMeasure], *, batch_bytes: int, batch_pairs: int = BATCH_PAIRS, range_bytes: int | None = RANGE_BYTES
) -> list[Job]:
    """The tasks, in the pairs' order: batches of consecutive pairs (:func:`plan_batches`), and for each pair
    above ``range_bytes`` that can be split, its ranges (:func:`plan_ranges`), a task each."""
    jobs: list[Job] = []
    run: list[int] = []

    def flush() -> None:
        for batch in plan_batches([pairs[i] for i in run], batch_bytes=batch_bytes, batch_pairs=batch_pairs):
            idx = [run[k] for k in batch]
            jobs.append(Job(idx, None, False, max(pair_memory(*pairs[i]) for i in idx)))
        run.clear()

    for i, p in enumerate(pairs):
        la, lb = p.a, p.b
        spans: list[tuple[int, int]] = []
        size = sum(x.nbytes for x in la.shards) + sum(x.nbytes for x in lb.shards)
        if range_bytes is not None and size > range_bytes and splittable(la, lb):
            spans = plan_ranges(la.shape(), itemsize(la.dtype) + itemsize(lb.dtype), range_bytes)
        if len(spans) <= 1:
            run.append(i)
            continue
        flush()
        for k, (lo, hi) in enumerate(spans):
            jobs.append(Job([i], (lo, hi), k == len(spans) - 1, range_memory(la, lb, p.rounding_floor, lo, hi)))
    flush()
    return jobs
