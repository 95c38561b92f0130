"""Result types: frozen dataclasses with ``to_dict()`` (JSON-safe) and ``__bool__`` (the item passed its check),
and the text table of a whole comparison."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, is_dataclass
from typing import Any, Literal

import numpy as np

from validator.judging.text import acceptance_parting_line
from validator.numerics.jsonsafe import json_safe

Verdict = Literal["equivalent", "different", "inconclusive", "no_data"]
Overall = Literal["pass", "fail", "inconclusive"]
PairBy = Literal["auto", "prompt_hash", "request_id", "none"]


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
        return json_safe(float(v), nonfinite_as_null=True)
    return v


class _Result:
    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = _json(self)
        return out


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



# -- comparison results -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ComparisonSettings(_Result):
    """``margin``: the equivalence margin's half-width on the ``margin_scale`` (``log_odds``: the log odds
    ratio of the rates; ``absolute``: the rate difference); see :mod:`.margin`."""

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
    margin_scale: str = "log_odds"

    def margin_text(self) -> str:
        if self.margin_scale == "absolute":
            return f"+-{self.margin:g}"
        return f"log odds +-{self.margin:g}"


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

    ``effect`` is what the margin is tested on (:mod:`.margin`): the log odds ratio of the rates by default,
    ``diff`` (= B - A of the rates) with an absolute margin. ``ci_*`` are Wilson intervals (independent
    trials); ``effect_ci`` (1 - alpha; Student t with requests - 1 degrees of freedom, matching
    ``p_difference``) and ``tost_ci`` (1 - 2 alpha; normal, matching the TOST) are intervals of the effect
    with the request-level bootstrap standard error ``se`` (floored by the independent-trials one
    ``se_binomial``, see docs); ``diff_ci`` is the same t interval for the rate difference (informational
    under a log-odds margin). ``uncond_*``: the vLLM-style rate accepted_k / steps.
    ``p_difference`` is the raw two-sided p-value; ``p_difference_adjusted`` the Holm-adjusted one over the
    tests that can fail the run (:class:`Multiplicity`), NaN for a position outside that family. A position
    in the family is ``different`` only on its adjusted p-value; one outside it (not selected) on its raw one.
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
    p_difference_adjusted: float = math.nan
    effect: float = math.nan
    effect_ci: tuple[float, float] = (math.nan, math.nan)

    def __bool__(self) -> bool:
        return self.verdict == "equivalent"


@dataclass(frozen=True)
class Multiplicity(_Result):
    """How the run-level ``fail`` is protected against testing several things at once.

    ``family``: the tests that can fail the run (``"position k"`` for each selected position reached in both
    runs), each at its raw p-value, adjusted together by ``method`` (Holm's step-down), so the chance that
    equal runs fail is at most ``alpha`` however many positions there are. Tests outside the family
    (histogram, means, McNemar) are informational and cannot fail the run.
    """

    method: str
    alpha: float
    size: int
    family: tuple[str, ...]
    p_raw: tuple[float, ...]
    p_adjusted: tuple[float, ...]


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
class RequestParting(_Result):
    """One paired request: where its acceptance and its greedy output first part (None: they do not)."""

    key: str
    request_a: str
    request_b: str
    acceptance_step: int | None
    acceptance_position: int | None  # None with a step: a step only one run has
    output_step: int | None = None
    output_token: int | None = None

    @property
    def acceptance_parted(self) -> bool:
        return self.acceptance_step is not None

    @property
    def output_parted(self) -> bool:
        return self.output_step is not None


@dataclass(frozen=True)
class AcceptanceFrontier(_Result):
    """The first parting of acceptance and of greedy output over the paired requests. ``output_source``:
    the tokens compared for the output (None: the records carry none, and the output fields stay None)."""

    requests: int
    acceptance_parted: int
    first_acceptance: RequestParting | None
    output_source: str | None
    output_parted: int | None
    first_output: RequestParting | None
    per_request: tuple[RequestParting, ...]

    def __bool__(self) -> bool:
        return self.first_acceptance is None and self.first_output is None


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
    multiplicity: Multiplicity | None = None
    frontier: AcceptanceFrontier | None = None  # where acceptance and greedy output first part (paired runs)

    def __bool__(self) -> bool:
        return self.verdict == "pass"

    def format_table(self) -> str:
        return _format_table(self)


# -- text table ---------------------------------------------------------------------------------------


def _f(x: float, fmt: str) -> str:
    return "-" if x is None or not math.isfinite(x) else format(x, fmt)


def _format_table(c: AcceptanceComparison) -> str:
    s = c.settings
    la, lb = s.labels
    conf = f"{1 - s.alpha:.0%}"
    m = c.multiplicity
    holm = "" if m is None else f" ({m.method.capitalize()} over {m.size} test{'' if m.size == 1 else 's'})"
    lines = [
        (
            f"Acceptance: {la} (reference) vs {lb} (candidate): {c.verdict.upper()}"
            f"  [margin {s.margin_text()}, alpha {s.alpha:g}{holm}, pairing {c.pairing}]"
        ),
        f"steps {c.summary_a.steps:,} / {c.summary_b.steps:,}, requests {c.summary_a.requests:,} / {c.summary_b.requests:,}",
        "",
    ]
    paired = any(p.mcnemar is not None for p in c.positions)
    log_odds = s.margin_scale != "absolute"
    head = (
        f"{'pos':>3} {'reached A':>10} {'reached B':>10} {'P(acc|reach) A':>14} {'B':>7} {'B-A':>8}"
        + (f" {'log OR':>8}" if log_odds else "")
        + f" {conf + ' CI':>19} {'p':>7} {'Holm p':>7} {'TOST p':>7} {'uncond A':>8} {'B':>7} {'verdict':<13} {'need/run':>9}"
    )
    if paired:
        head += f" {'McNemar p':>9}"
    lines.append(head)
    for p in c.positions:
        lo, hi = p.effect_ci
        ci = "-" if not math.isfinite(p.effect) else f"[{lo:+.4f}, {hi:+.4f}]"
        verdict = p.verdict + ("" if p.judged or p.verdict == "no_data" else "*")
        row = (
            f"{p.position:>3} {p.reached_a:>10,} {p.reached_b:>10,} {_f(p.rate_a, '.4f'):>14} {_f(p.rate_b, '.4f'):>7}"
            f" {_f(p.diff, '+.4f'):>8}"
            + (f" {_f(p.effect, '+.4f'):>8}" if log_odds else "")
            + f" {ci:>19} {_f(p.p_difference, '.2g'):>7} {_f(p.p_difference_adjusted, '.2g'):>7}"
            f" {_f(p.p_equivalence, '.3g'):>7} {_f(p.uncond_a, '.4f'):>8}"
            f" {_f(p.uncond_b, '.4f'):>7} {verdict:<13} {'' if p.needed_trials is None else f'{p.needed_trials:,}':>9}"
        )
        if paired:
            row += f" {'-' if p.mcnemar is None else _f(p.mcnemar.p_value, '.3g'):>9}"
        lines.append(row)
    lines.append("(* not counted in the verdict: not selected or too few reached trials)")
    lines.append("")
    for mean, label in (
        (c.accept_length, "accept length (incl. bonus)"),
        (c.accepted_per_step, "accepted drafts/step"),
    ):
        lines.append(
            f"{label:<28} {la} {_f(mean.a, '.4f')} [{_f(mean.ci_a[0], '.4f')}, {_f(mean.ci_a[1], '.4f')}]"
            f"  {lb} {_f(mean.b, '.4f')} [{_f(mean.ci_b[0], '.4f')}, {_f(mean.ci_b[1], '.4f')}]"
            f"  B-A {_f(mean.diff, '+.4f')} [{_f(mean.diff_ci[0], '+.4f')}, {_f(mean.diff_ci[1], '+.4f')}]"
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
    if c.frontier is not None:
        lines.append(f"{'first parting':<28} " + acceptance_parting_line(c.frontier.to_dict()))
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
