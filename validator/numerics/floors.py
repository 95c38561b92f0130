"""Noise floors and the uncertainty of a judged ratio (pure math, no I/O).

A verdict compares a pair's relative L2 error with a *floor*: the error that a valid computation of the
same tensor has. Three kinds exist (docs/policy.md):

- ``measured``: the same tensor in a second comparison that is known to be fine (``--floor A B``);
- ``rounding``: the reference rounded to the candidate's dtype, against the unrounded reference. Any
  result stored in that dtype carries at least this error, so it exists whenever the reference is more
  precise than the candidate (an FP64 reference, say);
- ``none``: neither is available; a rule that needs a floor is then inconclusive, with that reason.

Uncertainty: a tensor's rows (tokens, by the capture convention) are cut into at most ``BLOCKS`` contiguous
blocks, and for each block the sums ``Σ d²`` and ``Σ a²`` over elements finite in both are kept
(:class:`BlockSums`). A percentile bootstrap that resamples blocks with replacement, the candidate's and
the floor's blocks *jointly* when they cover the same rows, gives the interval of ``rel_l2`` and of
``rel_l2 / floor``. Blocks of rows, not single elements, are resampled because errors are correlated
within a token (one norm scale, the same outlier channels). The resampling is seeded, so an interval is
the same on every run. A verdict's interval (:func:`judged_intervals`) is the envelope of that bootstrap, a
log-scale t interval from the same blocks and the F interval of the pair's element count, which hold their
coverage where a handful of blocks cannot (docs/policy.md, "Margins with uncertainty").
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from validator.numerics.backends import Totals
from validator.numerics.host import HostArray, rounded
from validator.numerics.metrics import MetricInputError, TensorMetrics, measure, measure_many

if TYPE_CHECKING:
    from validator.numerics.host import Array

__all__ = [
    "BLOCKS",
    "LEVEL",
    "RESAMPLES",
    "BlockSums",
    "block_edges",
    "block_sums",
    "measure_blocks",
    "measure_blocks_many",
    "rounding_sums",
    "more_precise",
    "bootstrap_interval",
    "bootstrap_intervals",
    "judged_intervals",
]

BLOCKS = 64  # row blocks per tensor (fewer when the tensor has fewer rows)
ALIGN, ALIGNED_FROM = 16, 1 << 14  # block boundaries on multiples of ALIGN elements from ALIGNED_FROM elements
RESAMPLES = 1000  # bootstrap resamples per interval
LEVEL = 0.95  # two-sided interval level
_SEED = 20261201  # fixed: an interval never changes between runs

# Floating dtypes from most to least precise (by significand bits).
_PRECISION = ["float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2"]


def more_precise(dtype_a: str, dtype_b: str) -> bool:
    """True when ``dtype_a`` carries more significand bits than ``dtype_b`` (both floating)."""
    if dtype_a not in _PRECISION or dtype_b not in _PRECISION:
        return False
    return _PRECISION.index(dtype_a) < _PRECISION.index(dtype_b)


@dataclass(frozen=True)
class BlockSums:
    """Per-row-block ``Σ d²`` and ``Σ a²`` (float64) of one pair, and its NaN and infinity counts.

    ``nan_a`` / ``nan_b``: NaN elements in each side; ``inf_matched``: positions where both sides hold
    the same infinity (masked logits, say)."""

    d2: np.ndarray
    a2: np.ndarray
    rows: int
    nan_a: int = 0
    nan_b: int = 0
    inf_matched: int = 0

    @property
    def rel_l2(self) -> float:
        num, den = float(self.d2.sum()), float(self.a2.sum())
        return _rel(num, den)


def _rel(num: float, den: float) -> float:
    if den > 0:
        return math.sqrt(num / den)
    return 0.0 if num == 0 else math.inf


def block_edges(shape: Sequence[int]) -> list[int]:
    """Element offsets (row-major) of the row blocks of a tensor of ``shape``: at most ``BLOCKS`` runs of
    whole rows along the first dimension (tokens). When that dimension has fewer than ``BLOCKS`` entries
    (one decode token, a batch dimension of 2) or the tensor is 1-D, every element is a row, so blocks are
    runs of elements in memory order. In tensors of ``ALIGNED_FROM`` elements or more each boundary moves
    back to a multiple of ``ALIGN`` elements (a block may start up to 15 elements before its first row), so
    that a GPU reads every block in whole vectors."""
    return list(_edges(tuple(shape)))


@functools.lru_cache(maxsize=256)
def _edges(shape: tuple[int, ...]) -> tuple[int, ...]:
    numel, rows = math.prod(shape), _rows(shape)
    cols = numel // rows if rows else 0
    n = min(BLOCKS, rows)
    step = ALIGN if numel >= ALIGNED_FROM else 1
    return (*(i * rows // n * cols // step * step for i in range(n)), numel)


def _rows(shape: Sequence[int]) -> int:
    return shape[0] if len(shape) >= 2 and shape[0] >= BLOCKS else math.prod(shape)


def measure_blocks(a: Array, b: Array) -> tuple[TensorMetrics, BlockSums]:
    """The metrics of a pair of equal shape and its block sums, from one pass of the engine (``d = b - a``).
    Raises ``MetricInputError`` as :func:`validator.numerics.metrics.compare_tensors` does."""
    m, totals = measure(a, b, edges=_edges(tuple(a.shape)))
    return m, _block_sums(a, b, m, totals)


def measure_blocks_many(pairs: Sequence[tuple[Array, Array]]) -> list[tuple[TensorMetrics, BlockSums] | MetricInputError]:
    """:func:`measure_blocks` of each pair, in order and with the same bits, the error it would raise in
    place of a pair it rejects; small pairs on the CPU are measured together (``metrics.measure_many``)."""
    got = measure_many([(a, b, _edges(tuple(a.shape)) if hasattr(a, "shape") else ()) for a, b in pairs])
    return [r if isinstance(r, MetricInputError) else (r[0], _block_sums(a, b, *r)) for (a, b), r in zip(pairs, got)]


def _block_sums(a: Array, b: Array, m: TensorMetrics, totals: Totals) -> BlockSums:
    """The pair's BlockSums from its pass."""
    nan_a, nan_b, inf_matched = totals.nonfinite
    d2, a2 = np.array(totals.block_d2, np.float64), np.array(totals.block_a2, np.float64)  # dtype given: not inferred
    return BlockSums(d2, a2, _rows(tuple(a.shape)), nan_a, nan_b, inf_matched)


def block_sums(a: Array, b: Array) -> BlockSums:
    """Block sums of ``d = b - a`` and ``a`` for a pair of equal shape."""
    return measure_blocks(a, b)[1]


def rounding_sums(a: Array, dtype: str) -> BlockSums:
    """Block sums of the reference ``a`` rounded to ``dtype`` against ``a`` itself: the rounding floor.

    Values beyond ``dtype``'s range round to infinity and drop out of the sums, as they do in a pair."""
    if isinstance(a, HostArray):  # rounded in NumPy as torch rounds (host.rounded), else in torch
        got = rounded(a, dtype)
        if got is not None:
            return block_sums(a, got)
        a = a.to_torch()
    import torch

    target = getattr(torch, dtype)
    return block_sums(a, a.detach().to(target))


def bootstrap_interval(
    cand: BlockSums, floor: BlockSums | None = None, *, level: float = LEVEL, resamples: int = RESAMPLES
) -> tuple[float, float]:
    """Percentile-bootstrap interval of ``rel_l2`` (no floor) or of ``rel_l2 / floor_rel_l2``.

    Blocks are resampled with replacement; when the floor covers the same rows (same row count and
    blocks) both are resampled with the same draws, otherwise independently. A resample whose value is
    undefined (every drawn reference block zero) counts as infinite: it can widen an interval, never hide
    a failure. Nearest-rank percentiles, so no value is interpolated between finite and infinite ones."""
    return bootstrap_intervals([(cand, floor)], level=level, resamples=resamples)[0]


def bootstrap_intervals(
    wanted: Sequence[tuple[BlockSums, BlockSums | None]], *, level: float = LEVEL, resamples: int = RESAMPLES
) -> list[tuple[float, float]]:
    """:func:`bootstrap_interval` of each ``(cand, floor)``, in order: the pairs drawn alike (the same numbers
    of blocks, paired or not) are resampled in one call of the compiled code and sorted together, each with
    the code and the bits of one alone."""
    # numba, imported only where intervals are drawn
    from validator.numerics.numba_cache import first_call
    from validator.numerics.resample import ratios_many, resampled_rel_l2_many

    alike: dict[tuple[int, int | None, bool], list[int]] = {}  # (blocks, floor blocks, paired) -> requests
    for i, (cand, floor) in enumerate(wanted):
        m = None if floor is None else len(floor.d2)
        paired = floor is not None and m == len(cand.d2) and floor.rows == cand.rows
        alike.setdefault((len(cand.d2), m, paired), []).append(i)
    out = [(0.0, 0.0)] * len(wanted)
    ranks = _ranks(level, resamples)
    for (n, m, paired), idx in alike.items():
        if n == 0:
            continue
        cands = [wanted[i][0] for i in idx]
        d2, a2 = np.array([c.d2 for c in cands], np.float64), np.array([c.a2 for c in cands], np.float64)
        if m is None:
            draws, _ = _draws(n, None, resamples)
            with first_call((resampled_rel_l2_many, draws.dtype)):  # numba's cache: numba_cache.py
                values = resampled_rel_l2_many(draws, d2, a2)
        else:
            floors = [f for i in idx if (f := wanted[i][1]) is not None]
            fd2, fa2 = np.array([f.d2 for f in floors], np.float64), np.array([f.a2 for f in floors], np.float64)
            draws, other = _draws(n, None if paired or m == 0 else m, resamples)
            if not paired and other is None:  # a floor of no blocks: no draws (its resampled sums are zero), and
                other = np.zeros((0, resamples), draws.dtype)  # read-only as the draws are: one compiled signature
                other.flags.writeable = False
            fdraws = draws if paired or other is None else other  # paired: the same draws
            with first_call((ratios_many, draws.dtype, fdraws.dtype)):
                values = ratios_many(draws, d2, a2, fdraws, fd2, fa2)
        # the values at those ranks are the same whether sorted or partitioned (no NaN: undefined resamples
        # are +inf; no -0.0); NumPy's vectorised sort of 1,000 values takes a third of the time of a partition
        values.sort(axis=1)
        for i, (lo, hi) in zip(idx, values[:, ranks].tolist()):
            out[i] = (lo, hi)
    return out


@functools.lru_cache(maxsize=16)
def _ranks(level: float, resamples: int) -> list[int]:
    """0-based nearest ranks of the interval's ends: the value of rank ceil(q * resamples) (1-based),
    q = tail and 1 - tail."""
    tail = (1.0 - level) / 2.0
    return [max(1, math.ceil(round(q * resamples, 9))) - 1 for q in (tail, 1.0 - tail)]


@functools.lru_cache(maxsize=128)
def _draws(n: int, m: int | None, resamples: int) -> tuple[np.ndarray, np.ndarray | None]:
    """How often each resample draws each of ``n`` blocks (``[n, resamples]``: a block's counts side by side),
    and of ``m`` floor blocks drawn independently (``None``: the floor is paired). Seeded: the same draws on
    every call."""
    rng = np.random.default_rng(_SEED)

    def counts(k: int) -> np.ndarray:
        idx = rng.integers(0, k, size=(resamples, k)) + k * np.arange(resamples)[:, None]
        # small integers (a resample draws a block at most k times): a uint8 table stays in cache between pairs
        kind = np.uint8 if k < 256 else np.uint32
        out = np.ascontiguousarray(np.bincount(idx.ravel(), minlength=resamples * k).reshape(resamples, k).T, kind)
        out.flags.writeable = False
        return out

    first = counts(n)
    return first, (None if m is None else counts(m))


def judged_intervals(
    wanted: Sequence[tuple[BlockSums, BlockSums | None, int]],
    *,
    level: float = LEVEL,
    fail_level: float = LEVEL,
    bootstrap: bool = True,
) -> list[tuple[tuple[float, float], float]]:
    """The interval a verdict rests on for each ``(cand, floor, elements)``, and the lower end it FAILs on.

    The interval (at ``level``) is the envelope of three intervals of the same quantity (``rel_l2``, or
    ``rel_l2 / floor``), so that it is as wide as the widest of them:

    - the block bootstrap (:func:`bootstrap_intervals`; skipped with ``bootstrap=False``, as for pooled units);
    - a *t interval on the log scale*: ``log(ratio²) ± t(B-1) · se`` with ``se²`` the blocks' linearised
      (delta-method) variance of ``log(Σd²/Σa²)`` minus that of the floor's, block by block when the floor
      covers the same rows (then a common scale per block cancels), each side's own otherwise;
    - an *F (or chi-square) interval* with ``elements`` degrees of freedom on each side: exact for independent
      Gaussian errors of one variance, and never narrower than what that many elements can support. It is what
      holds the coverage of tiny tensors (8 elements: ratio ×/÷ 2.1), where 8 resampled values cannot.

    The FAIL end is the lower end of the same envelope at ``fail_level`` (the parametric intervals only: the
    bootstrap cannot draw such rare quantiles), never above the interval's own lower end; a comparison of many
    judged units asks for ``fail_level = 1 - 0.05 / units`` (Bonferroni), so that its false FAILs stay at 5% per
    run however many units it judges (docs/policy.md, "Intervals" and "Pooled units")."""
    return judged_intervals_at(wanted, [(level, fail_level)], bootstrap=bootstrap)[0]


def judged_intervals_at(
    wanted: Sequence[tuple[BlockSums, BlockSums | None, int]],
    levels: Sequence[tuple[float, float]],
    *,
    bootstrap: bool = True,
) -> list[list[tuple[tuple[float, float], float]]]:
    """:func:`judged_intervals` of ``wanted`` at each ``(level, fail_level)`` of ``levels``, in that order, with
    the same bits: the blocks' sums and variances are worked out once, for every level (pooled units ask for
    two), across the requests of the same numbers of blocks at once."""
    stats = _parametric_stats(wanted)
    out = []
    for level, fail_level in levels:
        boots = bootstrap_intervals([(c, f) for c, f, _ in wanted], level=level) if bootstrap else [None] * len(wanted)
        got = []
        for (cand, floor, _), st, boot in zip(wanted, stats, boots):
            if st is None:  # an undefined or zero sum: the bootstrap alone (or the value alone)
                value = _value(cand, floor)
                ci = boot if boot is not None else (value, value)
                got.append((ci, ci[0]))
                continue
            shown = st.interval(level)
            ci = shown if boot is None else (min(shown[0], boot[0]), max(shown[1], boot[1]))
            strict = shown if fail_level == level else st.interval(fail_level)
            got.append((ci, min(ci[0], strict[0])))
        out.append(got)
    return out


def _value(cand: BlockSums, floor: BlockSums | None) -> float:
    r = cand.rel_l2
    if floor is None:
        return r
    f = floor.rel_l2
    return (1.0 if r == 0 else math.inf) if f == 0 else r / f


@dataclass(frozen=True)
class _Parametric:
    """What the parametric intervals of one request need of its blocks (:func:`_parametric_stats`): the log of
    its squared ratio, its elements, whether a ratio to a floor, and the t interval's variance and its degrees
    of freedom (``var`` 0: no t interval)."""

    log_r2: float
    n: int
    floor: bool
    var: float
    dof_den: float

    def interval(self, level: float) -> tuple[float, float]:
        """The envelope of the log-scale t interval and the F interval at ``level`` (see :func:`judged_intervals`)."""
        log_r2, n = self.log_r2, self.n
        tail = (1.0 - level) / 2.0
        if not self.floor:  # Σd²/σ² ~ chi-square(n): rel_l2² within rel_l2² · n / chi2 quantiles
            lo_f, hi_f = log_r2 + math.log(n / _chi2(n, 1 - tail)), log_r2 + math.log(n / _chi2(n, tail))
        else:  # (Σd²/Σf²) / true ratio² ~ F(n, n)
            lo_f, hi_f = log_r2 - math.log(_f(n, 1 - tail)), log_r2 - math.log(_f(n, tail))
        lo, hi = lo_f, hi_f
        var = self.var
        if var > 0:
            dof = var * var / self.dof_den  # Welch-Satterthwaite over the sides (one side, or paired: that side's)
            half = _t(max(1, math.floor(dof)), 1 - tail) * math.sqrt(var)  # dof rounded down: wider, never narrower
            lo, hi = min(lo, log_r2 - half), max(hi, log_r2 + half)
        return _exp_half(lo), _exp_half(hi)


def _exp_half(x: float) -> float:
    """exp(x / 2), +inf past float64's range (an upper end at a rare level of a pair of very few blocks)."""
    try:
        return math.exp(x / 2.0)
    except OverflowError:
        return math.inf


def _parametric_stats(wanted: Sequence[tuple[BlockSums, BlockSums | None, int]]) -> list[_Parametric | None]:
    """The :class:`_Parametric` of each ``(cand, floor, elements)``; None where a sum is zero or not finite (no
    log scale). The requests of the same numbers of blocks (and pairing) are worked out together, row by row
    of stacked blocks, with the bits of one alone: each row's sums as NumPy sums a 1-D array (pairwise, along
    the row), its sum of fourth powers as ``np.dot`` of a row with itself (BLAS's dot, which ``matmul`` of a
    row by a column calls too), the arithmetic after that on Python floats."""
    alike: dict[tuple[int, int | None, bool], list[int]] = {}
    for i, (cand, floor, _) in enumerate(wanted):
        m = None if floor is None else len(floor.d2)
        paired = floor is not None and m == len(cand.d2) and floor.rows == cand.rows
        alike.setdefault((len(cand.d2), m, paired), []).append(i)
    out: list[_Parametric | None] = [None] * len(wanted)
    for (_, mb, paired), idx in alike.items():
        sides = [_stacked([wanted[i][0] for i in idx])]
        if mb is not None:
            sides.append(_stacked([f for i in idx if (f := wanted[i][1]) is not None]))
        sums = [(d2.sum(axis=1), a2.sum(axis=1)) for d2, a2 in sides]
        with np.errstate(all="ignore"):  # the rows of a zero or non-finite sum are left out below
            infl = [d2 / sd[:, None] - a2 / sa[:, None] for (d2, a2), (sd, sa) in zip(sides, sums)]
        parts = [infl[0] - infl[1]] if paired else infl
        moments = [(u2.sum(axis=1).tolist(), _dots(u2).tolist(), u2.shape[1]) for u in parts for u2 in (u * u,)]
        totals = [(sd.tolist(), sa.tolist()) for sd, sa in sums]
        for row, i in enumerate(idx):
            t = [(sd[row], sa[row]) for sd, sa in totals]
            if not all(0 < x < math.inf for ts in t for x in ts):
                continue
            log_r2 = math.log(t[0][0] / t[0][1])
            if mb is not None:
                log_r2 -= math.log(t[1][0] / t[1][1])
            var, dof_den = 0.0, 0.0
            for s2s, s4s, b in moments:
                if b < 2:
                    var, dof_den = 0.0, 0.0  # too few blocks on a side: no t interval
                    break
                s2, s4 = s2s[row], s4s[row]
                v = s2 * b / (b - 1)
                # the variance estimate's own degrees of freedom, fewer where a few blocks carry it (outliers):
                # b - 1 for Gaussian influences, down to 1 where one block carries all of it
                excess = s4 - s2 * s2 / b
                k = b - 1 if excess <= 0 else min(b - 1, max(1.0, 2 * s2 * s2 / excess))
                var += v
                dof_den += v * v / k
            out[i] = _Parametric(log_r2, max(1, int(wanted[i][2])), mb is not None, var, dof_den)
    return out


def _stacked(sums: Sequence[BlockSums]) -> tuple[np.ndarray, np.ndarray]:
    """The blocks' ``d2`` and ``a2`` of requests of one number of blocks, a row each (float64)."""
    if len(sums) == 1:
        return sums[0].d2.reshape(1, -1).astype(np.float64, copy=False), sums[0].a2.reshape(1, -1).astype(np.float64, copy=False)
    return np.array([s.d2 for s in sums], np.float64), np.array([s.a2 for s in sums], np.float64)


def _dots(u2: np.ndarray) -> np.ndarray:
    """``np.dot(row, row)`` of each row of ``u2``, the same bits: ``matmul`` of a row vector by a column vector
    calls the same BLAS dot."""
    out: np.ndarray = np.matmul(u2[:, None, :], u2[:, :, None]).reshape(-1)
    return out


# quantiles from scipy.special (imported where an interval is first drawn; scipy.stats would add a second)
@functools.lru_cache(maxsize=4096)
def _t(dof: int, q: float) -> float:
    """Student's t quantile."""
    from scipy.special import stdtrit

    return float(stdtrit(dof, q))


@functools.lru_cache(maxsize=4096)
def _f(n: int, q: float) -> float:
    """The F(n, n) quantile."""
    from scipy.special import fdtri

    return float(fdtri(n, n, q))


@functools.lru_cache(maxsize=4096)
def _chi2(n: int, q: float) -> float:
    """The chi-square(n) quantile."""
    from scipy.special import chdtri  # the inverse of the upper tail

    return float(chdtri(n, 1.0 - q))
