"""A pair measured in ranges, merged into the bits of the whole pair measured at once.

A pair too large for one machine's memory (or one task's) is cut into element ranges (row-major); each
range is read and measured on its own (:func:`measure_range`), and :func:`merge` adds the ranges' partials
in the engine's own order, giving the ``TensorMetrics`` and ``BlockSums`` that ``floors.measure_blocks``
gives for the whole pair, bit for bit (validator.executors measures huge pairs this way).

Why it is exact: the CPU engine (``backends.cpu``) writes one row of float64 partials (a², b², d², |d|, a·d)
per at most :data:`ROW` elements, rows laid from each row-block edge, and adds the rows of the whole pair in
one chain (``small.chain``, the code the passes add their rows with). A range that starts where one of the whole pair's rows starts (:func:`is_cut`) has exactly those
rows; :func:`measure_range` returns them, not their sum, and :func:`merge` runs the chain over all the
ranges' rows as the whole pass does (and rebuilds the block sums from them, so a cut may fall inside a row
block). Counts are integers (they add), the largest |d| and ULP distance are exact per range (the
largest is the pair's).

Only pairs the CPU engine measures are cut (float dtypes on the CPU); the whole pair must be contiguous in
the single-process comparison (assembled tensors are), as a non-contiguous pair is added in chunks.
NaN and matched-infinity counts (``BlockSums``) are counted per range and added. The rounding floor of a
range is :func:`measure_range` of the reference's range against itself rounded (:func:`rounding_range`).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from validator.numerics.backends import backend_for
from validator.numerics.backends.common import FLOAT_DTYPES, Totals
from validator.numerics.backends.cpu import cpu_range_rows, row_plan
from validator.numerics.backends.small import ROW, block_sums, chain
from validator.numerics.floors import BlockSums, _edges, _rows
from validator.numerics.metrics import MetricInputError, TensorMetrics, metrics_from_totals

__all__ = [
    "ROW", "RangePartials", "is_cut", "measure_range", "merge", "merge_totals", "rangeable", "rounding_range",
]

ATOL, RTOL = 1e-5, 1e-3  # the tolerances floors.measure_blocks measures with (metrics.measure's defaults)


@dataclass(frozen=True)
class RangePartials:
    """Elements ``start .. stop`` of a pair of ``shape`` measured, nothing added across rows yet: ``rows``
    (float64 ``[rows, 5]``: a², b², d², |d|, a·d), ``counts`` (finite in both, passed, non-finite in a, in b,
    mismatched), the exact largest |d|, the largest ULP distance (None: no ULP metrics for these dtypes),
    and NaN in a, in b, and positions with the same infinity on both sides.
    About 40 bytes per ROW elements."""

    shape: tuple[int, ...]
    start: int
    stop: int
    dtype_a: torch.dtype
    dtype_b: torch.dtype
    rows: np.ndarray
    counts: tuple[int, int, int, int, int]
    max_abs: float
    max_ulp: int | None
    nan_a: int = 0
    nan_b: int = 0
    inf_matched: int = 0


def rangeable(dtype_a: torch.dtype, dtype_b: torch.dtype) -> bool:
    """Whether a pair of these dtypes (on the CPU) can be measured in ranges: the CPU engine's float dtypes."""
    return dtype_a in FLOAT_DTYPES and dtype_b in FLOAT_DTYPES


def is_cut(shape: Sequence[int], at: int) -> bool:
    """Whether a range of a pair of ``shape`` may start (or end) at element ``at``: 0, the end, or the first
    element of one of the rows of partials the whole pass lays (a row-block edge plus a multiple of ROW)."""
    edges = _edges(tuple(shape))
    if at == edges[-1] or at == 0:
        return True
    if not 0 < at < edges[-1]:
        return False
    j = bisect.bisect_right(edges, at) - 1
    return (at - edges[j]) % ROW == 0


def measure_range(a: torch.Tensor, b: torch.Tensor, shape: Sequence[int], start: int) -> RangePartials:
    """Elements ``start .. start + n`` of a pair of ``shape`` (``a`` and ``b``: those ``n`` elements of each
    side, in row-major order, any shape), measured as the whole pair's pass measures them. Both ends must
    be cuts (:func:`is_cut`); the dtypes :func:`rangeable`, the tensors on the CPU."""
    shape = tuple(int(s) for s in shape)
    n = a.numel()
    if b.numel() != n:
        raise MetricInputError(f"a range of A has {n} elements, of B {b.numel()}")
    if not rangeable(a.dtype, b.dtype) or backend_for(a, b) != "cpu":
        raise MetricInputError(f"a pair of {a.dtype} and {b.dtype} on {a.device} is not measured in ranges (CPU float dtypes only)")
    stop = start + n
    if not (is_cut(shape, start) and is_cut(shape, stop)) or n == 0:
        raise MetricInputError(f"elements {start}..{stop} of a tensor of shape {list(shape)} are not a range of whole rows")
    with torch.no_grad():
        a, b = a.detach().reshape(-1), b.detach().reshape(-1)
        rows, counts, max_abs, max_ulp, (nan_a, nan_b, inf_matched) = cpu_range_rows(a, b, atol=ATOL, rtol=RTOL, edges=_edges(shape), start=start)
    return RangePartials(
        shape, start, stop, a.dtype, b.dtype, rows, tuple(int(c) for c in counts), max_abs, max_ulp,  # type: ignore[arg-type]
        nan_a, nan_b, inf_matched,
    )  # fmt: skip


def rounding_range(a: torch.Tensor, dtype: str, shape: Sequence[int], start: int) -> RangePartials:
    """The range of the reference's rounding floor (``floors.rounding_sums``): ``a`` against ``a`` rounded to ``dtype``."""
    with torch.no_grad():
        return measure_range(a, a.detach().to(getattr(torch, dtype)), shape, start)


def _check_cover(parts: Sequence[RangePartials]) -> tuple[tuple[int, ...], int]:
    if not parts:
        raise ValueError("no ranges to merge")
    shape = parts[0].shape
    numel = math.prod(shape)
    at = 0
    for p in parts:
        if p.shape != shape or p.start != at or (p.dtype_a, p.dtype_b) != (parts[0].dtype_a, parts[0].dtype_b):
            raise ValueError(f"ranges do not follow each other over one pair: {p.start}..{p.stop} after {at}")
        at = p.stop
    if at != numel:
        raise ValueError(f"ranges end at element {at} of {numel}")
    return shape, numel


def merge_totals(parts: Sequence[RangePartials]) -> Totals:
    """The ``Totals`` of the whole pair (``backends.totals_of`` with the pair's row-block edges) from all its
    ranges, in order."""
    shape, numel = _check_cover(parts)
    edges = _edges(shape)
    _, owner = row_plan(edges, numel)
    rows = np.concatenate([p.rows for p in parts])
    sums, blocks = chain(rows, np.array([0, len(rows)]))[0], block_sums(rows, owner, len(edges) - 1)
    counts = np.array([p.counts for p in parts], np.int64).sum(0)
    max_abs = max(p.max_abs for p in parts)
    max_ulp = None if parts[0].max_ulp is None else max(p.max_ulp or 0 for p in parts)
    nonfinite = tuple(sum(getattr(p, k) for p in parts) for k in ("nan_a", "nan_b", "inf_matched"))
    block_d2, block_a2 = map(tuple, blocks.tolist())
    return Totals(numel, tuple(sums.tolist()), max_abs, tuple(counts.tolist()), max_ulp, block_d2, block_a2, nonfinite)


def merge(parts: Sequence[RangePartials]) -> tuple[TensorMetrics, BlockSums]:
    """``floors.measure_blocks`` of the whole pair, bit for bit, from all its ranges in order."""
    totals = merge_totals(parts)
    shape = parts[0].shape
    m = metrics_from_totals(totals, parts[0].dtype_a, parts[0].dtype_b, ATOL, RTOL)
    nan_a, nan_b, inf_matched = totals.nonfinite
    return m, BlockSums(np.array(totals.block_d2), np.array(totals.block_a2), _rows(shape), nan_a, nan_b, inf_matched)
