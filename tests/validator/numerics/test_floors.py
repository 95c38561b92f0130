"""The parametric intervals of many requests at once (``floors.judged_intervals``), held to the formula written
out one request at a time in plain Python and NumPy, bit for bit."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.special import chdtri, fdtri, stdtrit

from validator.numerics.floors import BlockSums, judged_intervals, judged_intervals_at


def _reference(cand: BlockSums, floor: BlockSums | None, elements: int, level: float) -> tuple[float, float] | None:
    """The envelope of the log-scale t interval and the F (chi-square) interval of one request, as
    ``judged_intervals`` documents it: its sums as NumPy sums a 1-D array, its sum of fourth powers by ``np.dot``."""
    sides = [cand] if floor is None else [cand, floor]
    totals = [(float(s.d2.sum()), float(s.a2.sum())) for s in sides]
    if not all(0 < x < math.inf for t in totals for x in t):
        return None
    log_r2 = math.log(totals[0][0] / totals[0][1])
    if floor is not None:
        log_r2 -= math.log(totals[1][0] / totals[1][1])
    n = max(1, int(elements))
    tail = (1.0 - level) / 2.0
    if floor is None:
        lo, hi = log_r2 + math.log(n / _chi2(n, 1 - tail)), log_r2 + math.log(n / _chi2(n, tail))
    else:
        lo, hi = log_r2 - math.log(float(fdtri(n, n, 1 - tail))), log_r2 - math.log(float(fdtri(n, n, tail)))
    infl = [s.d2 / t[0] - s.a2 / t[1] for s, t in zip(sides, totals)]
    paired = floor is not None and len(floor.d2) == len(cand.d2) and floor.rows == cand.rows
    parts = [infl[0] - infl[1]] if paired else infl
    if all(len(u) >= 2 for u in parts):
        var, dof_den = 0.0, 0.0
        for u in parts:
            b, u2 = len(u), u * u
            s2, s4 = float(u2.sum()), float(np.dot(u2, u2))
            v = s2 * b / (b - 1)
            excess = s4 - s2 * s2 / b
            k = b - 1 if excess <= 0 else min(b - 1, max(1.0, 2 * s2 * s2 / excess))
            var += v
            dof_den += v * v / k
        if var > 0:
            half = float(stdtrit(max(1, math.floor(var * var / dof_den)), 1 - tail)) * math.sqrt(var)
            lo, hi = min(lo, log_r2 - half), max(hi, log_r2 + half)
    return math.exp(lo / 2.0), math.exp(hi / 2.0)


def _chi2(n: int, q: float) -> float:
    """The chi-square(n) quantile at ``q`` (``chdtri`` inverts the upper tail)."""
    return float(chdtri(n, 1.0 - q))


def _requests(seed: int) -> list[tuple[BlockSums, BlockSums | None, int]]:
    """Requests of several block counts, with no floor, a paired floor, a floor of other rows or other blocks;
    some with a zero or an infinite sum, some with one block carrying the whole error."""
    rng = np.random.default_rng(seed)

    def sums(n: int, rows: int, kind: str = "") -> BlockSums:
        d2, a2 = rng.random(n) ** 3 * 10 ** rng.uniform(-8, 0), rng.random(n) * 10 ** rng.uniform(-2, 2)
        if kind == "zero":
            d2[:] = 0
        elif kind == "inf":
            d2[rng.integers(n)] = np.inf
        elif kind == "one":
            d2[:] = 0
            d2[rng.integers(n)] = 1e-3
        return BlockSums(d2, a2, rows)

    out: list[tuple[BlockSums, BlockSums | None, int]] = []
    for _ in range(600):
        n = int(rng.choice([1, 2, 3, 8, 9, 16, 64, 1024]))
        cand = sums(n, 4 * n, str(rng.choice(["", "", "", "zero", "inf", "one"])))
        floor = [None, sums(n, 4 * n), sums(n, 5 * n), sums(int(rng.choice([1, 7, 64])), 99)][int(rng.integers(4))]
        out.append((cand, floor, int(rng.integers(1, 10**5))))
    return out


@pytest.mark.parametrize("levels", [(0.95, 0.95), (0.95, 0.999), (0.6, 0.95)])
def test_many_at_once_are_the_formula_of_each_alone(levels: tuple[float, float]) -> None:
    wanted = _requests(7)
    level, fail = levels
    got = judged_intervals(wanted, level=level, fail_level=fail, bootstrap=False)
    for (cand, floor, n), (ci, fail_lo) in zip(wanted, got):
        shown, strict = _reference(cand, floor, n, level), _reference(cand, floor, n, fail)
        if shown is None:  # no log scale: the value itself
            assert ci[0] == ci[1] == fail_lo
            continue
        assert strict is not None
        assert ci == shown and fail_lo == min(shown[0], strict[0])  # bit for bit
    assert got == [judged_intervals([w], level=level, fail_level=fail, bootstrap=False)[0] for w in wanted]


def test_several_levels_in_one_call_are_each_call() -> None:
    wanted = _requests(8)
    levels = [(0.95, 0.999), (0.6, 0.95)]
    both = judged_intervals_at(wanted, levels, bootstrap=False)
    assert both == [judged_intervals(wanted, level=lv, fail_level=fl, bootstrap=False) for lv, fl in levels]
    finite = [w for w in wanted if np.isfinite(w[0].d2).all()][:50]  # a pair's block sums are of finite elements
    with_boot = judged_intervals_at(finite, levels)
    assert with_boot == [judged_intervals(finite, level=lv, fail_level=fl) for lv, fl in levels]


def test_an_upper_end_past_float64_is_infinite() -> None:
    """Two blocks, one carrying the whole error: the t interval has one degree of freedom, and its upper end at a
    rare FAIL level lies past float64's range. It is +inf, not an error; the lower ends stay finite."""
    cand = BlockSums(np.array([1e-3, 0.0]), np.array([1.0, 1.0]), 2)
    (lo, hi), fail_lo = judged_intervals([(cand, None, 2)], fail_level=1 - 1e-9, bootstrap=False)[0]
    assert 0 <= fail_lo <= lo < hi and math.isfinite(lo)
    big = BlockSums(np.array([1e3, 0.0]), np.array([1e-3, 1.0]), 2)
    (_, hi), _ = judged_intervals([(big, None, 2)], level=1 - 1e-12, bootstrap=False)[0]
    assert hi == math.inf
