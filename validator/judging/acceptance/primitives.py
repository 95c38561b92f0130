"""Building blocks: binomial intervals, TOST and two-sided tests, trials needed, histogram
and paired tests.

Pure numpy/scipy; every function takes counts or arrays and returns numbers.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
import numpy.typing as npt
from scipy import stats as sps

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
Equivalence = Literal["equivalent", "different", "inconclusive"]


def wilson_interval(successes: float, trials: float, alpha: float = 0.05) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion (NaNs when ``trials == 0``).

    It treats the trials as independent; acceptance trials within a request are not, so this interval is
    too narrow under clustering (the bootstrap standard errors in :func:`compare_acceptance` are not).
    """
    if trials <= 0:
        return (math.nan, math.nan)
    z = float(sps.norm.ppf(1 - alpha / 2))
    p = successes / trials
    denom = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denom
    half = z / denom * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials))
    return (max(0.0, centre - half), min(1.0, centre + half))


def tost_p_value(diff: float, se: float, margin: float) -> float:
    """Two one-sided z tests of ``|true diff| >= margin``; a small p means equivalent within the margin."""
    if not math.isfinite(diff) or not math.isfinite(se):
        return math.nan
    if se <= 0:
        return 0.0 if abs(diff) < margin else 1.0
    p_low = float(sps.norm.sf((diff + margin) / se))  # H0: diff <= -margin
    p_high = float(sps.norm.cdf((diff - margin) / se))  # H0: diff >= +margin
    return max(p_low, p_high)


def two_sided_p(diff: float, se: float, df: float = math.inf) -> float:
    """Two-sided test of ``diff == 0`` with ``diff / se`` referred to Student's t with ``df`` degrees of
    freedom (the normal when ``df`` is infinite). NaN for non-finite inputs; 0 or 1 when ``se`` is 0."""
    if not math.isfinite(diff) or not math.isfinite(se):
        return math.nan
    if se <= 0:
        return 1.0 if diff == 0 else 0.0
    if math.isfinite(df):
        return float(2 * sps.t.sf(abs(diff) / se, df))
    return float(2 * sps.norm.sf(abs(diff) / se))


def needed_trials(
    p_a: float,
    p_b: float,
    margin: float,
    *,
    alpha: float = 0.05,
    power: float = 0.8,
    design_effect: float = 1.0,
) -> int:
    """Reached-k trials per run for the TOST to show equivalence with probability ``power`` when the
    true difference is 0: ``deff * (z[1-alpha] + z[1-(1-power)/2])**2 * (p_a(1-p_a) + p_b(1-p_b)) / margin**2``.
    """
    var = p_a * (1 - p_a) + p_b * (1 - p_b)
    return tost_trials(var, margin, alpha=alpha, power=power, design_effect=design_effect)


def tost_trials(variance: float, width: float, *, alpha: float, power: float, design_effect: float) -> int:
    """``deff * (z[1-alpha] + z[1-(1-power)/2])**2 * variance / width**2``, rounded up: the trials per run
    for the TOST of an effect whose variance times the trials is ``variance`` (both runs together) to show
    equivalence within ``+-width`` with probability ``power`` when the true effect is 0; 0 when that
    variance is not finite or ``width <= 0``."""
    if not math.isfinite(variance) or width <= 0:
        return 0
    z = float(sps.norm.ppf(1 - alpha) + sps.norm.ppf(1 - (1 - power) / 2))
    return math.ceil(max(design_effect, 0.0) * z * z * variance / (width * width))


def js_distance(p: npt.ArrayLike, q: npt.ArrayLike) -> float:
    """Jensen-Shannon distance (base 2, in [0, 1]) between two count or probability vectors."""
    pa = np.asarray(p, dtype=np.float64)
    qa = np.asarray(q, dtype=np.float64)
    if pa.sum() <= 0 or qa.sum() <= 0:
        return math.nan
    pa, qa = pa / pa.sum(), qa / qa.sum()
    m = (pa + qa) / 2

    def kl(x: FloatArray) -> float:
        nz = x > 0
        return float(np.sum(x[nz] * np.log2(x[nz] / m[nz])))

    return math.sqrt(max(0.0, (kl(pa) + kl(qa)) / 2))


def chi2_homogeneity(
    counts_a: npt.ArrayLike, counts_b: npt.ArrayLike, *, min_expected: float = 5.0
) -> tuple[float, int, float, tuple[tuple[int, int], ...]]:
    """Chi-square test that two histograms come from one distribution, after merging sparse bins.

    Bins are ordinal (drafts accepted). Adjacent bins are merged left to right until every expected
    count in the 2 x J table is at least ``min_expected``; a short remainder joins the last bin. Returns
    ``(statistic, dof, p_value, bins)`` with ``bins`` the inclusive index ranges; p is NaN when fewer
    than two bins remain. No continuity correction.
    """
    a = np.asarray(counts_a, dtype=np.float64)
    b = np.asarray(counts_b, dtype=np.float64)
    width = max(len(a), len(b))
    a, b = np.pad(a, (0, width - len(a))), np.pad(b, (0, width - len(b)))
    na, nb = a.sum(), b.sum()
    if na <= 0 or nb <= 0:
        return (math.nan, 0, math.nan, ())
    need = min_expected * (na + nb) / min(na, nb)  # a column total that gives both expected counts >= min
    bins: list[list[int]] = []
    start, total = None, 0.0
    for j in range(width):
        col = a[j] + b[j]
        if col == 0 and start is None:
            continue
        if start is None:
            start = j
        total += col
        if total >= need:
            bins.append([start, j])
            start, total = None, 0.0
    if start is not None:
        if bins:
            bins[-1][1] = width - 1
        else:
            bins.append([start, width - 1])
    ranges = tuple((lo, hi) for lo, hi in bins)
    if len(ranges) < 2:
        return (0.0, 0, math.nan, ranges)
    table = np.array([[a[lo : hi + 1].sum(), b[lo : hi + 1].sum()] for lo, hi in ranges]).T
    res = sps.chi2_contingency(table, correction=False)
    return (float(res.statistic), int(res.dof), float(res.pvalue), ranges)


def mcnemar_test(a_only: int, b_only: int, *, exact_below: int = 25) -> tuple[float, float, str]:
    """McNemar's test on the discordant counts: exact binomial when ``a_only + b_only < exact_below``,
    else the chi-square with continuity correction ``(|b - c| - 1)**2 / (b + c)``. Returns (stat, p, method).
    """
    n = a_only + b_only
    if n == 0:
        return (0.0, 1.0, "exact")
    if n < exact_below:
        return (float(min(a_only, b_only)), float(sps.binomtest(a_only, n, 0.5).pvalue), "exact")
    stat = (abs(a_only - b_only) - 1) ** 2 / n
    return (float(stat), float(sps.chi2.sf(stat, 1)), "chi2")


def position_counts(
    num_proposed: npt.ArrayLike, accepted: npt.ArrayLike, positions: int
) -> tuple[IntArray, IntArray]:
    """Per position k < ``positions``: (reached_k, accepted_k) counted over steps."""
    n = np.asarray(num_proposed, dtype=np.int64)[:, None]
    a = np.asarray(accepted, dtype=np.int64)[:, None]
    k = np.arange(positions)[None, :]
    reached = ((n > k) & (a >= k)).sum(axis=0)
    acc = (a > k).sum(axis=0)
    return reached.astype(np.int64), acc.astype(np.int64)


def equivalence_verdict(
    diff: float, p_equivalence: float, p_difference: float, *, margin: float, alpha: float
) -> Equivalence:
    """``equivalent`` when the TOST rejects, ``different`` when the two-sided test rejects and the difference
    is beyond the margin, else ``inconclusive`` (NaN p-values are inconclusive)."""
    if p_equivalence < alpha:
        return "equivalent"
    if p_difference < alpha and abs(diff) > margin:
        return "different"
    return "inconclusive"
