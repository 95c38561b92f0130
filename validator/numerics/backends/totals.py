"""What a pass over a pair produces (:class:`Totals`) and how a pair's blocks meet a range of it: plain data,
shared by every backend and read without torch (``small.py`` runs where torch was never imported)."""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Totals", "blocks_meeting"]


@dataclass(frozen=True)
class Totals:
    """One pass over a pair. ``sums``: a², b², d², |d|, a·d over the positions finite in both
    (d = b - a); ``counts``: finite in both, passed, non-finite in a, in b, mismatched;
    ``max_ulp``: the largest ULP distance over those positions, ``None`` without ULP metrics;
    ``block_d2``, ``block_a2``: d² and a² summed over each block of the ``edges`` the pass was given;
    ``nonfinite``: NaN in a, NaN in b, and positions holding the same infinity on both sides."""

    numel: int
    sums: tuple[float, float, float, float, float]
    max_abs: float
    counts: tuple[int, int, int, int, int]
    max_ulp: int | None
    block_d2: tuple[float, ...] = ()
    block_a2: tuple[float, ...] = ()
    nonfinite: tuple[int, int, int] = (0, 0, 0)


def blocks_meeting(edges: Sequence[int], start: int, stop: int) -> list[tuple[int, int, int]]:
    """(block, lo, hi) of each block of ``edges`` (element offsets, 0 first, numel last) that meets
    elements ``start .. stop``, lo and hi relative to ``start``."""
    first = max(0, bisect.bisect_right(edges, start) - 1)
    last = min(len(edges) - 1, bisect.bisect_left(edges, stop))
    spans = [(j, max(edges[j], start) - start, min(edges[j + 1], stop) - start) for j in range(first, last)]
    return [s for s in spans if s[2] > s[1]]
