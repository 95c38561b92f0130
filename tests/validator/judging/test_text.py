"""Plain-text formatting: intervals rounded outward, judged values never printed across their limit."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from validator.judging.text import fmt_interval, fmt_judged, judged_cell


def _ends(text: str) -> tuple[float, float]:
    got = re.fullmatch(r"\[(\S+), (\S+)\]", text)
    assert got is not None, text
    return float(got[1]), float(got[2])


@pytest.mark.parametrize(
    ("lo", "hi", "digits", "expect"),
    [
        (1.5004, 1.6521, 3, "[1.5, 1.66]"),  # nearest rounding would print [1.5, 1.65]
        (1.6541, 1.6549, 3, "[1.65, 1.66]"),
        (1.6549, 1.6549, 3, "[1.65, 1.66]"),  # a point interval straddles its 3-digit text
        (0.99961, 1.0012, 3, "[0.999, 1.01]"),
        (0.99961, 1.0012, 4, "[0.9996, 1.002]"),
        (9.9951, 10.0001, 3, "[9.99, 10.1]"),  # the carry into a new digit
        (2.03, 2.03, 3, "[2.03, 2.03]"),  # a value shown exactly is not moved (its shortest text is the double)
        (-0.0123456, 0.0123456, 3, "[-0.0124, 0.0124]"),
        (0.0, 1e-300, 3, "[0, 1e-300]"),
    ],
)
def test_interval_ends_are_rounded_outward(lo: float, hi: float, digits: int, expect: str) -> None:
    assert fmt_interval(lo, hi, digits) == expect


def test_printed_interval_read_back_always_contains_the_computed_one() -> None:
    rng = np.random.default_rng(38)
    for x in np.exp(rng.uniform(-30, 30, 2000)):
        lo, hi = float(x), float(x) * (1 + rng.uniform(0, 0.1))
        for digits in (3, 4):
            shown_lo, shown_hi = _ends(fmt_interval(lo, hi, digits))
            assert shown_lo <= lo and shown_hi >= hi


def test_an_end_is_never_printed_across_its_limit() -> None:
    # the FAIL: an interval entirely above 1.5 printed as "[1.5, 1.66] > 1.5x"
    assert fmt_interval(1.5004, 1.6571, limit=1.5) == "[1.5004, 1.66]"
    assert fmt_interval(1.5 + 2**-52, 2.0, limit=1.5) == "[1.5000000000000002, 2]"  # the next double up
    # a passing interval's upper end stays at or below a limit that has more digits than the print
    assert fmt_interval(1.2, 1.2341, limit=1.2345) == "[1.2, 1.2341]"
    # ends on the limit's own side keep their digits; a straddling interval is unchanged
    assert fmt_interval(1.31, 1.77, limit=1.5) == "[1.31, 1.77]"
    assert fmt_interval(1.4996, 1.5004, limit=1.5) == "[1.49, 1.51]"
    rng = np.random.default_rng(7)
    for limit in (1.5, 4.0, 1024.0, 0.03, 1e-6):
        for x in limit * (1 + rng.uniform(-1e-6, 1e-6, 500)):
            lo, hi = _ends(fmt_interval(float(x), float(x), limit=limit))
            assert (lo > limit) == (x > limit) and (hi <= limit) == (x <= limit)
            assert (float(fmt_judged(float(x), limit=limit)) > limit) == (x > limit)


def test_non_finite_and_json_ends_print_as_words() -> None:
    assert fmt_interval(math.inf, math.nan) == "[inf, nan]"
    assert fmt_interval(-math.inf, 2.0, limit=math.inf) == "[-inf, 2]"
    assert fmt_interval("inf", "nan", limit="inf") == "[inf, nan]"  # a JSON document's non-finite numbers
    assert fmt_judged(math.inf, limit=1.5) == "inf" and fmt_judged(0.0, limit=1.5) == "0"


def test_judged_cell_shows_the_outward_interval_beside_its_limit() -> None:
    pair = {"judged": "x floor", "value": 1.50041, "interval": [1.50004, 1.66571], "limit": 1.5}
    assert judged_cell(pair) == "1.5004x [1.50004, 1.666]"  # 4 digits in tables, more where the limit needs them
    rel = {"judged": "rel_l2", "value": 0.0123, "interval": [0.011044, 0.013961], "limit": 0.03}
    assert judged_cell(rel) == "0.0123 [0.01104, 0.01397]"
    assert judged_cell({"judged": "x floor", "value": "inf", "interval": ["inf", "inf"], "limit": 1.5}) == "infx [inf, inf]"
