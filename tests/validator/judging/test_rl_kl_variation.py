"""The KL verdict against the run's own step-to-step variation (``KLSettings.variation``)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from tests.validator.judging.test_rl_kl import _series
from validator.judging.rl_kl import KLSettings, kl_by_step

# k3 step means (x 1e-4) of the healthy and stale series of benchmarks/rl_h200.md: batches move k3 by 30-40%
HEALTHY = [4.9, 5.5, 4.7, 5.7, 6.6, 8.1, 6.9, 4.1, 2.7, 6.5, 14.5, 8.5, 8.1, 6.8, 6.6, 9.9, 4.7, 8.1, 6.7, 6.1]
STALE_3 = HEALTHY[:12] + [14.6, 19.2, 41.7] + HEALTHY[15:]
ONE_BEHIND = HEALTHY[:12] + [14.6] + HEALTHY[13:]  # step 12 served version 11, as in the stale-3 series
STOPPED = [5.6, 6.6, 8.1, 6.9, 4.1, 2.7, 6.5, 22.5, 28.7, 75.2, 66.5, 136, 281, 276, 333, 580, 362]  # from step 3


def _levels(x: list[float]) -> list[float]:
    return [v * 1e-3 for v in x]  # 10x the H200 levels: the same shape, with less sampling noise per step


def test_healthy_series_is_at_floor_and_names_what_kl_cannot_see() -> None:
    rep = kl_by_step(*_series(_levels(HEALTHY), samples=16, tokens=40))
    assert rep.verdict == "at floor", rep.reasons
    k3 = rep.table.k3
    d2 = sorted(float(x) ** 2 for x in np.diff(np.log(k3)))  # the definition, computed here on its own
    keep = len(d2) - math.ceil(0.1 * len(d2))  # the largest 10% of squared differences left out (rounded up)
    q = stats.chi2.ppf(keep / len(d2), 1)
    expected = stats.chi2.cdf(q, 3) / (keep / len(d2))  # E[X | X <= q] for X ~ chi2(1)
    s = math.sqrt(sum(d2[:keep]) / keep / expected / 2)
    assert rep.variation == pytest.approx(s, rel=1e-12)
    w = rep.table.n_window
    ratio = math.exp(float(np.log(k3[w:]).mean() - np.log(k3[:w]).mean()))
    assert rep.level_ratio == pytest.approx(ratio, rel=1e-12)
    n = k3.size
    dof = 2 * (n - 1) ** 2 / (3 * n - 4) * keep / len(d2)
    se = s * math.sqrt(1 / (n - w) + 1 / w)
    assert rep.level_ratio_upper == pytest.approx(ratio * math.exp(stats.t.ppf(0.95, dof) * se), rel=1e-9)
    note = rep.reasons[-1]
    assert "one version behind" in note and "validator manifest diff" in note
    doc = rep.to_dict(steps=False)
    assert doc["variation"]["log_sd"] == rep.variation and doc["settings"]["variation"] == "measured"
    # by sampling error alone the same series is not confirmed
    assert kl_by_step(*_series(_levels(HEALTHY), samples=16, tokens=40), settings=KLSettings(variation="sampling")).verdict != "at floor"


def test_stale_and_stopped_syncs_still_fail_and_one_behind_is_named() -> None:
    stale = kl_by_step(*_series(_levels(STALE_3), samples=16, tokens=40))
    assert stale.verdict == "above floor" and 14 in [s.step for s in stale.steps if s.status == "above floor"]
    assert kl_by_step(*_series(_levels(STOPPED), samples=16, tokens=40)).verdict == "diverging"
    behind = kl_by_step(*_series(_levels(ONE_BEHIND), samples=16, tokens=40))
    assert behind.verdict == "at floor" and "validator manifest diff" in behind.reasons[-1]
    assert behind.flag_ratio > 14.6 / min(HEALTHY[:5])  # the stale step is below what KL can flag here


def test_a_level_above_the_band_fails_by_the_measured_variation() -> None:
    """Every judged step 2.5x the floor window, with 10% variation: the level is above the band."""
    rng = np.random.default_rng(4)
    lv = [2e-3 * (2.5 if i >= 5 else 1.0) * float(rng.lognormal(0, 0.1)) for i in range(20)]
    rep = kl_by_step(*_series(lv, samples=16, tokens=40))
    assert rep.verdict in ("above floor", "diverging") and rep.exit_code == 1


def test_bad_variation_setting_is_refused() -> None:
    with pytest.raises(ValueError, match="variation"):
        KLSettings(variation="both")  # type: ignore[arg-type]
