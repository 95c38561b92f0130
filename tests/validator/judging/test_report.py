"""The report's JSON encoder (``judging.report.dumps``) writes what ``json`` writes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from validator.judging.report import dumps

DOC = {
    "a": "run-α",
    "pairs": [
        {"rel_l2": 1e-05, "tiny": 5e-324, "zero": -0.0, "big": 1.5e300, "n": 2**63 - 1, "ok": True, "none": None},
        {"np_float": np.float64(0.1), "np_int": np.int64(7), "np_bool": np.bool_(True), "shape": (16, 1024)},
    ],
    "coords": {3: "int key", "path": Path("/tmp/x")},
    "nan": "nan",
}


@pytest.mark.parametrize("indent", [False, True])
def test_dumps_writes_what_json_writes(indent: bool) -> None:
    text = dumps(DOC, indent=indent)
    assert json.loads(text) == json.loads(json.dumps(DOC, default=str))
    got = json.loads(text)["pairs"][1]
    assert got["np_float"] == 0.1 and got["np_int"] == "7" and got["shape"] == [16, 1024]  # as json writes them
    assert text.startswith('{\n  "a"') if indent else "\n" not in text
