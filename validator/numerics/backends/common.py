"""What every backend shares: the totals a pass produces, the ULP distance and the exact p99.

A backend reads both tensors once and returns :class:`Totals`: five float64 sums, ``max_abs``, five
counts and the ULP results. ``validator.numerics.metrics`` turns them into a ``TensorMetrics`` with the formulas
of ``docs/metrics.md``, the same code for every backend.

The p99 of the ULP distances is exact. A pass bins each distance ``d`` by ``ulp_key(d)``: the exponent
of ``d + 1`` and its :data:`KEY_BITS` leading fraction bits (distances up to ``2**(KEY_BITS + 1) - 2``
get a bin each, larger ones share a bin with their neighbours). :func:`p99_from_keys` finds the bin
that holds the nearest rank; if that bin holds more than one distance, further passes count the
distances inside it (``refine``) until one value is left.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

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
KEY_BITS = 2  # fraction bits of d + 1 kept in a bin's key
NUM_KEYS = 32 << KEY_BITS  # keys of every distance below 2**32 (float32's largest is 2**32 - 2)


@dataclass(frozen=True)
class Totals:
    """One pass over a pair. ``sums``: a², b², d², |d|, a·d over the positions finite in both
    (d = b - a); ``counts``: finite in both, passed, non-finite in a, in b, mismatched;
    ``ulp``: (max, p99) of the ULP distances (p99 ``None`` if not asked for), ``None`` without ULP metrics;
    ``block_d2``, ``block_a2``: d² and a² summed over each block of the ``edges`` the pass was given."""

    numel: int
    sums: tuple[float, float, float, float, float]
    max_abs: float
    counts: tuple[int, int, int, int, int]
    ulp: tuple[int, int | None] | None
    block_d2: tuple[float, ...] = ()
    block_a2: tuple[float, ...] = ()


def pieces_of(edges: Sequence[int], start: int, stop: int) -> list[tuple[int, int, int]]:
    """(block, lo, hi) of each block of ``edges`` (element offsets, 0 first, numel last) that meets
    elements ``start .. stop``, lo and hi relative to ``start``."""
    first = max(0, bisect.bisect_right(edges, start) - 1)
    last = min(len(edges) - 1, bisect.bisect_left(edges, stop))
    spans = [(j, max(edges[j], start) - start, min(edges[j + 1], stop) - start) for j in range(first, last)]
    return [s for s in spans if s[2] > s[1]]


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


def ulp_key(dist: torch.Tensor) -> torch.Tensor:
    """The bin of each distance: exponent and KEY_BITS leading fraction bits of ``dist + 1``, read
    from its float32 (int32 distances, below 2**17) or float64 (int64) bits, both exact."""
    if dist.dtype == torch.int32:
        bits = (dist + 1).to(torch.float32).view(torch.int32)
        return (bits >> (23 - KEY_BITS)) - (127 << KEY_BITS)
    bits = (dist + 1).to(torch.float64).view(torch.int64)
    return (bits >> (52 - KEY_BITS)) - (1023 << KEY_BITS)


def key_range(key: int) -> tuple[int, int]:
    """(lo, width): the distances ``lo <= d < lo + width`` that share bin ``key``."""
    exp, frac = key >> KEY_BITS, key & ((1 << KEY_BITS) - 1)
    if exp <= KEY_BITS:  # every d + 1 below 2**(KEY_BITS + 1) has a bin of its own
        return (1 << exp) + (frac >> (KEY_BITS - exp)) - 1, 1
    return (1 << exp) + (frac << (exp - KEY_BITS)) - 1, 1 << (exp - KEY_BITS)


def nearest_rank(n: int) -> int:
    """1-based rank of the 99th percentile: ceil(0.99 n), in exact integer arithmetic."""
    return (99 * n + 99) // 100


def _first_reaching(hist: list[int], rank: int) -> tuple[int, int]:
    """(bin, count before it) of the first bin whose cumulative count reaches ``rank``."""
    before = 0
    for i, c in enumerate(hist):
        if before + c >= rank:
            return i, before
        before += c
    raise AssertionError("rank beyond the histogram")


# refine(lo, shift, bins) -> counts of (d - lo) >> shift for the distances lo <= d < lo + (bins << shift)
Refine = Callable[[int, int, int], list[int]]


def p99_from_keys(hist: list[int], n: int, refine: Refine, max_bins: int) -> int:
    """Exact nearest-rank p99 of ``n`` distances from their key histogram, refining as needed."""
    if n == 0:
        return 0
    key, before = _first_reaching(hist, nearest_rank(n))
    lo, width = key_range(key)
    rank = nearest_rank(n) - before
    while width > 1:  # widths and max_bins are powers of two
        shift = max(0, width.bit_length() - max_bins.bit_length())
        j, below = _first_reaching(refine(lo, shift, width >> shift), rank)
        lo, width, rank = lo + (j << shift), 1 << shift, rank - below
    return lo
