"""Two runs compared per draft position (:func:`compare_acceptance`) and the overall verdict.

Rates are ratios of counts summed over steps; standard errors come from the request-level bootstrap
(:mod:`.steps`), floored by the independent-trials ones when there are too few requests to trust
the bootstrap alone. Run A is the reference, B the candidate; differences are B - A.

Each position is tested on its margin's scale (:mod:`.margin`): by default the log odds ratio of the two
conditional rates, so that a halving is never equivalent at any rate; the rate difference where an
absolute margin was asked for.

Several positions are tested at once, and any one of them can fail the run, so the difference tests
that can fail it are Holm-adjusted together (:func:`validator.judging.holm.holm_adjust`): equal runs fail with
probability at most ``alpha`` overall, not ``alpha`` per position.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats as sps

from validator.judging.acceptance.first_parting import AcceptanceFrontier, acceptance_frontier
from validator.judging.acceptance.margin import Margin, resolve_margin
from validator.judging.acceptance.pairing import (
    divergence_summary,
    logprob_comparisons,
    pair_requests,
    paired_mcnemar,
    step_pairs,
)
from validator.judging.acceptance.primitives import (
    FloatArray,
    chi2_homogeneity,
    equivalence_verdict,
    js_distance,
    tost_p_value,
    two_sided_p,
    wilson_interval,
)
from validator.judging.acceptance.results import (
    AcceptanceComparison,
    AcceptanceSummary,
    ComparisonSettings,
    DivergenceSummary,
    HistogramComparison,
    LogprobComparison,
    McNemarResult,
    MeanComparison,
    Multiplicity,
    Overall,
    PairBy,
    PositionComparison,
    Verdict,
)
from validator.judging.acceptance.steps import (
    StepArrays,
    bootstrap,
    log_odds_columns,
    nanstd,
    rates,
    summarize_run,
)
from validator.judging.holm import holm_adjust

# -- standard errors and intervals --------------------------------------------------------------------


def _ci(est: float, se: float, z: float) -> tuple[float, float]:
    return (est - z * se, est + z * se)


def _floored(se_boot: float, se_iid: float, use_boot_alone: bool) -> float:
    if use_boot_alone and math.isfinite(se_boot):
        return se_boot
    return (
        float(np.nanmax([se_boot, se_iid])) if math.isfinite(se_iid) or math.isfinite(se_boot) else math.nan
    )


def _rate(x: float, n: float) -> float:
    return x / n if n else math.nan


def _shrunk(x: float, n: float) -> float:
    """Agresti-Caffo: (x + 1) / (n + 2), for standard errors only."""
    return (x + 1) / (n + 2)


def _binomial_se(pa: float, na: int, pb: float, nb: int) -> float:
    """Standard error of ``pb - pa`` for independent trials (counts floored at 1)."""
    return math.sqrt(pa * (1 - pa) / max(na, 1) + pb * (1 - pb) / max(nb, 1))


def _mean(x: FloatArray) -> float:
    return float(np.mean(x)) if len(x) else math.nan


def _iid_se(x: FloatArray) -> float:
    """Standard error of the mean for independent values (NaN with fewer than two)."""
    return float(np.std(x, ddof=1) / math.sqrt(len(x))) if len(x) > 1 else math.nan


@dataclass(frozen=True)
class _Context:
    """What each per-position and per-step-mean comparison needs besides its own counts."""

    settings: ComparisonSettings
    margin: Margin
    positions: int  # K; statistic columns: [conditional 0..K-1, unconditional 0..K-1, accepted/step, length]
    z: float  # two-sided (1 - alpha) normal quantile
    df: float  # degrees of freedom of a rate difference's standard error: requests bootstrapped - 1
    t: float  # two-sided (1 - alpha) quantile of Student's t with df: the interval that matches p_diff
    z_tost: float  # one-sided (1 - alpha) quantile: the (1 - 2 alpha) interval that matches the TOST
    se_a: FloatArray  # bootstrap standard error of each statistic column, run A
    se_b: FloatArray
    se_diff: FloatArray  # ... of B - A
    se_effect: FloatArray  # bootstrap standard error of each position's effect on the margin's scale
    diff_alone: bool  # joint bootstrap over at least min_requests pairs: B - A errors are not floored
    runs_alone: bool  # both runs have at least min_requests requests: per-run errors are not floored


# -- per position and per step ------------------------------------------------------------------------


def _selected(s: ComparisonSettings, k: int) -> bool:
    return s.positions is None or k in s.positions


def _difference(
    ctx: _Context, k: int, sum_a: AcceptanceSummary, sum_b: AcceptanceSummary
) -> tuple[float, float, float]:
    """B against A at position k on the margin's scale (the tested effect), its standard error, and the
    independent-trials one."""
    ra, xa, rb, xb = sum_a.reached[k], sum_a.accepted_at[k], sum_b.reached[k], sum_b.accepted_at[k]
    se_iid = ctx.margin.effect_se(xa, ra, xb, rb)
    se = _floored(float(ctx.se_effect[k]), se_iid, ctx.diff_alone)
    return ctx.margin.effect(xa, ra, xb, rb), se, se_iid


def _multiplicity(
    ctx: _Context, sum_a: AcceptanceSummary, sum_b: AcceptanceSummary
) -> tuple[Multiplicity, dict[int, float]]:
    """The tests that can fail the run, Holm-adjusted together: the difference test of every selected
    position reached in both runs (the histogram, means and McNemar tests are notes and cannot fail it).
    Also returns position -> adjusted p-value for the positions in the family."""
    ks: list[int] = []
    raw: list[float] = []
    for k in range(ctx.positions):
        if not _selected(ctx.settings, k) or sum_a.reached[k] == 0 or sum_b.reached[k] == 0:
            continue
        d, se, _ = _difference(ctx, k, sum_a, sum_b)
        p = two_sided_p(d, se, ctx.df)
        if math.isfinite(p):
            ks.append(k)
            raw.append(p)
    adjusted = [float(x) for x in holm_adjust(raw)]
    mult = Multiplicity(
        method="holm",
        alpha=ctx.settings.alpha,
        size=len(ks),
        family=tuple(f"position {k}" for k in ks),
        p_raw=tuple(raw),
        p_adjusted=tuple(adjusted),
    )
    return mult, dict(zip(ks, adjusted, strict=True))


def _position(
    ctx: _Context,
    k: int,
    sum_a: AcceptanceSummary,
    sum_b: AcceptanceSummary,
    p_adjusted: float | None,
    mcnemar: McNemarResult | None,
    logprobs: LogprobComparison | None,
) -> PositionComparison:
    """``p_adjusted``: the Holm-adjusted difference p-value when k is in the family (it then decides
    ``different``), None when it is not (not selected: the raw p-value decides, for information)."""
    s, m = ctx.settings, ctx.margin
    ra, xa, rb, xb = sum_a.reached[k], sum_a.accepted_at[k], sum_b.reached[k], sum_b.accepted_at[k]
    n_a, n_b = sum_a.steps, sum_b.steps
    pa, pb = _rate(xa, ra), _rate(xb, rb)
    ta, tb = _shrunk(xa, ra), _shrunk(xb, rb)
    d = pb - pa
    effect, se, se_bin = _difference(ctx, k, sum_a, sum_b)
    p_eq, p_diff = tost_p_value(effect, se, m.width), two_sided_p(effect, se, ctx.df)
    p_test = p_diff if p_adjusted is None else p_adjusted
    deff = (se / se_bin) ** 2 if se_bin > 0 and math.isfinite(se) else math.nan
    verdict: Verdict = (
        "no_data"
        if ra == 0 or rb == 0
        else equivalence_verdict(effect, p_eq, p_test, margin=m.width, alpha=s.alpha)
    )
    needed = needed_steps = None
    if verdict == "inconclusive":
        needed = m.needed_trials(ta, tb, alpha=s.alpha, power=s.power, design_effect=deff)
        needed_steps = math.ceil(needed / min(ra / n_a, rb / n_b))
    se_rate = (
        se
        if m.scale == "absolute"
        else _floored(float(ctx.se_diff[k]), _binomial_se(ta, ra, tb, rb), ctx.diff_alone)
    )
    ua, ub = _rate(xa, n_a), _rate(xb, n_b)
    se_u = _floored(
        float(ctx.se_diff[ctx.positions + k]),
        _binomial_se(_shrunk(xa, n_a), n_a, _shrunk(xb, n_b), n_b),
        ctx.diff_alone,
    )
    is_sel = _selected(s, k)
    return PositionComparison(
        position=k,
        reached_a=ra,
        accepted_a=xa,
        reached_b=rb,
        accepted_b=xb,
        rate_a=pa,
        rate_b=pb,
        ci_a=wilson_interval(xa, ra, s.alpha),
        ci_b=wilson_interval(xb, rb, s.alpha),
        diff=d,
        diff_ci=_ci(d, se_rate, ctx.t),
        tost_ci=_ci(effect, se, ctx.z_tost),
        se=se,
        se_bootstrap=float(ctx.se_effect[k]),
        se_binomial=se_bin,
        design_effect=deff,
        p_difference=p_diff,
        p_equivalence=p_eq,
        uncond_a=ua,
        uncond_b=ub,
        uncond_ci_a=wilson_interval(xa, n_a, s.alpha),
        uncond_ci_b=wilson_interval(xb, n_b, s.alpha),
        uncond_diff=ub - ua,
        uncond_diff_ci=_ci(ub - ua, se_u, ctx.t),
        verdict=verdict,
        selected=is_sel,
        judged=is_sel and verdict != "no_data" and min(ra, rb) >= s.min_reached,
        needed_trials=needed,
        needed_steps=needed_steps,
        mcnemar=mcnemar,
        logprobs=logprobs,
        p_difference_adjusted=math.nan if p_adjusted is None else p_adjusted,
        effect=effect,
        effect_ci=_ci(effect, se, ctx.t),
    )


def _mean_comparison(
    ctx: _Context, name: str, col: int, per_step_a: FloatArray, per_step_b: FloatArray
) -> MeanComparison:
    est_a, est_b = _mean(per_step_a), _mean(per_step_b)
    iid_a, iid_b = _iid_se(per_step_a), _iid_se(per_step_b)
    se_a = _floored(float(ctx.se_a[col]), iid_a, ctx.runs_alone)
    se_b = _floored(float(ctx.se_b[col]), iid_b, ctx.runs_alone)
    se_d = _floored(float(ctx.se_diff[col]), math.hypot(iid_a, iid_b), ctx.diff_alone)
    return MeanComparison(
        name,
        est_a,
        est_b,
        _ci(est_a, se_a, ctx.z),
        _ci(est_b, se_b, ctx.z),
        est_b - est_a,
        _ci(est_b - est_a, se_d, ctx.z),
        se_d,
    )


def _histogram(sum_a: AcceptanceSummary, sum_b: AcceptanceSummary, alpha: float) -> HistogramComparison:
    stat, dof, p_hist, bins = chi2_homogeneity(sum_a.histogram, sum_b.histogram)
    return HistogramComparison(
        counts_a=sum_a.histogram,
        counts_b=sum_b.histogram,
        bins=bins,
        statistic=stat,
        dof=dof,
        p_value=p_hist,
        js_distance=js_distance(sum_a.histogram, sum_b.histogram),
        significant=bool(p_hist < alpha),
    )


def _notes(
    ctx: _Context,
    positions: Sequence[PositionComparison],
    histogram: HistogramComparison,
    accept_length: MeanComparison,
    divergence: DivergenceSummary | None,
) -> list[str]:
    """The informational findings that do not change the verdict."""
    s, h, n_pos = ctx.settings, histogram, ctx.positions
    notes: list[str] = []
    saved = [
        p
        for p in positions
        if p.selected
        and p.verdict != "different"
        and p.p_difference < s.alpha
        and abs(p.effect) > s.margin
        and math.isfinite(p.p_difference_adjusted)
    ]
    for p in saved:
        notes.append(
            f"position {p.position}: p = {p.p_difference:.2g} would reject alone, but not after the Holm"
            f" adjustment over the tests that can fail the run (adjusted p = {p.p_difference_adjusted:.2g})"
        )
    if h.significant:
        notes.append(
            f"accepted-drafts histograms differ (chi-square {h.statistic:.1f}, dof {h.dof}, p = {h.p_value:.2g};"
            f" JS distance {h.js_distance:.4f}); informational, steps treated as independent"
        )
    if not accept_length:
        notes.append(
            f"accept length differs: {accept_length.a:.3f} -> {accept_length.b:.3f}"
            f" (B-A {accept_length.diff:+.3f}, CI [{accept_length.diff_ci[0]:+.3f}, {accept_length.diff_ci[1]:+.3f}])"
        )
    bonferroni = s.alpha / max(n_pos, 1)
    sig_mc = [p.position for p in positions if p.mcnemar is not None and p.mcnemar.p_value < bonferroni]
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
    if not ctx.runs_alone and not ctx.diff_alone:
        notes.append(
            f"fewer than {s.min_requests} requests in a run: standard errors are floored by the"
            " independent-trials ones, which ignore within-request correlation"
        )
    return notes


# -- the comparison -----------------------------------------------------------------------------------


def _as_steps(x: Any) -> StepArrays:
    return x if isinstance(x, StepArrays) else StepArrays.from_frame(x)


def compare_acceptance(
    a: Any,
    b: Any,
    *,
    margin: float | None = None,
    log_odds_margin: float | None = None,
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
    """Compare run B (candidate) with run A (reference): DataFrames from ``validator.runs.acceptance_records`` or
    :class:`StepArrays`. ``positions`` restricts which draft positions count towards the verdict.

    The equivalence margin (:mod:`.margin`): ``log_odds_margin`` on the log odds ratio of the rates
    (default :data:`.margin.DEFAULT_LOG_ODDS_MARGIN` when neither is given), or ``margin``, absolute on the
    rate difference; not both."""
    m = resolve_margin(margin, log_odds_margin)
    if not 0 < alpha < 0.5 or not 0 < power < 1 or resamples < 2:
        raise ValueError("need 0 < alpha < 0.5, 0 < power < 1 and resamples >= 2")
    sa, sb = _as_steps(a), _as_steps(b)
    n_pos = max(sa.max_proposed, sb.max_proposed)
    selected = None if positions is None else tuple(sorted({int(k) for k in positions}))
    settings = ComparisonSettings(
        m.width, alpha, power, resamples, seed, min_reached, min_requests, pair_by, labels, selected, m.scale
    )
    sum_a, sum_b = summarize_run(sa, n_pos), summarize_run(sb, n_pos)
    mode, ma, mb = pair_requests(sa, sb, pair_by)
    joint = mode != "none" and len(ma) == sa.n_requests == sb.n_requests
    mat_a, mat_b = sa.per_request(n_pos), sb.per_request(n_pos)
    if joint:
        mat_a, mat_b = mat_a[ma], mat_b[mb]
    boot_a, boot_b = bootstrap(np.random.default_rng(seed), mat_a, mat_b, resamples, joint)
    st_a, st_b = rates(boot_a, n_pos), rates(boot_b, n_pos)
    df = max((len(ma) if joint else min(sa.n_requests, sb.n_requests)) - 1, 1)
    se_diff = nanstd(st_b - st_a)
    se_effect = (
        se_diff[:n_pos]
        if m.scale == "absolute"
        else nanstd(log_odds_columns(boot_b, n_pos) - log_odds_columns(boot_a, n_pos))
    )
    ctx = _Context(
        settings=settings,
        margin=m,
        positions=n_pos,
        z=float(sps.norm.ppf(1 - alpha / 2)),
        df=df,
        t=float(sps.t.ppf(1 - alpha / 2, df)),
        z_tost=float(sps.norm.ppf(1 - alpha)),
        se_a=nanstd(st_a),
        se_b=nanstd(st_b),
        se_diff=se_diff,
        se_effect=se_effect,
        diff_alone=joint and len(ma) >= min_requests,
        runs_alone=min(sa.n_requests, sb.n_requests) >= min_requests,
    )
    notes: list[str] = []

    rows_a = rows_b = np.zeros(0, dtype=np.int64)
    divergence = None
    frontier: AcceptanceFrontier | None = None
    if mode != "none":
        rows_a, rows_b = step_pairs(sa, sb, ma, mb)
        divergence = divergence_summary(sa, sb, ma, mb, mode)
        frontier = acceptance_frontier(sa, sb, ma, mb, mode, divergence)
        notes.append(
            f"paired by {mode}: {len(ma)} requests, {len(rows_a)} steps"
            + ("" if joint else "; the request sets differ, so the bootstrap resamples each run on its own")
        )
    lp_cmp = logprob_comparisons(sa, sb, rows_a, rows_b, ma, divergence, n_pos)
    multiplicity, adjusted = _multiplicity(ctx, sum_a, sum_b)
    out = [
        _position(
            ctx,
            k,
            sum_a,
            sum_b,
            adjusted.get(k),
            paired_mcnemar(sa, sb, rows_a, rows_b, k, alpha) if mode != "none" else None,
            lp_cmp.get(k),
        )
        for k in range(n_pos)
    ]
    emitted_a = (sa.accepted + sa.bonus).astype(np.float64)
    emitted_b = (sb.accepted + sb.bonus).astype(np.float64)
    accept_length = _mean_comparison(ctx, "accept_length", 2 * n_pos + 1, emitted_a, emitted_b)
    accepted_per_step = _mean_comparison(
        ctx, "accepted_per_step", 2 * n_pos, sa.accepted.astype(np.float64), sb.accepted.astype(np.float64)
    )
    histogram = _histogram(sum_a, sum_b, alpha)

    verdict, reasons = acceptance_verdict(out, margin=m, min_reached=min_reached)
    if sa.n_steps == 0 or sb.n_steps == 0:
        reasons = (f"run {labels[0] if sa.n_steps == 0 else labels[1]} has no verify steps", *reasons)
    notes += _notes(ctx, out, histogram, accept_length, divergence)
    return AcceptanceComparison(
        verdict=verdict,
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
        multiplicity=multiplicity,
        frontier=frontier,
    )


# -- the overall verdict ------------------------------------------------------------------------------


def _ranges(ks: Sequence[int]) -> str:
    out: list[str] = []
    for k in sorted(ks):
        if out and out[-1].split("-")[-1] == str(k - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{k}"
        else:
            out.append(str(k))
    return ", ".join(out)


def _effect_text(p: PositionComparison, m: Margin) -> str:
    if m.scale == "absolute":
        return f"B-A = {p.diff:+.4f}"
    return f"rate {p.rate_a:.4g} -> {p.rate_b:.4g}, log odds ratio {p.effect:+.4f}"


def acceptance_verdict(
    positions: Sequence[PositionComparison], *, margin: Margin | float | None = None, min_reached: int = 100
) -> tuple[Overall, tuple[str, ...]]:
    """``fail`` if any selected position is ``different``; ``pass`` if at least one position is judged
    (selected, enough data) and every judged position is ``equivalent``; else ``inconclusive``.

    A position's ``different`` already rests on its Holm-adjusted p-value (see :func:`compare_acceptance`),
    so ``fail`` has a family-wise error of at most ``alpha``. ``pass`` needs every judged position's TOST
    to reject on its own: an intersection-union test, whose error is at most ``alpha`` with no adjustment.
    ``margin``: the one the positions were tested with (a float is absolute; None the default log-odds one),
    for the reasons' wording.
    """
    m = margin if isinstance(margin, Margin) else resolve_margin(margin)
    reasons: list[str] = []
    selected = [p for p in positions if p.selected]
    different = [p for p in selected if p.verdict == "different"]
    judged = [p for p in selected if p.judged]
    for p in different:
        adj = p.p_difference_adjusted
        holm = f", Holm-adjusted p = {adj:.2g}" if math.isfinite(adj) else ""
        reasons.append(
            f"position {p.position}: different ({_effect_text(p, m)}, CI [{p.effect_ci[0]:+.4f},"
            f" {p.effect_ci[1]:+.4f}], p = {p.p_difference:.2g}{holm}; beyond the margin {m.describe()})"
        )
    for p in judged:
        if p.verdict == "inconclusive":
            reasons.append(
                f"position {p.position}: inconclusive ({_effect_text(p, m)}, TOST CI [{p.tost_ci[0]:+.4f},"
                f" {p.tost_ci[1]:+.4f}] not within {m.describe()}); needs about {p.needed_trials:,} reached"
                f" trials per run (have {p.reached_a:,} / {p.reached_b:,}), about {p.needed_steps:,} steps"
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
        return "pass", (f"positions {eq}: equivalent within {m.describe()} (TOST)", *reasons)
    return "inconclusive", tuple(reasons)
