"""Acceptance statistics for speculative decoding: two runs, per draft position. Pure numpy/scipy, no I/O.

Definitions (see docs/metrics.md, "Acceptance metrics"): for a verify step with ``n`` proposed drafts of which
``a`` were accepted, draft position ``k`` (0-based) was *reached* when ``n > k and a >= k`` and
*accepted* when ``a > k``. Rates are ratios of counts summed over steps; every uncertainty that crosses
steps is estimated with a request-level (prompt-level) bootstrap, because the steps of one request are
correlated. Run A is the reference, B the candidate; differences are B - A.

Inputs are :class:`StepArrays` (build one from an acceptance DataFrame with :meth:`StepArrays.from_frame`,
or pass the DataFrame directly to :func:`compare_acceptance`). Results are frozen dataclasses with
``to_dict()`` (JSON-safe) and ``__bool__`` (the item passed its check).

Modules: ``margin`` (the equivalence margin: log odds by default, absolute on request), ``primitives`` (intervals, TOST, trials needed, chi-square, JS distance, McNemar), ``steps``
(:class:`StepArrays`, :func:`summarize_run`, the request-level bootstrap), ``results`` (the result types
and the text table), ``pairing`` (requests and steps matched across runs, McNemar, greedy divergence,
draft logprobs) and ``compare`` (:func:`compare_acceptance`, :func:`acceptance_verdict`).
"""

from validator.judging.acceptance.comparison import acceptance_verdict, compare_acceptance
from validator.judging.acceptance.first_parting import AcceptanceFrontier, RequestParting, acceptance_frontier
from validator.judging.acceptance.margin import DEFAULT_LOG_ODDS_MARGIN, Margin, resolve_margin
from validator.judging.acceptance.primitives import (
    chi2_homogeneity,
    equivalence_verdict,
    js_distance,
    mcnemar_test,
    needed_trials,
    position_counts,
    tost_p_value,
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
    PositionComparison,
    RequestDivergence,
)
from validator.judging.acceptance.steps import StepArrays, summarize_run
from validator.judging.holm import holm_adjust

__all__ = [
    "DEFAULT_LOG_ODDS_MARGIN",
    "AcceptanceComparison",
    "AcceptanceFrontier",
    "AcceptanceSummary",
    "ComparisonSettings",
    "DivergenceSummary",
    "HistogramComparison",
    "LogprobComparison",
    "Margin",
    "McNemarResult",
    "MeanComparison",
    "Multiplicity",
    "PositionComparison",
    "RequestDivergence",
    "RequestParting",
    "StepArrays",
    "acceptance_frontier",
    "acceptance_verdict",
    "chi2_homogeneity",
    "compare_acceptance",
    "equivalence_verdict",
    "holm_adjust",
    "js_distance",
    "mcnemar_test",
    "needed_trials",
    "position_counts",
    "resolve_margin",
    "summarize_run",
    "tost_p_value",
    "wilson_interval",
]
