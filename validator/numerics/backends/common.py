"""What every backend shares: the totals a pass produces, the dtypes with ULP metrics, and the float32 band
around the tolerances.

A backend reads both tensors once and returns :class:`Totals`: five float64 sums, ``max_abs``, five
counts and the largest ULP distance. ``validator.numerics.metrics`` turns them into a ``TensorMetrics``
with the formulas of ``docs/metrics.md``, the same code for every backend (the p99 of the ULP distances,
asked for, is not part of a pass: ``validator.numerics.p99``).
"""

from __future__ import annotations

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
# and SAFE_HI lose nothing to float32's range. A float32 test is off by at most four roundings of 2**-24 (|d|,
# rtol and atol as float32, the multiply-add: float64's own rounding is far below), and TINY covers the absolute
# errors of float32's subnormals: EPS is four times that. Each element inside the band costs its row a float64 count
# (a pair of two formats has a few in ten million: benchmarks/cuda_marks.py), so the band is kept narrow.
EPS = 2.0**-20
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
