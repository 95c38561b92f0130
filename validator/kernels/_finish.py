"""Turning a kernel's totals into :class:`~validator.metrics.TensorMetrics`.

The derived metrics (norms, rel_l2, cosine, SQNR, rel_diff, ...) are computed by the reference's own
code (``metrics._Accumulator.finish``), fed with the totals a kernel produced, so a fast path can
differ from the reference only in the float64 order of summation, never in a formula.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from .. import metrics as _ref

__all__ = [
    "FINE_BINS",
    "ULP_DTYPES",
    "SAMPLE_STRIDE",
    "WINDOW_MAX_BINS",
    "metrics_from_totals",
    "nearest_rank",
    "first_reaching",
    "p99_window",
    "window_ranks",
    "p99_in_window",
]

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
    return _ref.metrics_from_totals(a.numel(), a.dtype, b.dtype, atol, rtol, sums, max_abs, counts, ulp)


# ---------------------------------------------------------------- speculative p99 window
#
# An exact p99 needs the rank-k distance, and an exact histogram of every distance costs more than
# all the arithmetic together. The fast paths therefore first histogram a small strided sample of
# the pair (SAMPLE_STRIDE: about 1 element in 64), take from it a window [lo, hi) that holds the
# p99 with near certainty, and then, in the one full pass, count exactly the distances below ``lo``
# and histogram exactly only those inside the window. If the p99's rank falls inside the window
# (the rank minus the count below lands in the window's histogram), the p99 is exact. If not (a
# sample that does not look like the whole), the caller runs the full-histogram method: the result
# is always exact, only the time differs. docs/performance.md, "The exact p99".

SAMPLE_STRIDE = 64
WINDOW_MIN_SAMPLE = 1 << 14  # fewer sampled distances: no window (the full histograms are cheap then)
WINDOW_MAX_BINS = 1 << 20  # wider windows (float32 with a spread-out tail): the full method
_WINDOW_MIN_DELTA = 2e-4  # the window spans at least the ranks 0.99 -+ this
_WINDOW_SIGMAS = 6.0


def window_ranks(n_sample: int) -> tuple[int, int] | None:
    """The 1-based sample ranks ``(r_lo, r_hi)`` whose distances bound the window (``p99_window``), or
    ``None`` when the sample is too small or the upper rank lies past the sample's top."""
    if n_sample < WINDOW_MIN_SAMPLE:
        return None
    delta = max(_WINDOW_MIN_DELTA, _WINDOW_SIGMAS * math.sqrt(0.99 * 0.01 / n_sample))
    r_lo = math.floor((0.99 - delta) * n_sample)
    r_hi = math.ceil((0.99 + delta) * n_sample)
    if r_hi > n_sample:
        return None
    return r_lo, r_hi


def p99_window(
    fine: torch.Tensor, coarse: torch.Tensor | None, n_sample: int, bins: int | None = None
) -> tuple[int, int] | None:
    """The window ``[lo, hi)`` of ULP distances that should hold the p99, from a sample's histograms.

    ``fine``: int64 counts of distances 0..FINE_BINS-1 and, in its last bin, of every larger one;
    ``coarse``: int64 counts of ``distance >> 16`` (float32), else ``None``; ``n_sample``: the number
    of sampled distances; ``bins``: how many leading bins of ``fine`` may be nonzero (all the others, its
    overflow bin included, are zero), so that only those are summed; default: all. The window spans
    the sample's quantiles ``0.99 -+ delta``, with ``delta``
    the larger of 2e-4 and six standard errors of a sample quantile, ``sqrt(0.99 * 0.01 / n)``: ``lo``
    is the sampled distance of rank ``floor((0.99 - delta) n)`` and ``hi - 1`` that of rank
    ``ceil((0.99 + delta) n)``; beyond the fine range, the edges of their ``>> 16`` buckets.
    Returns ``None`` when the sample is too small, the upper rank lies past the sample's top, or the
    window is wider than ``WINDOW_MAX_BINS``.
    """
    ranks = window_ranks(n_sample)
    if ranks is None:
        return None
    r_lo, r_hi = ranks
    cum = (fine if bins is None else fine[:bins]).to(torch.int64).cumsum(0)

    def value_at(rank: int, upper: bool) -> int | None:
        if rank < 1:
            return 0
        idx = int(torch.searchsorted(cum, torch.tensor([rank], dtype=torch.int64)).item())
        if idx < min(FINE_BINS, cum.numel()):
            return idx
        if coarse is None or cum.numel() <= FINE_BINS:  # narrow dtypes never reach the overflow bin
            return None
        rank_beyond = rank - int(cum[FINE_BINS - 1])
        bucket = first_reaching(coarse.to(torch.int64)[1:], rank_beyond) + 1  # bucket 0 lies below 2**16
        return (bucket + 1) << 16 if upper else bucket << 16

    lo, top = value_at(r_lo, upper=False), value_at(r_hi, upper=True)
    if lo is None or top is None or top + 1 - lo > WINDOW_MAX_BINS:
        return None
    return lo, top + 1


def p99_in_window(n: int, below: int, window: torch.Tensor, lo: int) -> int | None:
    """The exact p99 of ``n`` distances from the count ``below`` the window and the window's exact
    histogram (int64, bin ``i`` = distance ``lo + i``); ``None`` when the rank is outside the window."""
    rank = nearest_rank(n)
    inside = rank - below
    if n == 0 or inside < 1 or inside > int(window.sum()):
        return None
    return lo + first_reaching(window.to(torch.int64), inside)
