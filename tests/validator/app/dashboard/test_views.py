from __future__ import annotations

import math
from typing import Any

import pytest

from validator.app.dashboard.views import (
    TableQuery,
    column_of,
    default_metric,
    first_exceedance,
    heatmap,
    pair_rows,
    pair_table,
    steps,
)


def _pair(name: str, status: str, rel: float, floor: float | None = None, **coords: Any) -> dict[str, Any]:
    c = {"step": 0, **coords}
    label = name + " [" + " ".join(f"{k}={v}" for k, v in c.items() if k != "extra") + "]"
    ratio = None if floor is None else (rel / floor if floor else "inf")
    return {"name": name, "coords": c, "label": label, "status": status, "rel_l2": rel, "floor_rel_l2": floor,
            "floor_ratio": ratio, "limit_ratio": rel / 0.01, "threshold": 0.01, "reasons": [], "metrics": None}


DOC = {
    "verdict": "fail",
    "floor": ["r", "r2"],
    "pairs": [  # sorted worst first, as compare_runs does
        _pair("mlp", "fail", 0.05, 0.001, layer=2),
        _pair("attn", "fail", 0.03, 0.001, layer=1),
        _pair("attn", "pass", 0.0015, 0.001, layer=0),
        _pair("mlp", "pass", 0.0, 0.0, layer=0),
        _pair("mlp", "pass", 0.0009, 0.001, layer=1),
        _pair("run", "pass", 0.001, 0.001, extra={"after_stage": "10"}),
        _pair("run", "pass", 0.001, 0.001, extra={"after_stage": "9"}),
    ],
}
# capture order: per layer, attn before mlp; the stage sums last
ORDER = {p["label"]: i for i, p in enumerate(sorted(DOC["pairs"], key=lambda p: (p["coords"].get("layer", 9), p["name"])))}


def test_heatmap_grid_in_capture_order() -> None:
    h = heatmap(DOC, metric="floor_ratio", order=ORDER)
    assert h["rows"] == ["attn", "mlp", "run"]
    assert h["cols"] == ["after_stage=9", "after_stage=10", "layer 0", "layer 1", "layer 2"]  # numeric, not lexical
    r, c = h["rows"].index("mlp"), h["cols"].index("layer 2")
    assert h["pair"][r][c] == 0 and h["value"][r][c] == pytest.approx(50) and h["status"][r][c] == "fail"
    assert h["z"][r][c] == pytest.approx(math.log10(50))
    assert h["pair"][h["rows"].index("attn")][h["cols"].index("after_stage=9")] is None  # no pair there
    zero = h["z"][r][h["cols"].index("layer 0")]  # 0 / 0 floor: ratio 'inf' -> drawn above the max
    assert zero is not None and zero > math.log10(50)
    assert h["center"] == 0.0


def test_first_exceedance_follows_capture_order_not_badness() -> None:
    f = first_exceedance(DOC, ORDER)
    assert f is not None and f["kind"] == "limit" and DOC["pairs"][f["index"]]["label"] == "attn [step=0 layer=1]"
    passing = {**DOC, "pairs": [p for p in DOC["pairs"] if p["status"] == "pass"]}
    f = first_exceedance(passing, ORDER)
    assert f is not None and f["kind"] == "floor" and passing["pairs"][f["index"]]["name"] == "attn"
    assert first_exceedance({"pairs": [_pair("x", "pass", 0.001, 0.002)]}) is None
    h = heatmap(DOC, metric="rel_l2", order=ORDER)
    assert (h["rows"][h["first"]["row"]], h["cols"][h["first"]["col"]]) == ("attn", "layer 1")


def test_first_exceedance_is_read_from_the_document_when_it_holds_the_frontier() -> None:
    # a stored first divergence is what the page shows, whatever the pairs would give today
    stored = {**DOC, "first_divergence": {"index": 0, "label": DOC["pairs"][0]["label"], "status": "fail",
                                          "where": "mlp layer 2, step 0", "reasons": ["x"]}}
    f = first_exceedance(stored, ORDER)
    assert f is not None and (f["index"], f["kind"], f["where"]) == (0, "limit", "mlp layer 2, step 0")
    h = heatmap(stored, metric="rel_l2", order=ORDER)
    assert (h["rows"][h["first"]["row"]], h["cols"][h["first"]["col"]]) == ("mlp", "layer 2")
    above = {**DOC, "first_divergence": None, "first_above_floor": {"index": 2, "label": "attn [step=0 layer=0]",
                                                                     "status": "pass", "floor_ratio": 1.5}}
    f = first_exceedance(above)
    assert f is not None and (f["index"], f["kind"], f["floor_ratio"]) == (2, "floor", 1.5)
    assert first_exceedance({**DOC, "first_divergence": None, "first_above_floor": None}) is None
    # one step's map: the first exceedance among that step's pairs, by the frontier's order (step, capture order)
    two = {"pairs": [_pair("a", "fail", 0.05, layer=0, step=1), _pair("b", "fail", 0.05, layer=1),
                     _pair("c", "fail", 0.05, layer=0)], "first_divergence": None}
    order = {p["label"]: i for i, p in enumerate(two["pairs"])}
    assert heatmap(two, metric="rel_l2", order=order, step=0)["first"]["label"] == "b [step=0 layer=1]"
    assert first_exceedance({"pairs": two["pairs"]}, order)["label"] == "b [step=0 layer=1]"  # step before capture order


def test_cells_holding_several_pairs_show_the_worst() -> None:
    doc = {"pairs": [_pair("k", "pass", 0.002, layer=0, request="r1"), _pair("k", "fail", 0.001, layer=0, request="r2"),
                     _pair("k", "pass", 0.003, layer=0, request="r3")]}
    h = heatmap(doc, metric="rel_l2")
    assert h["count"] == [[3]] and h["pair"] == [[1]]  # a failing pair outranks a larger passing value
    assert default_metric(doc) == "rel_l2" and default_metric(DOC) == "floor_ratio"
    with pytest.raises(ValueError, match="metric"):
        heatmap(doc, metric="cosine")


def test_columns_and_rows_helpers() -> None:
    assert column_of({"layer": 3, "extra": {"stage": "1"}})[1] == "layer 3 · stage=1"
    assert column_of({"step": 2})[1] == "—"
    rows = pair_rows(DOC)
    assert [r["index"] for r in rows] == list(range(len(DOC["pairs"]))) and rows[3]["floor_ratio"] == math.inf


def test_pair_table_pages_worst_first_with_filters_and_sorts() -> None:
    doc = {"pairs": [_pair("a", "pass", 0.002, 0.001, layer=0), _pair("b", "fail", 0.01, 0.001, layer=0),
                     _pair("a", "pass", 0.004, None, layer=1), _pair("b", "inconclusive", 0.003, 0.001, layer=1),
                     _pair("a", "fail", 0.02, 0.001, layer=2), _pair("a", "pass", 0.005, 0.001, layer=2, step=1)]}
    rows = pair_rows(doc)
    t = pair_table(rows, TableQuery(per_page=4), metric="floor_ratio")
    # failures (largest × floor first), then inconclusive, then passes; a pass without a floor last
    assert [r["index"] for r in t["rows"]] == [4, 1, 3, 5] and (t["pages"], t["matched"], t["start"], t["end"]) == (2, 6, 1, 4)
    t = pair_table(rows, TableQuery(per_page=4, page=9), metric="floor_ratio")
    assert t["page"] == 2 and [r["index"] for r in t["rows"]] == [0, 2] and (t["start"], t["end"]) == (5, 6)
    t = pair_table(rows, TableQuery(status="failing", sort="rel_l2", dir="asc"), metric="rel_l2")
    assert [r["index"] for r in t["rows"]] == [1, 4] and t["status_counts"]["pass"] == 3
    t = pair_table(rows, TableQuery(sort="floor_ratio", dir="asc", name="a"), metric="rel_l2")
    assert [r["index"] for r in t["rows"]] == [0, 5, 4, 2]  # no value: last in either direction
    t = pair_table(rows, TableQuery(step=1), metric="rel_l2")
    assert [r["index"] for r in t["rows"]] == [5] and t["total"] == 6
    assert pair_table(rows, TableQuery(where="layer 9"), metric="rel_l2")["start"] == 0
    assert steps(doc) == [{"step": 0, "pairs": 5, "failing": 2}, {"step": 1, "pairs": 1, "failing": 0}]
    h = heatmap(doc, metric="rel_l2", step=1)
    assert h["count"] == [[1]] and h["pair"] == [[5]] and h["step"] == [[1]]
    for bad in (TableQuery(sort="nope"), TableQuery(dir="up"), TableQuery(status="ok"), TableQuery(page=0), TableQuery(per_page=0)):
        with pytest.raises(ValueError):
            pair_table(rows, bad, metric="rel_l2")
