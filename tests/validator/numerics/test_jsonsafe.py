"""validator.numerics.jsonsafe: the numbers every JSON document writes for NaN and the infinities."""

from __future__ import annotations

import json
import math

import numpy as np

from validator.numerics.jsonsafe import json_safe


def test_non_finite_floats_become_strings_all_the_way_down() -> None:
    assert json_safe({"x": [math.inf, -math.inf, math.nan, 1.5]}) == {"x": ["inf", "-inf", "nan", 1.5]}
    assert json_safe({"x": [math.inf, -math.inf, math.nan, 1.5]}, str_keys=True) == {"x": ["inf", "-inf", "nan", 1.5]}
    assert json_safe(np.float64("nan")) == "nan" and json_safe(np.float64(-np.inf)) == "-inf"
    assert json_safe((1, (2.5, math.inf))) == [1, [2.5, "inf"]]  # tuples become lists
    for v in (None, True, 3, "inf", 0.1):
        assert json_safe(v) is v  # anything else is returned as it is
    assert json.dumps(json_safe({"a": [math.nan, {"b": math.inf}]}), allow_nan=False) == '{"a": ["nan", {"b": "inf"}]}'


def test_keys_kept_or_made_strings() -> None:
    doc = {1: math.inf, None: 2.0, (0, 1): [math.nan]}
    assert json_safe(doc) == {1: "inf", None: 2.0, (0, 1): ["nan"]}
    assert json_safe(doc, str_keys=True) == {"1": "inf", "None": 2.0, "(0, 1)": ["nan"]}


def test_non_finite_as_null_for_documents_of_counts() -> None:
    assert json_safe([math.nan, math.inf, -math.inf, 2.0, None], nonfinite_as_null=True) == [None, None, None, 2.0, None]
    assert json_safe({"k": {"n": math.nan}}, nonfinite_as_null=True) == {"k": {"n": None}}
