"""The equivalence margin of a per-position acceptance comparison: on the log-odds scale (the default) or,
where a policy asks for it, on the absolute rate scale.

*Log odds* (``log_odds_margin``, the default): the tested effect is the log odds ratio of the conditional
rates, ``logit(p_B) - logit(p_A)``, each log odds estimated with half a trial added to both outcomes
(Gart's adjustment: finite at 0 and at every trial accepted), and B is equivalent to A when that effect
lies within ``+-width``. Near a rate of 0 the odds are the rate, so the margin is a ratio margin on the
rate (a halving is a log odds ratio of about -0.69 whatever the rate); near 1 it is a ratio margin on the
rejection rate; at 0.8, 0.125 is about +-0.02 on the rate.

*Absolute* (``margin``): the tested effect is the rate difference ``p_B - p_A`` and the margin is
``+-width`` in rate units, the same at every rate (a halving of a rate below ``2 * width`` fits inside it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from validator.judging.acceptance.primitives import tost_trials

Scale = Literal["log_odds", "absolute"]

DEFAULT_LOG_ODDS_MARGIN = 0.125  # benchmarks/acceptance_calibration.md; about +-0.02 at a rate of 0.8


def log_odds(accepted: float, reached: float) -> float:
    """Gart's adjusted log odds ``log((x + 1/2) / (n - x + 1/2))`` (NaN when ``n == 0``)."""
    if reached <= 0:
        return math.nan
    return math.log((accepted + 0.5) / (reached - accepted + 0.5))


def log_odds_se(accepted: float, reached: float) -> float:
    """Its standard error for independent trials, ``sqrt(1 / (x + 1/2) + 1 / (n - x + 1/2))``."""
    if reached <= 0:
        return math.nan
    return math.sqrt(1 / (accepted + 0.5) + 1 / (reached - accepted + 0.5))


@dataclass(frozen=True)
class Margin:
    """``scale`` (what is tested) and ``width`` (the half-width of the equivalence region on that scale)."""

    scale: Scale
    width: float

    def __post_init__(self) -> None:
        limit = 1.0 if self.scale == "absolute" else math.inf
        if self.scale not in ("log_odds", "absolute") or not 0 < self.width < limit:
            raise ValueError(
                "need 0 < margin < 1 (absolute) or 0 < log_odds_margin (finite), got"
                f" {self.scale} {self.width!r}"
            )

    def effect(self, accepted_a: float, reached_a: float, accepted_b: float, reached_b: float) -> float:
        """B against A on this margin's scale: ``p_B - p_A`` or ``logit(p_B) - logit(p_A)`` (adjusted)."""
        if reached_a <= 0 or reached_b <= 0:
            return math.nan
        if self.scale == "absolute":
            return accepted_b / reached_b - accepted_a / reached_a
        return log_odds(accepted_b, reached_b) - log_odds(accepted_a, reached_a)

    def effect_se(self, accepted_a: float, reached_a: float, accepted_b: float, reached_b: float) -> float:
        """The effect's standard error for independent trials. Absolute: rates shrunk as
        ``(x + 1) / (n + 2)`` (Agresti-Caffo) and counts floored at 1."""
        if self.scale == "absolute":
            ta, tb = (accepted_a + 1) / (reached_a + 2), (accepted_b + 1) / (reached_b + 2)
            return math.sqrt(ta * (1 - ta) / max(reached_a, 1) + tb * (1 - tb) / max(reached_b, 1))
        return math.hypot(log_odds_se(accepted_a, reached_a), log_odds_se(accepted_b, reached_b))

    def trial_variance(self, rate: float) -> float:
        """Variance of the effect contributed by one run, times its trials: ``p(1-p)`` or ``1 / (p(1-p))``."""
        v = rate * (1 - rate)
        if self.scale == "absolute":
            return v
        return 1 / v if v > 0 else math.inf

    def needed_trials(
        self,
        rate_a: float,
        rate_b: float,
        *,
        alpha: float = 0.05,
        power: float = 0.8,
        design_effect: float = 1.0,
    ) -> int:
        """Reached trials per run for the TOST to show equivalence with probability ``power`` when the
        true effect is 0: ``deff * (z[1-alpha] + z[1-(1-power)/2])**2 * (v(p_A) + v(p_B)) / width**2`` with
        ``v`` from :meth:`trial_variance`."""
        var = self.trial_variance(rate_a) + self.trial_variance(rate_b)
        return tost_trials(var, self.width, alpha=alpha, power=power, design_effect=design_effect)

    @property
    def effect_name(self) -> str:
        return "B-A" if self.scale == "absolute" else "log OR"

    def describe(self) -> str:
        """``+-0.02`` or ``log odds +-0.125 (odds ratio 0.882-1.13)``."""
        if self.scale == "absolute":
            return f"+-{self.width:g}"
        return f"log odds +-{self.width:g} (odds ratio {math.exp(-self.width):.3g}-{math.exp(self.width):.3g})"


def resolve_margin(margin: float | None = None, log_odds_margin: float | None = None) -> Margin:
    """The margin a caller (or a policy's ``[acceptance]`` table) asked for: ``margin`` is absolute,
    ``log_odds_margin`` on the log-odds scale, neither the default log-odds margin; both is an error."""
    if margin is not None and log_odds_margin is not None:
        raise ValueError("give margin (absolute) or log_odds_margin, not both")
    if margin is not None:
        return Margin("absolute", float(margin))
    width = DEFAULT_LOG_ODDS_MARGIN if log_odds_margin is None else float(log_odds_margin)
    return Margin("log_odds", width)
