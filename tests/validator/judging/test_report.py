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


# -- the faces lead with the divergence frontier ----------------------------------------------------------


def _frontier_doc() -> dict[str, Any]:
    """A failing comparison as compare_runs orders it (worst first): the worst pair is far downstream."""
    from validator.judging.compare import Comparison, PairResult
    from validator.judging.policy import Decision
    from validator.judging.report import comparison_doc

    def pair(name: str, status: str, ci: int, why: str, **coords: Any) -> PairResult:
        label = f"{name} [" + " ".join(f"{k}={v}" for k, v in coords.items()) + "]"
        return PairResult(name, coords, label, status, None, Decision(status, None, (why,) if why else ()), capture_index=ci)

    pairs = [
        pair("mlp", "fail", 9, "rel_l2 4.4 > 0.03", step=3, request="q0", layer=1),
        pair("k", "fail", 2, "rel_l2 0.9 > 0.03", step=0, request="q0", layer=1),
        pair("v", "fail", 3, "rel_l2 0.8 > 0.03", step=0, request="q0", layer=1),
        pair("k", "fail", 6, "rel_l2 0.7 > 0.03", step=0, request="q1", layer=1),
        pair("k", "pass", 1, "", step=0, request="q0", layer=0),
    ]
    c = Comparison(a="A", b="B", verdict="fail", reasons=["k [step=0 request=q0 layer=1]: rel_l2 0.9 > 0.03"], pairs=pairs,
                   only_a=[], only_b=[], headline="k [step=0 request=q0 layer=1]: rel_l2 0.9 > 0.03")
    return comparison_doc(c)


def test_document_carries_the_frontier() -> None:
    doc = _frontier_doc()
    assert list(doc)[:6] == ["verdict", "headline", "reasons", "first_divergence", "problem_nodes", "downstream"]
    assert doc["first_divergence"]["index"] == 1 and doc["first_divergence"]["where"] == "k layer 1, step 0, request q0"
    assert [p["index"] for p in doc["problem_nodes"]] == [1, 3]
    assert doc["downstream"] == {"pairs": 2, "groups": [{"name": "v", "layer": 1, "pairs": 1}, {"name": "mlp", "layer": 1, "pairs": 1}]}
    assert json.loads(dumps(doc)) == doc


def test_text_markdown_and_junit_lead_with_the_frontier(tmp_path: Path) -> None:
    import xml.etree.ElementTree as ET

    from validator.judging.report import format_comparison, markdown_summary, write_junit

    doc = _frontier_doc()
    text = format_comparison(doc)
    tail = text[text.index("verdict: FAIL"):].splitlines()
    assert tail[2:5] == [
        "  first divergence: k layer 1, step 0, request q0",
        "  problem nodes (failing, every upstream pair passing): 2: k layer 1 x 2",
        "  then 2 pairs downstream: v layer 1 x 1, mlp layer 1 x 1",
    ]
    md = markdown_summary(doc)
    assert md.index("- **first divergence: k layer 1, step 0, request q0**") < md.index("| status |")
    junit = tmp_path / "j.xml"
    write_junit(doc, junit)
    suite = ET.parse(junit).getroot()
    assert suite.get("tests") == "5" and suite.get("failures") == "4"  # counts as before
    props = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert props == {"first_divergence": "k [step=0 request=q0 layer=1]", "problem_nodes": "2", "downstream_pairs": "2"}
    cases = suite.findall("testcase")
    assert [c.get("name") for c in cases[:2]] == ["k [step=0 request=q0 layer=1]", "k [step=0 request=q1 layer=1]"]
    first = cases[0].find("failure")
    assert first is not None and first.get("message") == (
        "first divergence: k layer 1, step 0, request q0: rel_l2 0.9 > 0.03 "
        "(first divergence; 2 problem nodes: k layer 1 x 2; then 2 pairs downstream: v x 1, mlp x 1)"
    )
    second = cases[1].find("failure")
    assert second is not None and second.get("message", "").startswith("problem node (its upstream pairs pass): ")
