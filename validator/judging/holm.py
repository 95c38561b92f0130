"""Holm's step-down adjustment of a family of p-values: the per-step "above floor" tests of the RL KL report
(:mod:`.rl_kl`) and the per-position tests of an acceptance comparison (:mod:`.acceptance`) are each judged
as one family, so that a run with many steps or positions does not fail by chance alone."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["holm_adjust"]


def holm_adjust(p_values: npt.ArrayLike) -> npt.NDArray[np.float64]:
    """Holm's step-down adjusted p-values: with the ``m`` finite p-values sorted ascending,
    ``p_adj(i) = min(1, max_{j <= i} (m - j + 1) p(j))`` (1-based ``i``). Rejecting every test with
    ``p_adj < alpha`` keeps the family-wise error (any false rejection) at most ``alpha`` under any
    dependence between the tests. NaN p-values are not in the family and stay NaN."""
    p = np.asarray(p_values, dtype=np.float64)
    out = np.full(p.shape, np.nan)
    ok = np.flatnonzero(np.isfinite(p))
    m = len(ok)
    if m == 0:
        return out
    order = ok[np.argsort(p[ok], kind="stable")]
    scaled = (m - np.arange(m)) * p[order]
    out[order] = np.minimum(1.0, np.maximum.accumulate(scaled))
    return out
