"""validator.judging.holm: Holm's step-down adjustment, checked by hand."""

from __future__ import annotations

import math

import pytest

from validator.judging.holm import holm_adjust


def test_holm_adjustment_by_hand() -> None:
    # sorted: 0.005 (x4 = 0.02), 0.01 (x3 = 0.03), 0.03 (x2 = 0.06), 0.04 (x1 = 0.04 -> running max 0.06)
    assert holm_adjust([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    out = holm_adjust([0.01, math.nan, 0.04])  # NaN is outside the family: m = 2
    assert out[0] == pytest.approx(0.02) and math.isnan(out[1]) and out[2] == pytest.approx(0.04)
    assert holm_adjust([0.5, 0.6]).tolist() == [1.0, 1.0]  # capped at 1
    assert holm_adjust([0.02]).tolist() == [0.02] and len(holm_adjust([])) == 0
