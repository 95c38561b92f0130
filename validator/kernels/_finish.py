"""Turning a kernel's totals into :class:`~validator.metrics.TensorMetrics`.

The derived metrics (norms, rel_l2, cosine, SQNR, rel_diff, ...) are computed by the reference's own
code (``metrics._Accumulator.finish``), fed with the totals a kernel produced, so a fast path can
differ from the reference only in the float64 order of summation, never in a formula.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from .. import metrics as _ref

__all__ = ["FINE_BINS", "ULP_DTYPES", "metrics_from_totals", "nearest_rank", "first_reaching"]

FINE_BINS = _ref._FINE_BINS  # exact bins 0..FINE_BINS-1, then one overflow bin
ULP_DTYPES = frozenset(_ref._ULP_DTYPES)


def nearest_rank(n: int) -> int:
    return _ref._nearest_rank(n)


def first_reaching(hist: torch.Tensor, rank: int) -> int:
    """Smallest bin index whose cumulative count reaches ``rank`` (``hist``: int64, on CPU)."""
    return _ref._first_reaching(hist, rank)


def metrics_from_totals(
    a: torch.Tensor,
    b: torch.Tensor,
    atol: float,
    rtol: float,
    sums: Sequence[float],
    max_abs: float,
    counts: Sequence[int],
    ulp: tuple[int, int] | None,
) -> _ref.TensorMetrics:
    """``sums``: a², b², ab, d², |d|; ``counts``: finite in both, passed, non-finite in a, in b, mismatches;
    ``ulp``: (max_ulp, p99_ulp) or ``None`` when ULP metrics do not apply."""
    acc = _ref._Accumulator(torch.device("cpu"), atol, rtol, 1, False, False)
    acc.sums = torch.tensor([float(s) for s in sums], dtype=torch.float64)
    acc.max_abs = torch.tensor(float(max_abs), dtype=torch.float64)
    acc.counts = torch.tensor([int(c) for c in counts], dtype=torch.int64)
    m = acc.finish(a, b, None)
    if ulp is None:
        return m
    return dataclasses.replace(m, max_ulp=int(ulp[0]), p99_ulp=int(ulp[1]))
