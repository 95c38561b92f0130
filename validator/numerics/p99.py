"""The exact p99 of the ULP distances of a pair, on request (``compare_tensors(a, b, p99=True)``).

It is not part of a backend's pass: no verdict reads it, and an exact percentile needs a second read of the
pair wherever the distances spread. :func:`p99_ulp` computes it in plain torch on the pair's device: a
histogram of every distance, exact for the 8- and 16-bit formats in one read; for float32, whose distances
reach 2**32, a histogram of the high 16 bits and then one of the low 16 bits inside the bin that holds the
rank.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch


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
