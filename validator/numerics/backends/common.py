"""What every backend shares: the totals a pass produces, the ULP distance, and the exact p99 on request.

A backend reads both tensors once and returns :class:`Totals`: five float64 sums, ``max_abs``, five
counts and the largest ULP distance. ``validator.numerics.metrics`` turns them into a ``TensorMetrics``
with the formulas of ``docs/metrics.md``, the same code for every backend.

The p99 of the ULP distances is not part of a pass: no verdict reads it, and an exact percentile needs a
second read of the pair wherever the distances spread. :func:`p99_ulp` computes it when asked for (plain
torch on the pair's device): a histogram of every distance, exact for the 8- and 16-bit formats in one
read; for float32, whose distances reach 2**32, a histogram of the high 16 bits and then one of the low
16 bits inside the bin that holds the rank.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch

from validator.numerics.backends.totals import Totals as Totals  # (re-exported: the backends import it from here)
from validator.numerics.backends.totals import blocks_meeting as blocks_meeting

# dtype -> (same-width signed integer dtype, mask of the non-sign bits); the dtypes with ULP metrics
ULP_DTYPES: dict[torch.dtype, tuple[torch.dtype, int]] = {
    torch.bfloat16: (torch.int16, 0x7FFF),
    torch.float16: (torch.int16, 0x7FFF),
    torch.float32: (torch.int32, 0x7FFFFFFF),
    torch.float8_e4m3fn: (torch.int8, 0x7F),
    torch.float8_e5m2: (torch.int8, 0x7F),
}
FLOAT_DTYPES = frozenset(ULP_DTYPES) | {torch.float64}
# Float32 arithmetic where float64 decides: a tolerance test counted against tolerances moved EPS
# (relative) and TINY (absolute) down and up brackets float64's count; sums of squares between SAFE_LO
# and SAFE_HI lose nothing to float32's range.
EPS = 2.0**-18
TINY = 2.0**-146
SAFE_LO, SAFE_HI = 2.0**-100, 2.0**100
# significand bits (with the implicit one) of the 8- and 16-bit float dtypes: see exact_ulp
SIGNIFICAND = {torch.bfloat16: 8, torch.float16: 11, torch.float8_e4m3fn: 4, torch.float8_e5m2: 3}


def tolerances(atol: float, rtol: float) -> tuple[list[float], bool]:
    """atol, rtol and the float32 band around them (atol and rtol moved EPS down, then up, atol by TINY more),
    and whether a float32 pass may count the tolerance test with the band (else it counts it in float64)."""
    lo, hi = 1 - EPS, 1 + EPS
    band = 0 <= rtol <= 2.0**20 and 0 <= atol <= SAFE_HI
    return [atol, rtol, atol * lo - TINY, rtol * lo, atol * hi + TINY, rtol * hi], band


def ulp_spec(dtype_a: torch.dtype, dtype_b: torch.dtype) -> tuple[torch.dtype, int] | None:
    """ULP_DTYPES' entry of a pair with ULP metrics (one dtype, one of ULP_DTYPES), else None."""
    return ULP_DTYPES.get(dtype_a) if dtype_a == dtype_b else None


def exact_ulp(dtype: torch.dtype) -> int:
    """Largest ULP distance at which the float32 difference of two finite ``dtype`` values is exact (-1:
    none). With p significand bits, b - a needs at most p + 1 + (exponent gap) bits, so it fits float32's
    24 when the gap is at most 23 - p binades; a larger gap puts at least (23 - p) * 2**(p - 1) + 1 values
    of the format between them (subnormals included). A pass whose distances stay within it has its
    largest float32 |d| exact, with no second read."""
    p = SIGNIFICAND.get(dtype)
    return -1 if p is None else (23 - p) << (p - 1)


def ulp_distance(ca: torch.Tensor, cb: torch.Tensor, spec: tuple[torch.dtype, int]) -> torch.Tensor:
    """|ord(a) - ord(b)|, int32 (int64 for float32); ord maps each bit pattern onto a monotonic
    integer line: ``s`` if the sign bit is clear, else ``-(s & mask)`` (-0.0 and +0.0 both 0)."""
    int_dtype, mask = spec
    wide = torch.int64 if int_dtype == torch.int32 else torch.int32

    def ordinal(x: torch.Tensor) -> torch.Tensor:  # fits the storage width: computed there
        s = x.view(int_dtype)
        neg = s >> (8 * s.element_size() - 1)  # -1 where the sign bit is set, else 0
        return (s ^ (neg & mask)) - neg  # == -(s & mask) where negative: no select needed

    return (ordinal(ca).to(wide) - ordinal(cb)).abs_()


def _at_rank(hist: torch.Tensor, rank: int) -> tuple[int, int]:
    """(bin, count before it) of the first bin whose cumulative count reaches ``rank`` (1-based)."""
    cum = hist.cumsum(0)
    i = int(torch.searchsorted(cum, torch.tensor([rank], dtype=cum.dtype, device=cum.device))[0])
    return i, int(cum[i - 1]) if i else 0


def p99_ulp(pieces: Callable[[], Iterator[tuple[torch.Tensor, torch.Tensor]]], spec: tuple[torch.dtype, int]) -> int:
    """Exact nearest-rank p99 of the ULP distances over the positions finite in both, of the pair that
    ``pieces()`` yields (matching flat pieces, read once for 8- and 16-bit formats, twice for float32); 0
    where no position is finite in both."""

    def distances() -> Iterator[torch.Tensor]:
        for ca, cb in pieces():
            both = torch.isfinite(ca.to(torch.float32)) & torch.isfinite(cb.to(torch.float32))
            yield ulp_distance(ca, cb, spec)[both]

    wide = spec[0] == torch.int32  # float32: distances up to 2**32 - 2, in two rounds of 16 bits
    hist: torch.Tensor | None = None
    for dist in distances():
        got = torch.bincount(dist >> 16 if wide else dist, minlength=1 << 16)
        hist = got if hist is None else hist + got
    n = 0 if hist is None else int(hist.sum())
    if n == 0:
        return 0
    assert hist is not None
    rank = (99 * n + 99) // 100  # 1-based rank of the 99th percentile: ceil(0.99 n), in exact integer arithmetic
    top, before = _at_rank(hist, rank)
    if not wide:
        return top
    low: torch.Tensor | None = None
    for dist in distances():
        got = torch.bincount(dist[(dist >> 16) == top] & 0xFFFF, minlength=1 << 16)
        low = got if low is None else low + got
    assert low is not None
    return (top << 16) + _at_rank(low, rank - before)[0]
