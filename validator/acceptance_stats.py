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
    if not math.isfinite(var) or margin <= 0:
        return 0
    z = float(sps.norm.ppf(1 - alpha) + sps.norm.ppf(1 - (1 - power) / 2))
    return math.ceil(max(design_effect, 0.0) * z * z * var / (margin * margin))


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
        keys, inverse = (
            np.unique(rid.astype(str), return_inverse=True) if n else (np.array([], dtype=str), np.zeros(0))
        )
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
        return len(self.step)

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


# -- comparison results -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ComparisonSettings(_Result):
    margin: float
    alpha: float
    power: float
    resamples: int
    seed: int
    min_reached: int
    min_requests: int
    pair_by: str
    labels: tuple[str, str]
    positions: tuple[int, ...] | None


@dataclass(frozen=True)
class McNemarResult(_Result):
    """Paired steps (same request pair, same step index) where position k was reached in both runs."""

    position: int
    pairs: int
    both: int
    a_only: int
    b_only: int
    neither: int
    statistic: float
    p_value: float
    method: str
    significant: bool

    def __bool__(self) -> bool:
        return not self.significant


@dataclass(frozen=True)
class LogprobComparison(_Result):
    """Draft distributions at one position over paired steps with the same context (informational).

    ``kl_mean``: mean KL(A || B) over the tokens present in both top-k lists, each renormalised over
    them; ``topk_overlap``: mean |top_A & top_B| / min(k_A, k_B); ``argmax_agreement``: share of pairs
    whose top-1 token matches; ``logprob_abs_diff_mean``: mean |logprob_A - logprob_B| of the proposed
    token where both runs proposed the same token and gave its logprob.
    """

    position: int
    pairs: int
    argmax_agreement: float
    topk_overlap: float
    kl_pairs: int
    kl_mean: float
    kl_max: float
    logprob_pairs: int
    logprob_abs_diff_mean: float


@dataclass(frozen=True)
class PositionComparison(_Result):
    """Draft position ``position``: conditional rate P(accept k | reached k) per run and B - A.

    ``ci_*`` are Wilson intervals (independent trials); ``diff_ci`` (1 - alpha) and ``tost_ci``
    (1 - 2 alpha) are normal intervals with the request-level bootstrap standard error ``se`` (floored by
    the binomial one, see docs). ``uncond_*``: the vLLM-style rate accepted_k / steps.
    """

    position: int
    reached_a: int
    accepted_a: int
    reached_b: int
    accepted_b: int
    rate_a: float
    rate_b: float
    ci_a: tuple[float, float]
    ci_b: tuple[float, float]
    diff: float
    diff_ci: tuple[float, float]
    tost_ci: tuple[float, float]
    se: float
    se_bootstrap: float
    se_binomial: float
    design_effect: float
    p_difference: float
    p_equivalence: float
    uncond_a: float
    uncond_b: float
    uncond_ci_a: tuple[float, float]
    uncond_ci_b: tuple[float, float]
    uncond_diff: float
    uncond_diff_ci: tuple[float, float]
    verdict: Verdict
    selected: bool
    judged: bool
    needed_trials: int | None
    needed_steps: int | None
    mcnemar: McNemarResult | None = None
    logprobs: LogprobComparison | None = None

    def __bool__(self) -> bool:
        return self.verdict == "equivalent"


@dataclass(frozen=True)
class HistogramComparison(_Result):
    """Accepted-drafts histograms (index = drafts accepted in one step, bonus excluded)."""

    counts_a: tuple[int, ...]
    counts_b: tuple[int, ...]
    bins: tuple[tuple[int, int], ...]
    statistic: float
    dof: int
    p_value: float
    js_distance: float
    significant: bool

    def __bool__(self) -> bool:
        return not self.significant


@dataclass(frozen=True)
class MeanComparison(_Result):
    """A per-step mean of each run (ratio of sums) with bootstrap-SE intervals, and B - A."""

    name: str
    a: float
    b: float
    ci_a: tuple[float, float]
    ci_b: tuple[float, float]
    diff: float
    diff_ci: tuple[float, float]
    se: float

    def __bool__(self) -> bool:
        lo, hi = self.diff_ci
        return not (lo > 0 or hi < 0)


@dataclass(frozen=True)
class RequestDivergence(_Result):
    key: str
    request_a: str
    request_b: str
    steps_compared: int
    first_divergent_step: int | None
    first_divergent_token: int | None


@dataclass(frozen=True)
class DivergenceSummary(_Result):
    """Where paired requests' emitted tokens first differ (meaningful for greedy runs).

    ``source``: ``output_tokens``, ``target_tokens`` (accepted drafts + the target token at the bonus
    position) or ``proposed`` (accepted drafts only; a bonus-token difference shows one step later).
    """

    source: str
    requests: int
    diverged: int
    median_first_step: float
    per_request: tuple[RequestDivergence, ...]

    def __bool__(self) -> bool:
        return self.diverged == 0


@dataclass(frozen=True)
class AcceptanceComparison(_Result):
    verdict: Overall
    reasons: tuple[str, ...]
    notes: tuple[str, ...]
    positions: tuple[PositionComparison, ...]
    histogram: HistogramComparison
    accept_length: MeanComparison
    accepted_per_step: MeanComparison
    summary_a: AcceptanceSummary
    summary_b: AcceptanceSummary
    pairing: str
    paired_requests: int
    joint_bootstrap: bool
    divergence: DivergenceSummary | None
    settings: ComparisonSettings

    def __bool__(self) -> bool:
        return self.verdict == "pass"

    def format_table(self) -> str:
        return _format_table(self)


# -- the overall verdict ------------------------------------------------------------------------------


def _ranges(ks: Sequence[int]) -> str:
    out: list[str] = []
    for k in sorted(ks):
        if out and out[-1].split("-")[-1] == str(k - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{k}"
        else:
            out.append(str(k))
    return ", ".join(out)


def acceptance_verdict(
    positions: Sequence[PositionComparison], *, margin: float = 0.02, min_reached: int = 100
) -> tuple[Overall, tuple[str, ...]]:
    """``fail`` if any selected position is ``different``; ``pass`` if at least one position is judged
    (selected, enough data) and every judged position is ``equivalent``; else ``inconclusive``."""
    reasons: list[str] = []
    selected = [p for p in positions if p.selected]
    different = [p for p in selected if p.verdict == "different"]
    judged = [p for p in selected if p.judged]
    for p in different:
        reasons.append(
            f"position {p.position}: different (B-A = {p.diff:+.4f}, CI [{p.diff_ci[0]:+.4f}, {p.diff_ci[1]:+.4f}],"
            f" p = {p.p_difference:.2g}; beyond the margin {margin:g})"
        )
    for p in judged:
        if p.verdict == "inconclusive":
            reasons.append(
                f"position {p.position}: inconclusive (B-A = {p.diff:+.4f}, TOST CI [{p.tost_ci[0]:+.4f},"
                f" {p.tost_ci[1]:+.4f}] not within +-{margin:g}); needs about {p.needed_trials:,} reached trials"
                f" per run (have {p.reached_a:,} / {p.reached_b:,}), about {p.needed_steps:,} steps"
            )
    unjudged = [p.position for p in selected if not p.judged and p.verdict != "no_data"]
    if unjudged:
        reasons.append(
            f"positions {_ranges(unjudged)}: fewer than {min_reached} reached trials in a run; not judged"
        )
    nodata = [p.position for p in selected if p.verdict == "no_data"]
    if nodata:
        reasons.append(f"positions {_ranges(nodata)}: not reached in one of the runs; not judged")
    if different:
        return "fail", tuple(reasons)
    if not judged:
        return "inconclusive", (
            f"no position has {min_reached} or more reached trials in both runs",
            *reasons,
        )
    if all(p.verdict == "equivalent" for p in judged):
        eq = _ranges([p.position for p in judged])
        return "pass", (f"positions {eq}: equivalent within +-{margin:g} (TOST)", *reasons)
    return "inconclusive", tuple(reasons)


# -- the comparison -----------------------------------------------------------------------------------


def _nanstd(x: FloatArray) -> FloatArray:
    """Column standard deviation (ddof=1) over finite values; NaN with fewer than two (no warnings)."""
    ok = np.isfinite(x)
    n = ok.sum(axis=0)
    mean = np.where(ok, x, 0.0).sum(axis=0) / np.maximum(n, 1)
    ss = (np.where(ok, x - mean, 0.0) ** 2).sum(axis=0)
    return np.where(n > 1, np.sqrt(ss / np.maximum(n - 1, 1)), np.nan)


def _ratio(num: FloatArray, den: FloatArray) -> FloatArray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)


def _statistics(totals: FloatArray, k: int) -> FloatArray:
    """Totals (rows: [reached_k.., accepted_k.., steps, accepted, emitted]) -> [cond.., uncond.., aps, len]."""
    reached, acc = totals[:, :k], totals[:, k : 2 * k]
    steps, accsum, emitted = totals[:, 2 * k : 2 * k + 1], totals[:, 2 * k + 1], totals[:, 2 * k + 2]
    return np.hstack(
        [
            _ratio(acc, reached),
            _ratio(acc, steps),
            _ratio(accsum, steps[:, 0])[:, None],
            _ratio(emitted, steps[:, 0])[:, None],
        ]
    )


def _bootstrap(
    rng: np.random.Generator, ma: FloatArray, mb: FloatArray, resamples: int, joint: bool
) -> tuple[FloatArray, FloatArray]:
    """Resampled column totals: requests drawn with replacement (the same draw for both runs if joint)."""
    na, nb = ma.shape[0], mb.shape[0]
    out_a = np.full((resamples, ma.shape[1]), np.nan)
    out_b = np.full((resamples, mb.shape[1]), np.nan)
    chunk = max(1, min(resamples, 4_000_000 // max(na, nb, 1)))

    def weights(n: int, c: int) -> FloatArray:
        idx = rng.integers(0, n, size=(c, n)) + (np.arange(c) * n)[:, None]
        return np.bincount(idx.ravel(), minlength=c * n).reshape(c, n).astype(np.float64)

    for s in range(0, resamples, chunk):
        c = min(chunk, resamples - s)
        wa = weights(na, c) if na else None
        wb = wa if joint else (weights(nb, c) if nb else None)
        if wa is not None:
            out_a[s : s + c] = wa @ ma
        if wb is not None:
            out_b[s : s + c] = wb @ mb
    return out_a, out_b


def _hash_usable(s: StepArrays) -> bool:
    h = s.prompt_hashes
    return bool(h) and all(x is not None for x in h) and len(set(h)) == len(h)


def _pair(sa: StepArrays, sb: StepArrays, pair_by: PairBy) -> tuple[str, IntArray, IntArray]:
    empty = np.zeros(0, dtype=np.int64)
    if pair_by == "none":
        return "none", empty, empty
    if pair_by not in ("auto", "prompt_hash", "request_id"):
        raise ValueError(f"pair_by must be 'auto', 'prompt_hash', 'request_id' or 'none', got {pair_by!r}")
    usable = _hash_usable(sa) and _hash_usable(sb)
    if pair_by == "prompt_hash" and not usable:
        raise ValueError("pair_by='prompt_hash' needs one distinct prompt_hash per request in both runs")
    ka: Sequence[str | None]
    kb: Sequence[str | None]
    if pair_by == "prompt_hash" or (pair_by == "auto" and usable):
        mode, ka, kb = "prompt_hash", sa.prompt_hashes, sb.prompt_hashes
    else:
        if pair_by == "auto" and set(sa.request_ids) != set(sb.request_ids):
            return "none", empty, empty
        mode, ka, kb = "request_id", sa.request_ids, sb.request_ids
    where_b = {k: i for i, k in enumerate(kb)}
    pairs = [(i, where_b[k]) for i, k in enumerate(ka) if k in where_b]
    if not pairs:
        return "none", empty, empty
    arr = np.asarray(pairs, dtype=np.int64)
    return mode, arr[:, 0], arr[:, 1]


def _step_pairs(sa: StepArrays, sb: StepArrays, ma: IntArray, mb: IntArray) -> tuple[IntArray, IntArray]:
    """Rows of A and B for the same request pair and step index."""
    pa = np.full(sa.n_requests, -1, dtype=np.int64)
    pb = np.full(sb.n_requests, -1, dtype=np.int64)
    pa[ma] = np.arange(len(ma))
    pb[mb] = np.arange(len(mb))
    big = int(max(sa.step.max(initial=0), sb.step.max(initial=0))) + 1
    rows_a = np.flatnonzero(pa[sa.request] >= 0)
    rows_b = np.flatnonzero(pb[sb.request] >= 0)
    key_a = pa[sa.request[rows_a]] * big + sa.step[rows_a]
    key_b = pb[sb.request[rows_b]] * big + sb.step[rows_b]
    _, ia, ib = np.intersect1d(key_a, key_b, assume_unique=True, return_indices=True)
    return rows_a[ia], rows_b[ib]


def _mcnemar(
    sa: StepArrays, sb: StepArrays, rows_a: IntArray, rows_b: IntArray, k: int, alpha: float
) -> McNemarResult:
    na, aa = sa.num_proposed[rows_a], sa.accepted[rows_a]
    nb, ab = sb.num_proposed[rows_b], sb.accepted[rows_b]
    both_reached = (na > k) & (aa >= k) & (nb > k) & (ab >= k)
    xa, xb = (aa > k)[both_reached], (ab > k)[both_reached]
    a_only, b_only = int((xa & ~xb).sum()), int((~xa & xb).sum())
    stat, p, method = mcnemar_test(a_only, b_only)
    return McNemarResult(
        position=k,
        pairs=int(both_reached.sum()),
        both=int((xa & xb).sum()),
        a_only=a_only,
        b_only=b_only,
        neither=int((~xa & ~xb).sum()),
        statistic=stat,
        p_value=p,
        method=method,
        significant=p < alpha,
    )


def _emitted(s: StepArrays, row: int, source: str) -> list[int]:
    if source == "output_tokens":
        return [int(x) for x in s.output_tokens[row]]
    acc = int(s.accepted[row])
    toks = [int(x) for x in s.proposed[row][:acc]]
    if source == "target_tokens" and s.bonus[row]:
        tt = s.target_tokens[row]
        if len(tt) > acc:
            toks.append(int(tt[acc]))
    return toks


def _divergence_source(sa: StepArrays, sb: StepArrays, rows_a: IntArray, rows_b: IntArray) -> str | None:
    for source, ca, cb in (
        ("output_tokens", sa.output_tokens, sb.output_tokens),
        ("target_tokens", sa.target_tokens, sb.target_tokens),
        ("proposed", sa.proposed, sb.proposed),
    ):
        if (
            len(ca)
            and len(cb)
            and all(ca[i] is not None for i in rows_a)
            and all(cb[i] is not None for i in rows_b)
        ):
            return source
    return None


def _divergence(
    sa: StepArrays, sb: StepArrays, ma: IntArray, mb: IntArray, mode: str
) -> DivergenceSummary | None:
    starts_a, starts_b = sa.request_slices(), sb.request_slices()
    all_a = (
        np.concatenate([np.arange(starts_a[i], starts_a[i + 1]) for i in ma])
        if len(ma)
        else np.zeros(0, np.int64)
    )
    all_b = (
        np.concatenate([np.arange(starts_b[i], starts_b[i + 1]) for i in mb])
        if len(mb)
        else np.zeros(0, np.int64)
    )
    source = _divergence_source(sa, sb, all_a.astype(np.int64), all_b.astype(np.int64))
    if source is None:
        return None
    per: list[RequestDivergence] = []
    for ia, ib in zip(ma.tolist(), mb.tolist(), strict=True):
        ra = range(int(starts_a[ia]), int(starts_a[ia + 1]))
        rb = range(int(starts_b[ib]), int(starts_b[ib + 1]))
        i = j = offset = compared = 0
        first_step: int | None = None
        first_tok: int | None = None
        while i < len(ra) and j < len(rb):
            s_a, s_b = int(sa.step[ra[i]]), int(sb.step[rb[j]])
            if s_a != s_b:
                first_step, first_tok = min(s_a, s_b), offset
                break
            ea, eb = _emitted(sa, ra[i], source), _emitted(sb, rb[j], source)
            compared += 1
            if ea != eb:
                common = next((t for t, (x, y) in enumerate(zip(ea, eb)) if x != y), min(len(ea), len(eb)))
                first_step, first_tok = s_a, offset + common
                break
            offset += len(ea)
            i, j = i + 1, j + 1
        else:
            if i < len(ra) or j < len(rb):  # one run went on for more steps
                first_step = int(sa.step[ra[i]]) if i < len(ra) else int(sb.step[rb[j]])
                first_tok = offset
        key = sa.prompt_hashes[ia] if mode == "prompt_hash" else sa.request_ids[ia]
        per.append(
            RequestDivergence(
                key=str(key),
                request_a=sa.request_ids[ia],
                request_b=sb.request_ids[ib],
                steps_compared=compared,
                first_divergent_step=first_step,
                first_divergent_token=first_tok,
            )
        )
    firsts = [p.first_divergent_step for p in per if p.first_divergent_step is not None]
    return DivergenceSummary(
        source=source,
        requests=len(per),
        diverged=len(firsts),
        median_first_step=float(np.median(firsts)) if firsts else math.nan,
        per_request=tuple(per),
    )


def _top_kl(
    ids_a: Sequence[int], lp_a: Sequence[float], ids_b: Sequence[int], lp_b: Sequence[float]
) -> float:
    """KL(A || B) over the tokens in both top-k lists, each side renormalised over them (NaN if none)."""
    map_b = dict(zip((int(t) for t in ids_b), (float(x) for x in lp_b), strict=True))
    common = [(float(x), map_b[int(t)]) for t, x in zip(ids_a, lp_a, strict=True) if int(t) in map_b]
    if not common:
        return math.nan
    la, lb = np.array([c[0] for c in common]), np.array([c[1] for c in common])
    if not np.isfinite(la).any() or not np.isfinite(lb).any():
        return math.nan
    from scipy.special import logsumexp

    la, lb = la - logsumexp(la), lb - logsumexp(lb)
    pa = np.exp(la)
    live = pa > 0
    if np.any(~np.isfinite(lb[live])):
        return math.inf
    return float(max(0.0, np.sum(pa[live] * (la[live] - lb[live]))))


def _logprob_comparisons(
    sa: StepArrays,
    sb: StepArrays,
    rows_a: IntArray,
    rows_b: IntArray,
    ma: IntArray,
    divergence: DivergenceSummary | None,
    positions: int,
) -> dict[int, LogprobComparison]:
    """Per position, over paired steps up to each request's first divergent step with equal earlier drafts."""
    if divergence is None or not len(sa.draft_top_ids) or not len(sb.draft_top_ids) or not len(sa.proposed):
        return {}
    limit = {
        int(ia): (math.inf if d.first_divergent_step is None else d.first_divergent_step)
        for ia, d in zip(ma.tolist(), divergence.per_request, strict=True)
    }
    acc: dict[int, dict[str, list[float]]] = {}
    for ra, rb in zip(rows_a.tolist(), rows_b.tolist(), strict=True):
        if sa.step[ra] > limit[int(sa.request[ra])]:
            continue
        pa, pb = list(sa.proposed[ra]), list(sb.proposed[rb])
        ta, tb = sa.draft_top_ids[ra], sb.draft_top_ids[rb]
        fa, fb = sa.draft_logprob[ra], sb.draft_logprob[rb]
        for k in range(min(len(pa), len(pb), positions)):
            if pa[:k] != pb[:k]:
                break
            d = acc.setdefault(k, {"argmax": [], "overlap": [], "kl": [], "lp": []})
            if (
                fa is not None
                and fb is not None
                and pa[k] == pb[k]
                and fa[k] is not None
                and fb[k] is not None
            ):
                d["lp"].append(abs(float(fa[k]) - float(fb[k])))
            if ta is None or tb is None or ta[k] is None or tb[k] is None:
                continue
            la, lb = sa.draft_top_logprobs[ra][k], sb.draft_top_logprobs[rb][k]
            ida, idb = [int(t) for t in ta[k]], [int(t) for t in tb[k]]
            d["argmax"].append(float(ida[int(np.argmax(la))] == idb[int(np.argmax(lb))]))
            d["overlap"].append(len(set(ida) & set(idb)) / min(len(ida), len(idb)))
            kl = _top_kl(ida, la, idb, lb)
            if not math.isnan(kl):
                d["kl"].append(kl)
    out: dict[int, LogprobComparison] = {}
    for k, d in acc.items():
        if not d["argmax"] and not d["lp"]:
            continue
        out[k] = LogprobComparison(
            position=k,
            pairs=len(d["argmax"]),
            argmax_agreement=float(np.mean(d["argmax"])) if d["argmax"] else math.nan,
            topk_overlap=float(np.mean(d["overlap"])) if d["overlap"] else math.nan,
            kl_pairs=len(d["kl"]),
            kl_mean=float(np.mean(d["kl"])) if d["kl"] else math.nan,
            kl_max=float(np.max(d["kl"])) if d["kl"] else math.nan,
            logprob_pairs=len(d["lp"]),
            logprob_abs_diff_mean=float(np.mean(d["lp"])) if d["lp"] else math.nan,
        )
    return out


def _ci(est: float, se: float, z: float) -> tuple[float, float]:
    return (est - z * se, est + z * se)


def _floored(se_boot: float, se_iid: float, use_boot_alone: bool) -> float:
    if use_boot_alone and math.isfinite(se_boot):
        return se_boot
    return (
        float(np.nanmax([se_boot, se_iid])) if math.isfinite(se_iid) or math.isfinite(se_boot) else math.nan
    )


def _as_steps(x: Any) -> StepArrays:
    return x if isinstance(x, StepArrays) else StepArrays.from_frame(x)


def compare_acceptance(
    a: Any,
    b: Any,
    *,
    margin: float = 0.02,
    alpha: float = 0.05,
    power: float = 0.8,
    resamples: int = 2000,
    seed: int = 0,
    min_reached: int = 100,
    min_requests: int = 30,
    positions: Iterable[int] | None = None,
    pair_by: PairBy = "auto",
    labels: tuple[str, str] = ("A", "B"),
) -> AcceptanceComparison:
    """Compare run B (candidate) with run A (reference): DataFrames from ``validator.acceptance`` or
    :class:`StepArrays`. ``positions`` restricts which draft positions count towards the verdict."""
    if not 0 < margin < 1 or not 0 < alpha < 0.5 or not 0 < power < 1 or resamples < 2:
        raise ValueError("need 0 < margin < 1, 0 < alpha < 0.5, 0 < power < 1 and resamples >= 2")
    sa, sb = _as_steps(a), _as_steps(b)
    n_pos = max(sa.max_proposed, sb.max_proposed)
    selected = None if positions is None else tuple(sorted({int(k) for k in positions}))
    settings = ComparisonSettings(
        margin, alpha, power, resamples, seed, min_reached, min_requests, pair_by, labels, selected
    )
    sum_a, sum_b = summarize_run(sa, n_pos), summarize_run(sb, n_pos)
    mode, ma, mb = _pair(sa, sb, pair_by)
    joint = mode != "none" and len(ma) == sa.n_requests == sb.n_requests
    mat_a, mat_b = sa.per_request(n_pos), sb.per_request(n_pos)
    if joint:
        mat_a, mat_b = mat_a[ma], mat_b[mb]
    boot_a, boot_b = _bootstrap(np.random.default_rng(seed), mat_a, mat_b, resamples, joint)
    st_a, st_b = _statistics(boot_a, n_pos), _statistics(boot_b, n_pos)
    se_a, se_b, se_d = _nanstd(st_a), _nanstd(st_b), _nanstd(st_b - st_a)
    boot_alone = joint and len(ma) >= min_requests
    runs_boot_alone = min(sa.n_requests, sb.n_requests) >= min_requests
    z1, z2 = float(sps.norm.ppf(1 - alpha / 2)), float(sps.norm.ppf(1 - alpha))
    notes: list[str] = []

    rows_a = rows_b = np.zeros(0, dtype=np.int64)
    divergence = None
    if mode != "none":
        rows_a, rows_b = _step_pairs(sa, sb, ma, mb)
        divergence = _divergence(sa, sb, ma, mb, mode)
        notes.append(
            f"paired by {mode}: {len(ma)} requests, {len(rows_a)} steps"
            + ("" if joint else "; the request sets differ, so the bootstrap resamples each run on its own")
        )
    lp_cmp = _logprob_comparisons(sa, sb, rows_a, rows_b, ma, divergence, n_pos)

    out: list[PositionComparison] = []
    n_a, n_b = sa.n_steps, sb.n_steps
    for k in range(n_pos):
        ra, xa, rb, xb = sum_a.reached[k], sum_a.accepted_at[k], sum_b.reached[k], sum_b.accepted_at[k]
        pa, pb = (xa / ra if ra else math.nan), (xb / rb if rb else math.nan)
        ta, tb = (xa + 1) / (ra + 2), (xb + 1) / (rb + 2)  # Agresti-Caffo, for standard errors only
        se_bin = math.sqrt(ta * (1 - ta) / max(ra, 1) + tb * (1 - tb) / max(rb, 1))
        se = _floored(float(se_d[k]), se_bin, boot_alone)
        d = pb - pa
        p_eq, p_diff = tost_p_value(d, se, margin), _two_sided_p(d, se)
        deff = (se / se_bin) ** 2 if se_bin > 0 and math.isfinite(se) else math.nan
        verdict: Verdict
        if ra == 0 or rb == 0:
            verdict = "no_data"
        elif p_eq < alpha:
            verdict = "equivalent"
        elif p_diff < alpha and abs(d) > margin:
            verdict = "different"
        else:
            verdict = "inconclusive"
        needed = needed_steps = None
        if verdict == "inconclusive":
            needed = needed_trials(ta, tb, margin, alpha=alpha, power=power, design_effect=deff)
            reach = min(ra / n_a, rb / n_b)
            needed_steps = math.ceil(needed / reach)
        ua, ub = (xa / n_a if n_a else math.nan), (xb / n_b if n_b else math.nan)
        va, vb = (xa + 1) / (n_a + 2), (xb + 1) / (n_b + 2)
        se_u = _floored(
            float(se_d[n_pos + k]),
            math.sqrt(va * (1 - va) / max(n_a, 1) + vb * (1 - vb) / max(n_b, 1)),
            boot_alone,
        )
        is_sel = selected is None or k in selected
        mc = _mcnemar(sa, sb, rows_a, rows_b, k, alpha) if mode != "none" else None
        out.append(
            PositionComparison(
                position=k,
                reached_a=ra,
                accepted_a=xa,
                reached_b=rb,
                accepted_b=xb,
                rate_a=pa,
                rate_b=pb,
                ci_a=wilson_interval(xa, ra, alpha),
                ci_b=wilson_interval(xb, rb, alpha),
                diff=d,
                diff_ci=_ci(d, se, z1),
                tost_ci=_ci(d, se, z2),
                se=se,
                se_bootstrap=float(se_d[k]),
                se_binomial=se_bin,
                design_effect=deff,
                p_difference=p_diff,
                p_equivalence=p_eq,
                uncond_a=ua,
                uncond_b=ub,
                uncond_ci_a=wilson_interval(xa, n_a, alpha),
                uncond_ci_b=wilson_interval(xb, n_b, alpha),
                uncond_diff=ub - ua,
                uncond_diff_ci=_ci(ub - ua, se_u, z1),
                verdict=verdict,
                selected=is_sel,
                judged=is_sel and verdict != "no_data" and min(ra, rb) >= min_reached,
                needed_trials=needed,
                needed_steps=needed_steps,
                mcnemar=mc,
                logprobs=lp_cmp.get(k),
            )
        )

    def mean_cmp(name: str, col: int, per_step_a: FloatArray, per_step_b: FloatArray) -> MeanComparison:
        est_a = float(np.mean(per_step_a)) if len(per_step_a) else math.nan
        est_b = float(np.mean(per_step_b)) if len(per_step_b) else math.nan
        iid_a = (
            float(np.std(per_step_a, ddof=1) / math.sqrt(len(per_step_a)))
            if len(per_step_a) > 1
            else math.nan
        )
        iid_b = (
            float(np.std(per_step_b, ddof=1) / math.sqrt(len(per_step_b)))
            if len(per_step_b) > 1
            else math.nan
        )
        sa_ = _floored(float(se_a[col]), iid_a, runs_boot_alone)
        sb_ = _floored(float(se_b[col]), iid_b, runs_boot_alone)
        sd = _floored(float(se_d[col]), math.hypot(iid_a, iid_b), boot_alone)
        return MeanComparison(
            name,
            est_a,
            est_b,
            _ci(est_a, sa_, z1),
            _ci(est_b, sb_, z1),
            est_b - est_a,
            _ci(est_b - est_a, sd, z1),
            sd,
        )

    emitted_a = (sa.accepted + sa.bonus).astype(np.float64)
    emitted_b = (sb.accepted + sb.bonus).astype(np.float64)
    accept_length = mean_cmp("accept_length", 2 * n_pos + 1, emitted_a, emitted_b)
    accepted_per_step = mean_cmp(
        "accepted_per_step", 2 * n_pos, sa.accepted.astype(np.float64), sb.accepted.astype(np.float64)
    )
    stat, dof, p_hist, bins = chi2_homogeneity(sum_a.histogram, sum_b.histogram)
    histogram = HistogramComparison(
        counts_a=sum_a.histogram,
        counts_b=sum_b.histogram,
        bins=bins,
        statistic=stat,
        dof=dof,
        p_value=p_hist,
        js_distance=js_distance(sum_a.histogram, sum_b.histogram),
        significant=bool(p_hist < alpha),
    )

    verdict_all, reasons = acceptance_verdict(out, margin=margin, min_reached=min_reached)
    if n_a == 0 or n_b == 0:
        reasons = (f"run {labels[0] if n_a == 0 else labels[1]} has no verify steps", *reasons)
    if histogram.significant:
        notes.append(
            f"accepted-drafts histograms differ (chi-square {stat:.1f}, dof {dof}, p = {p_hist:.2g};"
            f" JS distance {histogram.js_distance:.4f}); informational, steps treated as independent"
        )
    if not accept_length:
        notes.append(
            f"accept length differs: {accept_length.a:.3f} -> {accept_length.b:.3f}"
            f" (B-A {accept_length.diff:+.3f}, CI [{accept_length.diff_ci[0]:+.3f}, {accept_length.diff_ci[1]:+.3f}])"
        )
    bonferroni = alpha / max(n_pos, 1)
    sig_mc = [p.position for p in out if p.mcnemar is not None and p.mcnemar.p_value < bonferroni]
    if sig_mc:
        notes.append(
            f"McNemar (paired steps) rejects at positions {_ranges(sig_mc)} (p < {bonferroni:.2g},"
            f" Bonferroni over {n_pos} positions)"
        )
    if divergence is not None and divergence.diverged:
        notes.append(
            f"{divergence.diverged}/{divergence.requests} paired requests diverge"
            f" (median first divergent step {divergence.median_first_step:g}; from {divergence.source})"
        )
    if not runs_boot_alone and not boot_alone:
        notes.append(
            f"fewer than {min_requests} requests in a run: standard errors are floored by the"
            " independent-trials ones, which ignore within-request correlation"
        )
    return AcceptanceComparison(
        verdict=verdict_all,
        reasons=reasons,
        notes=tuple(notes),
        positions=tuple(out),
        histogram=histogram,
        accept_length=accept_length,
        accepted_per_step=accepted_per_step,
        summary_a=sum_a,
        summary_b=sum_b,
        pairing=mode,
        paired_requests=len(ma),
        joint_bootstrap=joint,
        divergence=divergence,
        settings=settings,
    )


# -- text table ---------------------------------------------------------------------------------------


def _f(x: float, fmt: str) -> str:
    return "-" if x is None or not math.isfinite(x) else format(x, fmt)


def _format_table(c: AcceptanceComparison) -> str:
    s = c.settings
    la, lb = s.labels
    conf = f"{1 - s.alpha:.0%}"
    lines = [
        (
            f"Acceptance: {la} (reference) vs {lb} (candidate): {c.verdict.upper()}"
            f"  [margin +-{s.margin:g}, alpha {s.alpha:g}, pairing {c.pairing}]"
        ),
        f"steps {c.summary_a.steps:,} / {c.summary_b.steps:,}, requests {c.summary_a.requests:,} / {c.summary_b.requests:,}",
        "",
    ]
    paired = any(p.mcnemar is not None for p in c.positions)
    head = (
        f"{'pos':>3} {'reached A':>10} {'reached B':>10} {'P(acc|reach) A':>14} {'B':>7} {'B-A':>8}"
        f" {conf + ' CI':>19} {'TOST p':>7} {'uncond A':>8} {'B':>7} {'verdict':<13} {'need/run':>9}"
    )
    if paired:
        head += f" {'McNemar p':>9}"
    lines.append(head)
    for p in c.positions:
        ci = "-" if not math.isfinite(p.diff) else f"[{p.diff_ci[0]:+.4f}, {p.diff_ci[1]:+.4f}]"
        verdict = p.verdict + ("" if p.judged or p.verdict == "no_data" else "*")
        row = (
            f"{p.position:>3} {p.reached_a:>10,} {p.reached_b:>10,} {_f(p.rate_a, '.4f'):>14} {_f(p.rate_b, '.4f'):>7}"
            f" {_f(p.diff, '+.4f'):>8} {ci:>19} {_f(p.p_equivalence, '.3g'):>7} {_f(p.uncond_a, '.4f'):>8}"
            f" {_f(p.uncond_b, '.4f'):>7} {verdict:<13} {'' if p.needed_trials is None else f'{p.needed_trials:,}':>9}"
        )
        if paired:
            row += f" {'-' if p.mcnemar is None else _f(p.mcnemar.p_value, '.3g'):>9}"
        lines.append(row)
    lines.append("(* not counted in the verdict: not selected or too few reached trials)")
    lines.append("")
    for m, label in (
        (c.accept_length, "accept length (incl. bonus)"),
        (c.accepted_per_step, "accepted drafts/step"),
    ):
        lines.append(
            f"{label:<28} {la} {_f(m.a, '.4f')} [{_f(m.ci_a[0], '.4f')}, {_f(m.ci_a[1], '.4f')}]"
            f"  {lb} {_f(m.b, '.4f')} [{_f(m.ci_b[0], '.4f')}, {_f(m.ci_b[1], '.4f')}]"
            f"  B-A {_f(m.diff, '+.4f')} [{_f(m.diff_ci[0], '+.4f')}, {_f(m.diff_ci[1], '+.4f')}]"
        )
    h = c.histogram
    lines.append(
        f"{'accepted-drafts histogram':<28} chi-square {_f(h.statistic, '.2f')} (dof {h.dof}, {len(h.bins)} bins)"
        f" p {_f(h.p_value, '.3g')}, JS distance {_f(h.js_distance, '.4f')}"
    )
    if c.divergence is not None:
        d = c.divergence
        lines.append(
            f"{'greedy divergence':<28} {d.diverged}/{d.requests} requests diverge,"
            f" median first step {_f(d.median_first_step, 'g')} (from {d.source})"
        )
    lp = [p.logprobs for p in c.positions if p.logprobs is not None]
    if lp:
        lines.append(
            "draft logprobs (same-context pairs): "
            + "; ".join(
                f"pos {x.position}: argmax {_f(x.argmax_agreement, '.3f')}, overlap {_f(x.topk_overlap, '.3f')},"
                f" KL {_f(x.kl_mean, '.2e')}"
                for x in lp
            )
        )
    lines.append("")
    lines += [f"- {r}" for r in c.reasons]
    lines += [f"  note: {n}" for n in c.notes]
    return "\n".join(lines)
