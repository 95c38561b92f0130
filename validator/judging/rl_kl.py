"""Train/rollout mismatch KL over RL steps: estimators, per-step means with bootstrap intervals, the floor, a
trend test and the verdict. Pure numpy/scipy: arrays in, a :class:`KLReport` out (definitions in
docs/metrics.md, "RL train/rollout KL"; defaults chosen in benchmarks/rl_kl_calibration.md).

For one sampled token let ``r = train_logprob - rollout_logprob`` (the log-ratio ``log p/q`` at a token drawn from
the rollout policy ``q``). KL(q || p) = E_q[-r] is estimated per token by ``k1 = -r``, ``k2 = r^2 / 2`` and
``k3 = exp(r) - 1 - r`` (Schulman's estimators).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from statistics import NormalDist
from typing import Any, Literal, NamedTuple

import numpy as np
import numpy.typing as npt
from scipy import stats as sps
from scipy.special import erfc as _erfc

from validator.judging.exit_codes import VERDICT_EXIT
from validator.judging.holm import holm_adjust
from validator.numerics.jsonsafe import json_safe
from validator.runs.logprob_records import LogprobRecords

__all__ = [
    "KLReport",
    "KLSettings",
    "StepKL",
    "StepTable",
    "TrendTest",
    "kl_by_step",
    "StepStats",
    "judge_steps",
    "kl_estimators",
    "kl_report",
    "step_stats",
    "mann_kendall",
    "sen_slope",
]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
Verdict = Literal["at floor", "above floor", "diverging", "inconclusive"]
_EXACT_MK_MAX_N = 50
_Z975 = NormalDist().inv_cdf(0.975)


@dataclass(frozen=True)
class KLSettings:
    """How numbers become a verdict. The defaults come from benchmarks/rl_kl_calibration.md.

    - ``floor``: the declared floor of the k3 step mean; ``None``: estimated from the first ``floor_steps`` steps
      (those steps are then not judged against it, but they are in the trend test).
    - ``tolerance``: a step is *above floor* when its k3 mean is significantly above ``tolerance * floor``.
    - ``alpha``: level of the per-step tests (Holm over the judged steps) and of the level's equivalence bound.
    - ``trend_alpha``: level of the one-sided Mann-Kendall test for an increasing k3 series.
    - ``min_rise``: *diverging* also needs the Sen line to rise by more than ``min_rise * floor`` over the steps.
    - ``min_trend_steps``: fewer steps in all: no trend test, and the verdict cannot be *at floor*.
    - ``variation``: with an estimated floor, how steps and their level are judged. ``"measured"``: a step is
      *above floor* only when it exceeds the band beyond both its sampling error and the run's own step-to-step
      variation (the spread of successive log step means), and the level of the judged steps passes unless it is
      significantly above the band given that variation; so a healthy run whose batches move k3 by 30-40% is *at
      floor*. ``"sampling"``: sampling error alone, and the level must be *shown* inside the band, which a run whose
      floor moves from step to step rarely is (then *inconclusive*). A declared floor is always judged by sampling.
    """

    floor: float | None = None
    floor_steps: int = 5
    tolerance: float = 1.5
    alpha: float = 0.05
    trend_alpha: float = 0.01
    min_rise: float = 0.25
    min_trend_steps: int = 8
    resamples: int = 1000
    seed: int = 0
    variation: Literal["measured", "sampling"] = "measured"

    def __post_init__(self) -> None:
        if self.variation not in ("measured", "sampling"):
            raise ValueError(f"variation must be 'measured' or 'sampling', got {self.variation!r}")
        if self.floor is not None and not (math.isfinite(self.floor) and self.floor >= 0):
            raise ValueError(f"floor must be a finite number >= 0, got {self.floor}")
        if self.floor_steps < 1:
            raise ValueError(f"floor_steps must be >= 1, got {self.floor_steps}")
        if not (math.isfinite(self.tolerance) and self.tolerance >= 1):
            raise ValueError(f"tolerance must be >= 1, got {self.tolerance}")
        for name in ("alpha", "trend_alpha"):
            v = getattr(self, name)
            if not 0 < v < 1:
                raise ValueError(f"{name} must be in (0, 1), got {v}")
        if not (math.isfinite(self.min_rise) and self.min_rise >= 0):
            raise ValueError(f"min_rise must be >= 0, got {self.min_rise}")
        if self.min_trend_steps < 3:
            raise ValueError(f"min_trend_steps must be >= 3, got {self.min_trend_steps}")
        if self.resamples < 100:
            raise ValueError(f"resamples must be >= 100, got {self.resamples}")


def kl_estimators(rollout_logprob: FloatArray, train_logprob: FloatArray) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Per-token (k1, k2, k3) of KL(rollout || train), float64. k3 is ``expm1(r) - r``, and for ``|r| < 1e-4`` its
    Taylor series to ``r^5`` (the subtraction would cancel): relative error below 1e-11 everywhere."""
    r = np.asarray(train_logprob, dtype=np.float64) - np.asarray(rollout_logprob, dtype=np.float64)
    k3 = np.expm1(r) - r
    small = np.abs(r) < 1e-4
    if small.any():
        x = r[small]
        k3[small] = x * x * (0.5 + x * (1 / 6 + x * (1 / 24 + x / 120)))
    return -r, 0.5 * r * r, k3


@dataclass(frozen=True)
class TrendTest:
    """Mann-Kendall (increasing, one-sided) and Sen's slope of the per-step k3 means against the step number."""

    n: int
    s: int
    var_s: float
    p_increasing: float
    exact: bool
    slope: float
    slope_ci: tuple[float, float]
    rise: float  # slope * (last step - first step)

    def to_dict(self) -> dict[str, Any]:
        return {
            "n": self.n,
            "s": self.s,
            "var_s": _num(self.var_s),
            "p_increasing": _num(self.p_increasing),
            "exact": self.exact,
            "slope": _num(self.slope),
            "slope_ci": [_num(x) for x in self.slope_ci],
            "rise": _num(self.rise),
        }


@dataclass(frozen=True)
class StepKL:
    step: int
    samples: int
    tokens: int
    k1: float
    k2: float
    k3: float
    k3_se: float  # bootstrap over samples; NaN with one sample
    k3_ci: tuple[float, float]
    role: Literal["floor window", "judged"]
    p_above: float = math.nan  # one-sided: k3 mean > tolerance * floor
    p_above_adjusted: float = math.nan  # Holm over the judged steps
    status: Literal["floor window", "at floor", "above floor", "unclear"] = "floor window"
    weight_versions: tuple[int, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "samples": self.samples,
            "tokens": self.tokens,
            "k1": _num(self.k1),
            "k2": _num(self.k2),
            "k3": _num(self.k3),
            "k3_se": _num(self.k3_se),
            "k3_ci": [_num(x) for x in self.k3_ci],
            "role": self.role,
            "p_above": _num(self.p_above),
            "p_above_adjusted": _num(self.p_above_adjusted),
            "status": self.status,
            "weight_versions": list(self.weight_versions),
        }


@dataclass(frozen=True)
class StepTable:
    """The per-step results as columns, one entry per step (a million steps are a few dozen MB, not a million
    objects). ``p_above``/``p_above_adjusted`` are NaN and ``status`` "floor window" for the first ``n_window``."""

    step: IntArray
    samples: IntArray
    tokens: IntArray
    k1: FloatArray
    k2: FloatArray
    k3: FloatArray
    k3_se: FloatArray
    k3_lo: FloatArray
    k3_hi: FloatArray
    weight_versions: tuple[tuple[int, ...], ...]
    n_window: int = 0
    p_above: FloatArray | None = None
    p_above_adjusted: FloatArray | None = None
    status: tuple[str, ...] = ()

    def __len__(self) -> int:
        return int(self.step.size)

    def step_kl(self, i: int) -> StepKL:
        judged = i >= self.n_window
        return StepKL(
            step=int(self.step[i]), samples=int(self.samples[i]), tokens=int(self.tokens[i]), k1=float(self.k1[i]),
            k2=float(self.k2[i]), k3=float(self.k3[i]), k3_se=float(self.k3_se[i]),
            k3_ci=(float(self.k3_lo[i]), float(self.k3_hi[i])), role="judged" if judged else "floor window",
            p_above=float(self.p_above[i]) if judged and self.p_above is not None else math.nan,
            p_above_adjusted=float(self.p_above_adjusted[i]) if judged and self.p_above_adjusted is not None else math.nan,
            status=self.status[i] if judged else "floor window",  # type: ignore[arg-type]
            weight_versions=self.weight_versions[i],
        )

    def to_dicts(self, start: int = 0, stop: int | None = None) -> list[dict[str, Any]]:
        """``[StepKL.to_dict() ...]`` of steps ``start:stop``, column by column."""
        n = len(self)
        a, b = max(0, start), n if stop is None else min(n, stop)
        if b <= a:
            return []
        pa = self.p_above if self.p_above is not None else np.full(n, math.nan)
        pq = self.p_above_adjusted if self.p_above_adjusted is not None else np.full(n, math.nan)
        cols = [_nums(c[a:b]) for c in (self.k1, self.k2, self.k3, self.k3_se, self.k3_lo, self.k3_hi, pa, pq)]
        w = min(self.n_window, b)
        roles = ["floor window"] * max(0, w - a) + ["judged"] * (b - max(a, w))
        status = ["floor window"] * max(0, w - a) + list(self.status[max(a, w) : b])
        return [
            {
                "step": st, "samples": ns, "tokens": nt, "k1": a1, "k2": a2, "k3": a3, "k3_se": se, "k3_ci": [lo, hi],
                "role": role, "p_above": p, "p_above_adjusted": q, "status": stat, "weight_versions": list(wv),
            }
            for st, ns, nt, a1, a2, a3, se, lo, hi, p, q, role, stat, wv in zip(
                self.step[a:b].tolist(), self.samples[a:b].tolist(), self.tokens[a:b].tolist(), *cols, roles, status,
                self.weight_versions[a:b],
            )
        ]


@dataclass(frozen=True)
class KLReport:
    verdict: Verdict
    reasons: tuple[str, ...]
    table: StepTable
    floor: float
    floor_se: float
    floor_source: Literal["declared", "estimated"]
    band: float  # tolerance * floor
    level: float  # mean of the judged steps' k3 means
    level_upper: float  # its one-sided (1 - alpha) upper bound
    trend: TrendTest | None
    settings: KLSettings = field(default_factory=KLSettings)
    variation: float = math.nan  # step-to-step SD of log k3 step means (successive differences); nan: not measured
    level_ratio: float = math.nan  # judged steps' geometric-mean k3 over the floor's (measured variation)
    level_ratio_upper: float = math.nan  # its one-sided (1 - alpha) upper bound, from the measured variation
    flag_ratio: float = math.nan  # about how far above the floor a single step must be to be flagged above it

    @functools.cached_property
    def steps(self) -> tuple[StepKL, ...]:
        """One :class:`StepKL` per step (built on first use; ``table`` holds the same as columns)."""
        return tuple(self.table.step_kl(i) for i in range(len(self.table)))

    @property
    def exit_code(self) -> int:
        return VERDICT_EXIT[self.verdict]

    def format_table(self) -> str:
        """The per-step table, the floor and trend lines, and the verdict with its reasons."""
        return "\n".join(self.table_lines())

    def table_lines(self, chunk: int = 65536) -> Iterator[str]:
        """:meth:`format_table` line by line, formatting ``chunk`` steps at a time (twice: the column widths
        first), so printing a million steps holds no million strings."""
        from validator.judging.text import fmt_num

        t = self.table
        n = len(t)
        judged = np.arange(n) >= t.n_window
        pq = t.p_above_adjusted if t.p_above_adjusted is not None else np.full(n, math.nan)
        status = ("floor window",) * min(t.n_window, n) + tuple(t.status[t.n_window :])
        fmt = _fmt_col

        def cols(a: int, b: int) -> list[list[str]]:
            return [
                [str(v) for v in t.step[a:b].tolist()], [str(v) for v in t.samples[a:b].tolist()],
                [str(v) for v in t.tokens[a:b].tolist()], fmt(t.k1[a:b]), fmt(t.k2[a:b]), fmt(t.k3[a:b]),
                [f"[{lo}, {hi}]" for lo, hi in zip(fmt(t.k3_lo[a:b]), fmt(t.k3_hi[a:b]))],
                [q if j else "-" for q, j in zip(fmt(pq[a:b]), judged[a:b].tolist())],
                list(status[a:b]),
                [",".join(map(str, wv)) or "-" for wv in t.weight_versions[a:b]],
            ]

        header = ["step", "samples", "tokens", "k1", "k2", "k3", "k3 95% CI", "p above (Holm)", "status", "weights"]
        widths = [len(h) for h in header]
        for a in range(0, n, chunk):
            widths = [max([w] + [len(c) for c in col]) for w, col in zip(widths, cols(a, a + chunk))]
        yield "  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip()
        yield "  ".join("-" * w for w in widths)
        template = "  ".join(f"{{:<{w}}}" for w in widths)
        for a in range(0, n, chunk):
            for row in zip(*cols(a, a + chunk)):
                yield template.format(*row).rstrip()
        lines = [""]
        se = f" +- {fmt_num(self.floor_se)}" if self.floor_source == "estimated" else ""
        lines.append(f"floor ({self.floor_source}): {fmt_num(self.floor)}{se}; band k3 <= {fmt_num(self.band)} ({self.settings.tolerance} x floor)")
        if math.isfinite(self.variation):
            lines.append(
                f"step-to-step variation: {self.variation:.0%} (SD of log k3 between successive steps); judged level "
                f"{self.level_ratio:.3g}x the floor (upper bound {self.level_ratio_upper:.3g}x)"
            )
        if self.trend is not None:
            tr = self.trend
            lines.append(
                f"trend: Mann-Kendall S = {tr.s}, p(increasing) = {fmt_num(tr.p_increasing)}{' (exact)' if tr.exact else ''}; "
                f"Sen slope {fmt_num(tr.slope)}/step [{fmt_num(tr.slope_ci[0])}, {fmt_num(tr.slope_ci[1])}], rise {fmt_num(tr.rise)}"
            )
        lines.append(f"verdict: {self.verdict.upper()}")
        lines.extend(f"  {r}" for r in self.reasons)
        yield from lines

    def to_dict(self, *, steps: bool = True) -> dict[str, Any]:
        """The verdict document; ``steps=False``: with an empty ``steps`` list (to stream ``table.to_dicts``)."""
        s = self.settings
        return {
            "kind": "rl_kl",
            "verdict": self.verdict,
            "reasons": list(self.reasons),
            "floor": {
                "value": _num(self.floor),
                "se": _num(self.floor_se),
                "source": self.floor_source,
                "band": _num(self.band),
            },
            "level": {"mean": _num(self.level), "upper": _num(self.level_upper), "ratio": _num(self.level_ratio),
                      "ratio_upper": _num(self.level_ratio_upper)},
            "variation": {"log_sd": _num(self.variation), "flag_ratio": _num(self.flag_ratio)},
            "trend": None if self.trend is None else self.trend.to_dict(),
            "steps": self.table.to_dicts() if steps else [],
            "settings": {
                "floor": s.floor,
                "floor_steps": s.floor_steps,
                "tolerance": s.tolerance,
                "alpha": s.alpha,
                "trend_alpha": s.trend_alpha,
                "min_rise": s.min_rise,
                "min_trend_steps": s.min_trend_steps,
                "resamples": s.resamples,
                "seed": s.seed,
                "variation": s.variation,
            },
        }


def _num(x: float) -> float | str:
    """A number of the document: a Python float, JSON-safe (:func:`validator.numerics.jsonsafe.json_safe`)."""
    out: float | str = json_safe(float(x))
    return out


def _nums(col: FloatArray) -> list[float | str]:
    """:func:`_num` of each element of a column."""
    out: list[float | str] = list(col.tolist())
    if not np.isfinite(col).all():
        for i in np.flatnonzero(~np.isfinite(col)).tolist():
            out[i] = _num(float(col[i]))
    return out


def _fmt_col(col: FloatArray) -> list[str]:
    """``validator.judging.text.fmt_num`` of each element of a float column (4 significant digits)."""
    return [f"{v:.4g}" for v in col.tolist()]


# -- trend -----------------------------------------------------------------------------------------


def _inversion_pmf(n: int) -> FloatArray:
    """P(a uniform random permutation of n items has k inversions), k = 0..n(n-1)/2 (Mahonian numbers)."""
    pmf = np.ones(1)
    for k in range(2, n + 1):
        pmf = np.convolve(pmf, np.full(k, 1.0 / k))
    return pmf


def _tie_term(values: FloatArray) -> float:
    _, counts = np.unique(values, return_counts=True)
    t = counts[counts > 1].astype(np.float64)
    return float(np.sum(t * (t - 1) * (2 * t + 5)))


def mann_kendall(y: Sequence[float] | FloatArray) -> tuple[int, float, float, bool]:
    """One-sided Mann-Kendall test for an increasing series: (S, Var S, p, exact).

    ``S = sum_{i<j} sign(y_j - y_i)``, counted in O(n log n) (the merge-sort count of discordant pairs inside
    ``scipy.stats.kendalltau``; S is its integer numerator, recovered exactly). Without ties and with ``n <= 50``
    the p-value ``P(S >= s)`` is exact (the permutation distribution); otherwise ``S / sqrt(Var S)`` is referred to
    the normal, with the tie-corrected ``Var S = (n(n-1)(2n+5) - sum t(t-1)(2t+5)) / 18`` and no continuity
    correction (as scipy's Kendall tau).
    """
    a = np.asarray(y, dtype=np.float64)
    n = a.size
    if n < 2:
        return 0, 0.0, math.nan, False
    s = _mk_s(a)
    var = (n * (n - 1) * (2 * n + 5) - _tie_term(a)) / 18.0
    ties = np.unique(a).size < n
    if not ties and n <= _EXACT_MK_MAX_N:
        pairs = n * (n - 1) // 2
        inv_max = (pairs - s) // 2  # S >= s  <=>  inversions <= (pairs - s) / 2
        p = float(np.sum(_inversion_pmf(n)[: inv_max + 1]))
        return s, var, min(1.0, p), True
    if var <= 0:
        return s, var, math.nan, False
    return s, var, _norm_sf(s / math.sqrt(var)), False


def _mk_s(a: FloatArray) -> int:
    """``sum_{i<j} sign(a_j - a_i)`` in O(n log n) time and O(n) memory. Kendall's tau-b of (index, a) is
    ``S / sqrt(P (P - T))`` with ``P = n(n-1)/2`` pairs and ``T`` the pairs tied in ``a`` (the index has no ties);
    scipy computes S as an exact integer, so rounding the product back is exact while ``|S| < 2^50``."""
    n = a.size
    if n < 64:  # small: direct, O(n^2) at most 2,016 pairs
        return int(sum(int(np.sum(np.sign(a[i + 1 :] - a[i]))) for i in range(n - 1)))
    pairs = n * (n - 1) // 2
    _, counts = np.unique(a, return_counts=True)
    tied = int(np.sum(counts * (counts - 1) // 2))
    if tied == pairs:  # a constant series
        return 0
    tau = float(sps.kendalltau(np.arange(n), a, method="asymptotic").statistic)
    return int(round(tau * math.sqrt(float(pairs)) * math.sqrt(float(pairs - tied))))


_EXACT_SEN_MAX_N = 2048  # up to 2,096,128 pairwise slopes: exact
_SEN_SAMPLE_PAIRS = 1 << 21  # beyond: the median of this many pairs drawn with a fixed seed


def sen_slope(
    x: Sequence[float] | FloatArray,
    y: Sequence[float] | FloatArray,
    confidence: float = 0.95,
    *,
    max_exact: int = _EXACT_SEN_MAX_N,
    sample_pairs: int = _SEN_SAMPLE_PAIRS,
    seed: int = 0,
) -> tuple[float, float, float]:
    """Sen's slope (median of pairwise slopes over pairs with ``x_j != x_i``) and its ``confidence`` interval by
    Sen's (1968) rank method, the ranks rounded as scipy's ``theilslopes``: (slope, low, high).

    Exact for ``n <= max_exact`` points (every pair, row by row). Above, the pairwise slopes are represented by
    ``sample_pairs`` pairs drawn uniformly with replacement from all pairs of distinct points (numpy's PCG64 seeded
    with ``seed``: the same input gives the same answer); the slope is the sample's median and the interval's ends
    the sample's quantiles at the ranks Sen's method picks among all pairs. Each is a pairwise slope whose rank
    quantile among all pairwise slopes is within ``2 / sqrt(sample_pairs)`` (0.0014 at the default 2^21) of the
    exact one's with probability above 0.9999 (4 binomial standard errors). Time O(n + sample_pairs log
    sample_pairs), memory O(n + sample_pairs)."""
    xa = np.asarray(x, dtype=np.float64)
    ya = np.asarray(y, dtype=np.float64)
    n = xa.size
    if n < 2:
        return math.nan, math.nan, math.nan
    pairs = n * (n - 1) // 2
    _, xcounts = np.unique(xa, return_counts=True)
    nt = pairs - int(np.sum(xcounts * (xcounts - 1) // 2))  # pairs with dx != 0
    if nt == 0:
        return math.nan, math.nan, math.nan
    if n <= max_exact:
        rows = []
        for i in range(n - 1):  # pairs (i, j > i) row by row: no n x n matrices
            dx = xa[i + 1 :] - xa[i]
            dy = ya[i + 1 :] - ya[i]
            ok = dx != 0  # the pair ordered by x has the same slope either way
            rows.append(dy[ok] / dx[ok])
        slopes = np.sort(np.concatenate(rows))
    else:
        rng = np.random.default_rng([seed, 0x5E5])
        ia = rng.integers(0, n, size=sample_pairs)
        ja = rng.integers(0, n - 1, size=sample_pairs)
        ja += ja >= ia  # uniform over ordered pairs of distinct points, so over unordered ones
        dxs = xa[ja] - xa[ia]
        oks = dxs != 0
        slopes = np.sort((ya[ja] - ya[ia])[oks] / dxs[oks])
        if slopes.size == 0:
            return math.nan, math.nan, math.nan
    z = float(sps.norm.ppf((1 - confidence) / 2))
    sigma = math.sqrt(max(0.0, (n * (n - 1) * (2 * n + 5) - _tie_term(xa) - _tie_term(ya)) / 18.0))
    ru = min(int(np.round((nt - z * sigma) / 2.0)), nt - 1)
    rl = max(int(np.round((nt + z * sigma) / 2.0)) - 1, 0)
    if slopes.size == nt:
        return float(np.median(slopes)), float(slopes[rl]), float(slopes[ru])
    m = slopes.size  # a sample: the same rank quantiles
    def at(rank: int) -> float:
        return float(slopes[min(m - 1, max(0, int(round(rank / max(1, nt - 1) * (m - 1)))))])

    return float(np.median(slopes)), at(rl), at(ru)


def _trend(steps: IntArray, means: FloatArray) -> TrendTest:
    s, var, p, exact = mann_kendall(means)
    slope, lo, hi = sen_slope(steps.astype(np.float64), means)
    rise = slope * float(steps[-1] - steps[0])
    return TrendTest(n=int(means.size), s=s, var_s=var, p_increasing=p, exact=exact, slope=slope, slope_ci=(lo, hi), rise=rise)


# -- bootstrap -------------------------------------------------------------------------------------


def _boot_ratio(groups: Sequence[tuple[FloatArray, FloatArray]], resamples: int, rng: np.random.Generator) -> float:
    """Bootstrap SE of the token mean ``sum(values) / sum(tokens)`` pooled over groups (steps), resampling the
    samples of each group with replacement (stratified), times ``sqrt(n/(n-1))`` with ``n`` the smallest group's
    sample count (the bootstrap's small-sample bias of a variance). NaN when a group has fewer than two samples."""
    num = np.zeros(resamples)
    den = np.zeros(resamples)
    n_min = min(v.size for v, _ in groups)
    if n_min < 2:
        return math.nan
    for vals, toks in groups:
        idx = rng.integers(0, vals.size, size=(resamples, vals.size))
        num += vals[idx].sum(axis=1)
        den += toks[idx].sum(axis=1)
    return float(np.std(num / den, ddof=1)) * math.sqrt(n_min / (n_min - 1))


# -- the report ------------------------------------------------------------------------------------


def _norm_sf(x: float) -> float:
    """The standard normal's upper tail, accurate far into it (``erfc``; scipy's per call costs 100x more)."""
    return 0.5 * math.erfc(x / math.sqrt(2.0))


def _p_above(mean: float, se: float, band: float) -> float:
    if not (math.isfinite(mean) and math.isfinite(se)):
        return math.nan
    if se <= 0:
        return 0.0 if mean > band else 1.0
    return _norm_sf((mean - band) / se)


@dataclass(frozen=True)
class StepStats:
    """What the verdict needs from the tokens: per step the means, the bootstrap SE of k3, and the per-sample k3
    sums and token counts (for the floor's bootstrap; samples of step ``i`` at ``bounds[i]:bounds[i + 1]``).
    Computed once by :func:`step_stats`; :func:`judge_steps` turns it into a report for any :class:`KLSettings`
    with the same ``resamples`` and ``seed``. Memory O(tokens): arrays, one small dict per step."""

    steps: IntArray
    table: StepTable  # the per-step columns, without tests (``n_window`` 0, no p-values)
    sample_k3: FloatArray
    sample_tokens: FloatArray
    bounds: IntArray
    _floor_cache: dict[tuple[int, int, int], tuple[float, float]] = field(default_factory=dict, repr=False, compare=False)
    _trend_cache: dict[str, TrendTest] = field(default_factory=dict, repr=False, compare=False)

    def group(self, i: int) -> tuple[FloatArray, FloatArray]:
        """Step ``i``'s per-sample (k3 sums, token counts)."""
        a, b = int(self.bounds[i]), int(self.bounds[i + 1])
        return self.sample_k3[a:b], self.sample_tokens[a:b]

    def estimated_floor(self, floor_steps: int, resamples: int, seed: int) -> tuple[float, float]:
        """(k3 token mean pooled over the first ``floor_steps`` steps, its stratified bootstrap SE over samples)."""
        key = (floor_steps, resamples, seed)
        if key not in self._floor_cache:
            win = [self.group(i) for i in range(min(floor_steps, self.steps.size))]
            floor = sum(float(v.sum()) for v, _ in win) / sum(float(t.sum()) for _, t in win)
            self._floor_cache[key] = (floor, _boot_ratio(win, resamples, np.random.default_rng([seed, 0x7FFFFFFF])))
        return self._floor_cache[key]

    def trend(self) -> TrendTest:
        """Mann-Kendall and Sen's slope of the k3 step means (computed once)."""
        if "trend" not in self._trend_cache:
            self._trend_cache["trend"] = _trend(self.steps, self.table.k3)
        return self._trend_cache["trend"]


def step_stats(
    step: IntArray | Sequence[int],
    sample: IntArray | Sequence[int],
    rollout_logprob: FloatArray | Sequence[float],
    train_logprob: FloatArray | Sequence[float],
    *,
    weight_version: IntArray | Sequence[int] | None = None,
    resamples: int = 1000,
    seed: int = 0,
) -> StepStats:
    """Per-step k1/k2/k3 token means and the k3 bootstrap SE over samples. ``sample`` identifies a sample (any int
    codes; a sample is the pair (step, sample)). Every logprob must be finite (``ValueError`` otherwise).

    Vectorized over steps; only the bootstrap runs per step, and only for steps with two samples or more (a
    single-sample step has no SE). Time O(tokens log tokens + resamples x samples)."""
    st = np.asarray(step, dtype=np.int64)
    sm = np.asarray(sample, dtype=np.int64)
    ro = np.asarray(rollout_logprob, dtype=np.float64)
    tr = np.asarray(train_logprob, dtype=np.float64)
    if not (st.shape == sm.shape == ro.shape == tr.shape) or st.ndim != 1:
        raise ValueError("step, sample and both logprob arrays must be 1-D and of one length")
    if st.size == 0:
        raise ValueError("no tokens")
    if not (np.isfinite(ro).all() and np.isfinite(tr).all()):
        raise ValueError("logprobs must be finite")
    wv = np.full(st.size, -1, dtype=np.int64) if weight_version is None else np.asarray(weight_version, dtype=np.int64)
    k1, k2, k3 = kl_estimators(ro, tr)
    del ro, tr

    order = np.lexsort((sm, st))
    st, sm, k1, k2, k3, wv = st[order], sm[order], k1[order], k2[order], k3[order], wv[order]
    del order
    # one group per (step, sample): its token count and sums
    new = np.ones(st.size, dtype=bool)
    new[1:] = (st[1:] != st[:-1]) | (sm[1:] != sm[:-1])
    starts = np.flatnonzero(new)
    g_step = st[starts]
    g_tokens = np.diff(np.append(starts, st.size)).astype(np.float64)
    g_k1, g_k2, g_k3 = (np.add.reduceat(k, starts) for k in (k1, k2, k3))
    step_values, step_first = np.unique(g_step, return_index=True)
    bounds = np.append(step_first, g_step.size).astype(np.int64)
    n_samples = np.diff(bounds)
    # per step: tokens and the three sums (reduceat over the groups of each step)
    s_tok = np.add.reduceat(g_tokens, step_first)
    mean1 = np.add.reduceat(g_k1, step_first) / s_tok
    mean2 = np.add.reduceat(g_k2, step_first) / s_tok
    mean3 = np.add.reduceat(g_k3, step_first) / s_tok
    se = np.full(step_values.size, math.nan)
    for i in np.flatnonzero(n_samples >= 2).tolist():
        a, b = int(bounds[i]), int(bounds[i + 1])
        rng = np.random.default_rng([seed, int(step_values[i]) & 0x7FFFFFFF])
        se[i] = _boot_ratio([(g_k3[a:b], g_tokens[a:b])], resamples, rng)
    # weight versions seen per step: the distinct (step, version >= 0) pairs, in order
    keep = wv >= 0
    pv_step, pv_ver = st[keep], wv[keep]
    if pv_step.size:
        o = np.lexsort((pv_ver, pv_step))
        pv_step, pv_ver = pv_step[o], pv_ver[o]
        d = np.ones(pv_step.size, dtype=bool)
        d[1:] = (pv_step[1:] != pv_step[:-1]) | (pv_ver[1:] != pv_ver[:-1])
        pv_step, pv_ver = pv_step[d], pv_ver[d]
    cut = np.searchsorted(pv_step, step_values, "left").tolist() + [int(pv_step.size)]
    ver_list = pv_ver.tolist()

    z = float(sps.norm.ppf(0.975))
    finite = np.isfinite(se)
    table = StepTable(
        step=step_values, samples=n_samples, tokens=s_tok.astype(np.int64), k1=mean1, k2=mean2, k3=mean3, k3_se=se,
        k3_lo=np.where(finite, mean3 - z * se, math.nan), k3_hi=np.where(finite, mean3 + z * se, math.nan),
        weight_versions=tuple(tuple(ver_list[cut[i] : cut[i + 1]]) for i in range(step_values.size)),
    )
    return StepStats(steps=step_values, table=table, sample_k3=g_k3, sample_tokens=g_tokens, bounds=bounds)


def kl_by_step(
    step: IntArray | Sequence[int],
    sample: IntArray | Sequence[int],
    rollout_logprob: FloatArray | Sequence[float],
    train_logprob: FloatArray | Sequence[float],
    *,
    weight_version: IntArray | Sequence[int] | None = None,
    settings: KLSettings | None = None,
) -> KLReport:
    """The per-step KL table, floor, trend and verdict: :func:`judge_steps` of :func:`step_stats`."""
    cfg = settings or KLSettings()
    stats = step_stats(
        step, sample, rollout_logprob, train_logprob, weight_version=weight_version, resamples=cfg.resamples, seed=cfg.seed
    )
    return judge_steps(stats, cfg)


def judge_steps(stats: StepStats, settings: KLSettings | None = None) -> KLReport:
    """Floor, per-step tests against the band, level, trend and the verdict (docs/metrics.md)."""
    cfg = settings or KLSettings()
    z = _Z975
    step_values = stats.steps
    base = stats.table
    estimated = cfg.floor is None
    n_window = min(cfg.floor_steps, step_values.size) if estimated else 0
    reasons: list[str] = []
    if estimated:
        floor, floor_se = stats.estimated_floor(n_window, cfg.resamples, cfg.seed)
    else:
        floor, floor_se = float(cfg.floor or 0.0), 0.0
    band = cfg.tolerance * floor
    band_se = cfg.tolerance * floor_se

    n_steps = len(base)
    judged = range(n_window, n_steps)
    k3, k3_se = base.k3, base.k3_se
    jk3, jse = k3[n_window:], np.hypot(k3_se[n_window:], band_se)
    with np.errstate(invalid="ignore", divide="ignore"):
        p_raw = np.where(np.isfinite(jk3) & np.isfinite(jse), 0.5 * _erfc(((jk3 - band) / jse) / math.sqrt(2.0)), math.nan)
        p_raw = np.where(np.isfinite(jse) & (jse <= 0), np.where(jk3 > band, 0.0, 1.0), p_raw)
    measured = _measured_level(cfg, k3, n_window, floor) if len(judged) and estimated else None
    if measured is not None:  # above the band beyond both its sampling error and the run's step-to-step variation
        p_raw = np.maximum(p_raw, measured.p_steps)
    p_adj = holm_adjust(p_raw)
    above_mask = np.isfinite(p_adj) & (p_adj < cfg.alpha)
    at_mask = ~above_mask & np.isfinite(k3_se[n_window:]) & (jk3 + z * jse <= band)
    status_of = np.where(above_mask, "above floor", np.where(at_mask, "at floor", "unclear")).tolist()
    status_all = ("floor window",) * n_window + tuple(status_of)
    table = replace(
        base,
        n_window=n_window,
        p_above=np.concatenate([np.full(n_window, math.nan), p_raw]),
        p_above_adjusted=np.concatenate([np.full(n_window, math.nan), p_adj]),
        status=status_all,
    )
    above = [table.step_kl(n_window + int(j)) for j in np.flatnonzero(above_mask)]

    # the level of the judged steps: the mean of their k3 means, and its one-sided upper bound
    if len(judged):
        means = k3[n_window:]
        ses = k3_se[n_window:]
        level = float(means.mean())
        level_se = math.hypot(float(math.sqrt(np.sum(ses**2))) / len(judged), band_se)
        level_upper = level + NormalDist().inv_cdf(1 - cfg.alpha) * level_se
    else:
        level, level_upper = math.nan, math.nan
    flag_ratio = math.nan
    if len(judged) and floor > 0:
        jse_fin = jse[np.isfinite(jse)]
        if jse_fin.size:
            z_first = NormalDist().inv_cdf(1 - cfg.alpha / len(judged))  # Holm's first step
            flag_ratio = (band + z_first * float(np.median(jse_fin))) / floor
        if measured is not None:
            flag_ratio = max(flag_ratio, measured.flag) if math.isfinite(flag_ratio) else measured.flag

    trend: TrendTest | None = None
    diverging = False
    if step_values.size >= cfg.min_trend_steps:
        trend = stats.trend()
        diverging = (
            math.isfinite(trend.p_increasing)
            and trend.p_increasing < cfg.trend_alpha
            and trend.rise > cfg.min_rise * floor
        )

    verdict: Verdict | None = None
    if diverging and trend is not None:
        verdict = "diverging"
        reasons.append(
            f"k3 grows over the steps: Mann-Kendall p = {trend.p_increasing:.3g} < {cfg.trend_alpha}, Sen slope "
            f"{trend.slope:.3g}/step (95% CI {trend.slope_ci[0]:.3g} .. {trend.slope_ci[1]:.3g}), a rise of "
            f"{trend.rise:.3g} over the steps (> {cfg.min_rise} x floor {floor:.3g})"
        )
    if above:
        if verdict is None:
            verdict = "above floor"
        names = ", ".join(str(a.step) for a in above[:10]) + (" ..." if len(above) > 10 else "")
        worst = max(above, key=lambda a: a.k3)
        reasons.append(
            f"{len(above)} step(s) above the floor band k3 <= {band:.3g} ({cfg.tolerance} x floor {floor:.3g}): "
            f"{names}; worst step {worst.step} at {worst.k3:.3g} (Holm-adjusted p {worst.p_above_adjusted:.3g})"
        )
    if verdict is None and measured is not None and measured.p < cfg.alpha:
        verdict = "above floor"
        reasons.append(
            f"the judged steps' level is {measured.ratio:.3g}x the floor, above the {cfg.tolerance}x band by more than "
            f"the run's own step-to-step variation ({measured.s:.0%}) explains (p = {measured.p:.3g})"
        )
    if verdict is None:
        problems = []
        if not len(judged):
            problems.append(
                f"no step to judge: the floor is estimated from the first {cfg.floor_steps} steps and the records "
                f"have {step_values.size}"
            )
        elif not math.isfinite(level_upper):
            problems.append("some judged step has a single sample, so no interval (the bootstrap is over samples)")
        elif measured is None and level_upper > band:
            problems.append(
                f"the judged steps' mean k3 {level:.3g} is not shown inside the band: its upper bound {level_upper:.3g} > "
                f"{band:.3g}; more samples per step narrow it"
            )
        if trend is None:
            problems.append(f"{step_values.size} step(s): the trend test needs at least {cfg.min_trend_steps}")
        if problems:
            verdict = "inconclusive"
            reasons.extend(problems)
        elif measured is not None:
            verdict = "at floor"
            assert trend is not None
            reasons.append(
                f"k3 at floor within the run's own step-to-step variation ({measured.s:.0%}): the judged steps' level "
                f"is {measured.ratio:.3g}x the floor (upper bound {measured.upper:.3g}x), not significantly above the "
                f"{cfg.tolerance}x band (p = {measured.p:.3g}); no step above the band {band:.3g}; no increasing trend "
                f"(Mann-Kendall p = {trend.p_increasing:.3g}, Sen rise {trend.rise:.3g})"
            )
        else:
            verdict = "at floor"
            assert trend is not None
            reasons.append(
                f"k3 at floor: judged steps' mean {level:.3g} (upper bound {level_upper:.3g}) inside the band "
                f"{band:.3g} = {cfg.tolerance} x floor {floor:.3g}; no step above it; no increasing trend "
                f"(Mann-Kendall p = {trend.p_increasing:.3g}, Sen rise {trend.rise:.3g})"
            )
        if math.isfinite(flag_ratio):
            spread = f" and steps vary by {measured.s:.0%} between batches" if measured is not None else ""
            reasons.append(
                f"KL cannot rule out a sync one version behind: a single step is flagged only from about {flag_ratio:.3g}x "
                f"the floor{spread}, and one stale version adds less (1.8x on the step it hit in benchmarks/rl_h200.md); "
                f"compare the trainer's and the engine's weight manifests (validator manifest diff) to rule it out"
            )
    assert verdict is not None
    return KLReport(
        verdict=verdict,
        reasons=tuple(reasons),
        table=table,
        floor=floor,
        floor_se=floor_se,
        floor_source="estimated" if estimated else "declared",
        band=band,
        level=level,
        level_upper=level_upper,
        trend=trend,
        settings=cfg,
        variation=measured.s if measured is not None else math.nan,
        level_ratio=measured.ratio if measured is not None else math.nan,
        level_ratio_upper=measured.upper if measured is not None else math.nan,
        flag_ratio=flag_ratio,
    )


VARIATION_TRIM = 0.1  # the largest share of squared successive differences left out of the step-to-step variation


def _step_sd(y: FloatArray) -> tuple[float, float]:
    """The SD of a series' steps from its successive differences, and its degrees of freedom: ``sqrt(mean(Δ²) / 2)``
    over the ``1 - VARIATION_TRIM`` smallest squared differences, divided by their expected share under normal
    steps (``E[X | X <= q]`` for ``X ~ chi2(1)``, ``q`` its quantile at the kept share), so that a few stale steps
    do not hide themselves by inflating the variation they are judged against. Degrees of freedom: those of the
    untrimmed estimate, ``2 (n-1)² / (3n - 4)``, times the kept share."""
    d2 = np.sort(np.diff(y) ** 2)
    m = d2.size
    keep = m - math.ceil(VARIATION_TRIM * m)
    share = keep / m
    if keep < m:
        q = float(sps.chi2.ppf(share, 1))
        expected = float(sps.chi2.cdf(q, 3)) / share  # E[X | X <= q], X ~ chi2(1)
    else:
        expected = 1.0
    n = y.size
    return math.sqrt(float(d2[:keep].mean()) / expected / 2.0), 2.0 * (n - 1) ** 2 / (3 * n - 4) * share


class _Variation(NamedTuple):
    s: float  # SD of log k3 step means (successive differences)
    ratio: float  # the judged steps' geometric-mean k3 over the floor's
    upper: float  # its one-sided (1 - alpha) upper bound
    p: float  # one-sided p-value of "the level exceeds tolerance x the floor"
    p_steps: FloatArray  # per judged step: the p-value of "this step exceeds tolerance x the floor", by the variation
    flag: float  # the ratio to the floor from which a single step's p survives Holm's first step


def _measured_level(cfg: KLSettings, k3: FloatArray, n_window: int, floor: float) -> _Variation | None:
    """The judged steps' level, and each judged step, against the floor by the run's own step-to-step variation.

    ``s``: the SD of log k3 step means from successive differences (:func:`_step_sd`: a trend or a lasting shift
    barely moves it, and it holds the steps' sampling error too), with its degrees of freedom (t tests). The reference is the floor window's geometric mean (only an estimated floor is judged so: a
    declared floor is held to its tolerance). None with ``variation = "sampling"``, fewer than 3 steps, or a step
    mean <= 0."""
    n = k3.size
    if cfg.variation != "measured" or n < 3 or not (np.all(np.isfinite(k3)) and np.all(k3 > 0)) or floor <= 0:
        return None
    y = np.log(k3)
    s, dof = _step_sd(y)
    judged = n - n_window
    ref = float(y[:n_window].mean())
    se = s * math.sqrt(1.0 / judged + 1.0 / n_window)
    d = float(y[n_window:].mean()) - ref
    excess = d - math.log(cfg.tolerance)
    step_se = s * math.sqrt(1.0 + 1.0 / n_window)  # a new step against the floor's estimate
    step_excess = y[n_window:] - ref - math.log(cfg.tolerance)
    if se > 0:
        p = float(sps.t.sf(excess / se, dof))
        upper = math.exp(d + float(sps.t.ppf(1 - cfg.alpha, dof)) * se)
        p_steps = sps.t.sf(step_excess / step_se, dof)
        flag = cfg.tolerance * math.exp(float(sps.t.ppf(1 - cfg.alpha / judged, dof)) * step_se + ref) / floor
    else:
        p, upper = (0.0 if excess > 0 else 1.0), math.exp(d)
        p_steps = np.where(step_excess > 0, 0.0, 1.0)
        flag = cfg.tolerance * math.exp(ref) / floor
    return _Variation(s, math.exp(d), upper, p, np.asarray(p_steps, dtype=np.float64), flag)


def kl_report(records: LogprobRecords, settings: KLSettings | None = None) -> KLReport:
    """:func:`kl_by_step` over validated logprob records (``validator.runs.logprob_records``)."""
    return kl_by_step(
        records.step,
        records.sample,
        records.rollout_logprob,
        records.train_logprob,
        weight_version=records.weight_version,
        settings=settings,
    )
