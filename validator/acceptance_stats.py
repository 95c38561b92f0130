"""Acceptance statistics for speculative decoding: two runs, per draft position. Pure numpy/scipy, no I/O.

Definitions (see docs/metrics-acceptance.md): for a verify step with ``n`` proposed drafts of which
``a`` were accepted, draft position ``k`` (0-based) was *reached* when ``n > k and a >= k`` and
*accepted* when ``a > k``. Rates are ratios of counts summed over steps; every uncertainty that crosses
steps is estimated with a request-level (prompt-level) bootstrap, because the steps of one request are
correlated. Run A is the reference, B the candidate; differences are B - A.

Inputs are :class:`StepArrays` (build one from an acceptance DataFrame with :meth:`StepArrays.from_frame`,
or pass the DataFrame directly to :func:`compare_acceptance`). Results are frozen dataclasses with
``to_dict()`` (JSON-safe) and ``__bool__`` (the item passed its check).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields, is_dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
from scipy import stats as sps

__all__ = [
    "AcceptanceComparison",
    "AcceptanceSummary",
    "ComparisonSettings",
    "DivergenceSummary",
    "HistogramComparison",
    "LogprobComparison",
    "McNemarResult",
    "MeanComparison",
    "PositionComparison",
    "RequestDivergence",
    "StepArrays",
    "acceptance_verdict",
    "chi2_homogeneity",
    "compare_acceptance",
    "js_distance",
    "mcnemar_test",
    "needed_trials",
    "position_counts",
    "summarize_run",
    "tost_p_value",
    "wilson_interval",
]

Verdict = Literal["equivalent", "different", "inconclusive", "no_data"]
Overall = Literal["pass", "fail", "inconclusive"]
PairBy = Literal["auto", "prompt_hash", "request_id", "none"]
IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


def _json(v: Any) -> Any:
    """JSON-safe copy: NaN/inf -> None, numpy scalars -> Python, tuples -> lists, dataclasses -> dicts."""
    if is_dataclass(v) and not isinstance(v, type):
        return {f.name: _json(getattr(v, f.name)) for f in fields(v)}
    if isinstance(v, dict):
        return {str(k): _json(x) for k, x in v.items()}
    if isinstance(v, (list, tuple, np.ndarray)):
        return [_json(x) for x in v]
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        f = float(v)
        return f if math.isfinite(f) else None
    return v


class _Result:
    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = _json(self)
        return out


# -- building blocks ----------------------------------------------------------------------------------


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


def _two_sided_p(diff: float, se: float) -> float:
    if not math.isfinite(diff) or not math.isfinite(se):
        return math.nan
    if se <= 0:
        return 1.0 if diff == 0 else 0.0
    return float(2 * sps.norm.sf(abs(diff) / se))


def needed_trials(
    p_a: float, p_b: float, margin: float, *, alpha: float = 0.05, power: float = 0.8, design_effect: float = 1.0
) -> int:
    """Reached-k trials per run for the TOST to show equivalence with probability ``power`` when the
    true difference is 0: ``deff * (z[1-alpha] + z[1-(1-power)/2])**2 * (p_a(1-p_a) + p_b(1-p_b)) / margin**2``.
    """
    var = p_a * (1 - p_a) + p_b * (1 - p_b)
    if not math.isfinite(var) or margin <= 0:
        return 0
    z = float(sps.norm.ppf(1 - alpha) + sps.norm.ppf(1 - (1 - power) / 2))
    return int(math.ceil(max(design_effect, 0.0) * z * z * var / (margin * margin)))


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


def position_counts(num_proposed: npt.ArrayLike, accepted: npt.ArrayLike, positions: int) -> tuple[IntArray, IntArray]:
    """Per position k < ``positions``: (reached_k, accepted_k) counted over steps."""
    n = np.asarray(num_proposed, dtype=np.int64)[:, None]
    a = np.asarray(accepted, dtype=np.int64)[:, None]
    k = np.arange(positions)[None, :]
    reached = ((n > k) & (a >= k)).sum(axis=0)
    acc = (a > k).sum(axis=0)
    return reached.astype(np.int64), acc.astype(np.int64)


# -- the step table -----------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class StepArrays:
    """One run's verify steps as arrays, sorted by (request, step). ``request`` indexes ``request_ids``."""

    request_ids: tuple[str, ...]
    prompt_hashes: tuple[str | None, ...]
    request: IntArray
    step: IntArray
    num_proposed: IntArray
    accepted: IntArray
    bonus: npt.NDArray[np.bool_]
    proposed: tuple[Any, ...] = ()
    output_tokens: tuple[Any, ...] = ()
    target_tokens: tuple[Any, ...] = ()
    draft_logprob: tuple[Any, ...] = ()
    draft_top_ids: tuple[Any, ...] = ()
    draft_top_logprobs: tuple[Any, ...] = ()

    @classmethod
    def from_frame(cls, df: Any) -> StepArrays:
        """From an acceptance DataFrame (``validator.acceptance`` columns; only the first five needed)."""
        n = len(df)
        rid = np.asarray(df["request_id"].to_numpy(), dtype=object)
        keys, inverse = np.unique(rid.astype(str), return_inverse=True) if n else (np.array([], dtype=str), np.zeros(0))
        inverse = inverse.astype(np.int64)
        step = np.asarray(df["step"].to_numpy(), dtype=np.int64)
        order = np.lexsort((step, inverse))
        if "num_proposed" in df:
            nprop = np.asarray(df["num_proposed"].to_numpy(), dtype=np.int64)
        else:
            nprop = np.fromiter((len(p) for p in df["proposed"]), dtype=np.int64, count=n)
        bonus = np.asarray(df["bonus"].to_numpy(), dtype=bool) if "bonus" in df else np.ones(n, dtype=bool)

        def col(name: str) -> tuple[Any, ...]:
            if name not in df:
                return (None,) * n
            values = df[name].to_numpy()
            return tuple(values[i] for i in order)

        hashes: list[str | None] = [None] * len(keys)
        if "prompt_hash" in df:
            ph = df["prompt_hash"].to_numpy()
            for i in range(n):
                h = ph[i]
                if isinstance(h, str):
                    hashes[inverse[i]] = h
        return cls(
            request_ids=tuple(str(k) for k in keys),
            prompt_hashes=tuple(hashes),
            request=inverse[order],
            step=step[order],
            num_proposed=nprop[order],
            accepted=np.asarray(df["accepted"].to_numpy(), dtype=np.int64)[order],
            bonus=bonus[order],
            proposed=col("proposed"),
            output_tokens=col("output_tokens"),
            target_tokens=col("target_tokens"),
            draft_logprob=col("draft_logprob"),
            draft_top_ids=col("draft_top_ids"),
            draft_top_logprobs=col("draft_top_logprobs"),
        )

    @property
    def n_steps(self) -> int:
        return int(len(self.step))

    @property
    def n_requests(self) -> int:
        return len(self.request_ids)

    @property
    def max_proposed(self) -> int:
        return int(self.num_proposed.max()) if self.n_steps else 0

    def request_slices(self) -> IntArray:
        """Row offsets: request r occupies rows ``[starts[r], starts[r + 1])``."""
        counts = np.bincount(self.request, minlength=self.n_requests)
        return np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)

    def per_request(self, positions: int) -> FloatArray:
        """Per request: [reached_0..K-1, accepted_0..K-1, steps, accepted drafts, emitted tokens]."""
        r, k_ = self.request, np.arange(positions)[None, :]
        n, a = self.num_proposed[:, None], self.accepted[:, None]
        reached, acc = (n > k_) & (a >= k_), a > k_
        cols = [np.bincount(r, weights=reached[:, k], minlength=self.n_requests) for k in range(positions)]
        cols += [np.bincount(r, weights=acc[:, k], minlength=self.n_requests) for k in range(positions)]
        cols.append(np.bincount(r, minlength=self.n_requests).astype(np.float64))
        cols.append(np.bincount(r, weights=self.accepted, minlength=self.n_requests))
        cols.append(np.bincount(r, weights=self.accepted + self.bonus, minlength=self.n_requests))
        return np.stack(cols, axis=1) if cols else np.zeros((self.n_requests, 0))


# -- one run ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AcceptanceSummary(_Result):
    """One run. ``accept_length`` = (accepted drafts + bonus tokens) / verify steps (bonus included);
    ``accepted_per_step`` = accepted drafts / verify steps; ``accept_rate`` = accepted / proposed drafts."""

    requests: int
    steps: int
    proposed_drafts: int
    accepted_drafts: int
    bonus_tokens: int
    accept_rate: float
    accepted_per_step: float
    accept_length: float
    histogram: tuple[int, ...]
    reached: tuple[int, ...]
    accepted_at: tuple[int, ...]
    conditional: tuple[float, ...]
    unconditional: tuple[float, ...]

    def __bool__(self) -> bool:
        return self.steps > 0

    def engine_metrics(self) -> dict[str, Any]:
        """The same numbers in the names SGLang and vLLM report (aggregated over the run)."""
        return {
            "sglang": {
                "spec_verify_ct": self.steps,
                "spec_accept_length": self.accept_length,
                "spec_accept_rate": self.accept_rate,
                "spec_num_correct_drafts": self.accepted_drafts,
                "spec_num_proposed_drafts": self.proposed_drafts,
                "spec_accept_histogram": list(self.histogram),
            },
            "vllm": {
                "num_drafts": self.steps,
                "num_draft_tokens": self.proposed_drafts,
                "num_accepted_tokens": self.accepted_drafts,
                "num_accepted_tokens_per_pos": list(self.accepted_at),
                "mean_acceptance_length": 1 + self.accepted_per_step if self.steps else math.nan,
            },
        }

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        out["engine_metrics"] = _json(self.engine_metrics())
        return out


def summarize_run(steps: StepArrays, positions: int | None = None) -> AcceptanceSummary:
    k = steps.max_proposed if positions is None else positions
    reached, acc = position_counts(steps.num_proposed, steps.accepted, k)
    n = steps.n_steps
    proposed = int(steps.num_proposed.sum())
    accepted = int(steps.accepted.sum())
    bonus = int(steps.bonus.sum())
    with np.errstate(invalid="ignore", divide="ignore"):
        cond = np.where(reached > 0, acc / np.maximum(reached, 1), np.nan)
    return AcceptanceSummary(
        requests=steps.n_requests,
        steps=n,
        proposed_drafts=proposed,
        accepted_drafts=accepted,
        bonus_tokens=bonus,
        accept_rate=accepted / proposed if proposed else math.nan,
        accepted_per_step=accepted / n if n else math.nan,
        accept_length=(accepted + bonus) / n if n else math.nan,
        histogram=tuple(int(x) for x in np.bincount(steps.accepted, minlength=k + 1)),
        reached=tuple(int(x) for x in reached),
        accepted_at=tuple(int(x) for x in acc),
        conditional=tuple(float(x) for x in cond),
        unconditional=tuple(float(x) / n if n else math.nan for x in acc),
    )
