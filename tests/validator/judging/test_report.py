"""The report's JSON encoder (``judging.report.dumps``) writes what ``json.dumps(doc, default=str)`` writes."""

from __future__ import annotations

import builtins
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from validator.judging.report import dumps

DOC = {
    "a": "run-α",
    "pairs": [
        {"rel_l2": 1e-05, "tiny": 5e-324, "zero": -0.0, "big": 1.5e300, "n": 2**63 - 1, "ok": True, "none": None},
        {"np_float": np.float64(0.1), "np_f32": np.float32(0.5), "np_int": np.int64(7), "np_bool": np.bool_(True)},
        {"shape": (16, 1024), "nan": "nan", "inf": "-inf"},
    ],
    "coords": {3: "int key", "path": Path("/tmp/x")},
}


def _deep(levels: int) -> Any:
    doc: Any = 0
    for _ in range(levels):
        doc = [doc]
    return doc


# what orjson refuses, and json writes: an integer past 64 bits, a lone surrogate, nesting past 255 levels
REFUSED = [{"coords": {"step": 2**64}}, {"a": "run-\udcff"}, {"output": _deep(300)}]


@pytest.mark.parametrize("indent", [False, True])
@pytest.mark.parametrize("doc", [DOC, *REFUSED], ids=["values", "int-past-64-bits", "surrogate", "deep"])
def test_dumps_writes_what_json_writes(doc: Any, indent: bool) -> None:
    text = dumps(doc, indent=indent)
    assert json.loads(text) == json.loads(json.dumps(doc, default=str))
    assert text.startswith(("{\n  ", "[\n  ")) if indent else "\n" not in text


def test_numpy_scalars_as_json_writes_them() -> None:
    got = json.loads(dumps(DOC))["pairs"][1]
    assert got == {"np_float": 0.1, "np_f32": "0.5", "np_int": "7", "np_bool": "True"}  # float subclasses only are numbers


def test_dumps_without_orjson(monkeypatch: pytest.MonkeyPatch) -> None:
    real = builtins.__import__

    def no_orjson(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "orjson":
            raise ImportError(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_orjson)
    assert json.loads(dumps(DOC, indent=True)) == json.loads(json.dumps(DOC, default=str))
