"""The divergence frontier (``validator.judging.frontier``): data-flow order, the first divergence, the problem
nodes (upstream = the same request, or none) and what is downstream; and its known answers on real bundles:
one injected layer in the middle of a 93-layer stack, the projection probe's partial-bf16, two equal runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.factories import write_stack_bundle
from validator.app.cli import main
from validator.judging.frontier import (
    Node,
    divergence_frontier,
    first_above_floor,
    first_failing,
    flow_order,
    nodes_from_doc,
    where,
)


def _node(i: int, name: str, status: str = "pass", ci: int | None = None, **coords: Any) -> Node:
    return Node(i, name, f"{name} {coords}", coords, status, ci)


def test_data_flow_order_is_step_then_capture_order_then_layer() -> None:
    nodes = [
        _node(0, "late", ci=0, step=1),  # captured first, but at a later step
        _node(1, "b", ci=5, step=0, layer=0),
        _node(2, "a", ci=3, step=0, layer=9),  # captured before b: first within step 0 despite its layer
        _node(3, "w", ci=9),  # no step: weights and single-pass tensors come first
        _node(4, "x", step=0, layer=2),  # no capture index: after those with one, by layer
        _node(5, "y", step=0, layer=1),
    ]
    assert [n.index for n in flow_order(nodes)] == [3, 2, 1, 5, 4, 0]


def test_first_divergence_is_the_earliest_failure_not_the_worst() -> None:
    nodes = [
        _node(0, "mlp", "fail", ci=7, step=3, request="q0", layer=1),  # the worst: listed first, as compare sorts
        _node(1, "k", "fail", ci=2, step=0, request="q0", layer=1),
        _node(2, "k", "pass", ci=1, step=0, request="q0", layer=0),
    ]
    f = divergence_frontier(nodes)
    assert f.first_divergence is not None and f.first_divergence.index == 1
    assert where(f.first_divergence) == "k layer 1, step 0, request q0"
    assert [n.index for n in f.problem_nodes] == [1]
    assert f.downstream == (("mlp", 1, 1),) and f.downstream_pairs == 1
    assert first_failing(nodes) == f.first_divergence


def test_other_requests_are_not_upstream_but_a_shared_pair_is() -> None:
    nodes = [
        _node(0, "k", "fail", ci=0, step=0, request="q0", layer=1),
        _node(1, "k", "fail", ci=1, step=0, request="q1", layer=1),  # same step, another request: its own cause
        _node(2, "v", "fail", ci=2, step=0, request="q0", layer=1),  # after q0's k: downstream
        _node(3, "mlp", "fail", ci=3, step=1, request="q1"),  # after q1's k: downstream
        _node(4, "mlp", "error", ci=4, step=1, request="q2"),  # q2's first failure: a problem node
    ]
    f = divergence_frontier(nodes)
    assert [n.index for n in f.problem_nodes] == [0, 1, 4]
    assert f.downstream == (("v", 1, 1), ("mlp", None, 1))
    # a failing pair without a request is upstream of everything after it, and downstream of anything before
    shared = [_node(0, "embed", "fail", ci=0, step=0), *nodes[1:]]
    assert [n.index for n in divergence_frontier(shared).problem_nodes] == [0]
    late_shared = [*nodes, _node(5, "allreduce", "fail", ci=5, step=2)]
    assert [n.index for n in divergence_frontier(late_shared).problem_nodes] == [0, 1, 4]


def test_no_failure_no_frontier_and_the_first_pair_above_its_floor() -> None:
    nodes = [Node(0, "a", "a", {"step": 1}, "pass", 0, 1.2), Node(1, "b", "b", {"step": 0}, "inconclusive", 1, 1.4),
             Node(2, "c", "c", {"step": 0}, "pass", 2, 0.9)]
    f = divergence_frontier(nodes)
    assert f.first_divergence is None and f.problem_nodes == () and f.downstream == ()
    assert f.above_floor is not None and f.above_floor.index == 1 and first_above_floor(nodes) == f.above_floor
    d = f.to_dict()
    assert d["first_divergence"] is None and d["problem_nodes"] == [] and d["downstream"] == {"pairs": 0, "groups": []}
    assert d["first_above_floor"]["label"] == "b"


def test_nodes_from_a_stored_document() -> None:
    pairs = [{"name": "k", "label": "k [layer=1]", "coords": {"layer": 1}, "status": "fail", "floor_ratio": "inf"},
             {"name": "q", "label": "q [layer=0]", "coords": {"layer": 0}, "status": "pass", "capture_index": 4}]
    nodes = nodes_from_doc(pairs, order={"k [layer=1]": 7})
    assert [(n.capture_index, n.floor_ratio) for n in nodes] == [(7, float("inf")), (4, None)]


# -- known answers on bundles written by the real probes writer -------------------------------------------


def _compare(capsys: Any, tmp_path: Path, *argv: str) -> tuple[int, dict[str, Any]]:
    capsys.readouterr()
    code = main(["--home", str(tmp_path / "h"), "compare", *argv, "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_one_injected_layer_in_a_93_layer_stack_is_named_not_a_later_one(tmp_path: Path, capsys: Any) -> None:
    a = write_stack_bundle(tmp_path, "a")
    b = write_stack_bundle(tmp_path, "b", fault_layer=40)
    code, doc = _compare(capsys, tmp_path, str(a), str(b))
    assert code == 1 and doc["verdict"] == "fail"
    failing = [p for p in doc["pairs"] if p["status"] == "fail"]
    assert {p["coords"]["layer"] for p in failing} == set(range(40, 93))  # every later layer inherits it
    assert failing[0]["coords"]["layer"] > 40  # the largest error is far downstream of the fault
    first = doc["first_divergence"]
    assert first["where"] == "hidden layer 40, step 0, request r0" and doc["pairs"][first["index"]]["coords"]["layer"] == 40
    assert [p["coords"]["layer"] for p in doc["problem_nodes"]] == [40]
    groups = [{"name": "hidden", "layer": i, "pairs": 1} for i in range(41, 93)]  # in data-flow order
    assert doc["downstream"] == {"pairs": 52, "groups": groups}
    assert doc["headline"].startswith("hidden [step=0 req=r0 layer=40]: ")
    assert "first divergence; then 52 pairs downstream: hidden x 52" in doc["headline"]
    assert doc["reasons"][1].startswith("hidden [step=0 req=r0 layer=92]")  # then the worst pairs, as before
    capsys.readouterr()
    assert main(["--home", str(tmp_path / "h"), "compare", str(a), str(b)]) == 1
    text = capsys.readouterr().out
    verdict = text[text.index("verdict: FAIL: hidden [step=0 req=r0 layer=40]"):]
    assert "\n  first divergence: hidden layer 40, step 0, request r0\n" in verdict
    assert "\n  then 52 pairs downstream: hidden layer 41 x 1, hidden layer 42 x 1," in verdict


def test_two_equal_runs_have_no_frontier(tmp_path: Path, capsys: Any) -> None:
    a = write_stack_bundle(tmp_path, "a", layers=12)
    b = write_stack_bundle(tmp_path, "b", layers=12)
    code, doc = _compare(capsys, tmp_path, str(a), str(b))
    assert code == 0 and doc["verdict"] == "pass"
    assert doc["first_divergence"] is None and doc["problem_nodes"] == [] and doc["downstream"]["pairs"] == 0
    assert doc["first_above_floor"] is None
    capsys.readouterr()
    assert main(["--home", str(tmp_path / "h"), "compare", str(a), str(b)]) == 0
    assert "first divergence" not in capsys.readouterr().out  # a pass says nothing of it


@pytest.fixture(scope="module")
def projection(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The projection probe's bundles at the demo's shapes (``validator demo``), on the CPU."""
    out = tmp_path_factory.mktemp("proj")
    args = ["probe", "projection", "--device", "cpu", "--hidden", "512", "--draft-layers", "2", "--head-dim", "64",
            "--tokens", "256", "--dtype", "bf16", "--seed", "0", "--out", str(out), "--json"]
    assert main(args) == 0
    return out


def test_projection_partial_bf16_parts_at_the_pre_norm_sum(projection: Path, tmp_path: Path, capsys: Any) -> None:
    ref, concat, bf16 = (str(projection / n) for n in ("ref", "concat", "partial-bf16"))
    code, doc = _compare(capsys, tmp_path, ref, bf16, "--floor", ref, concat)
    assert code == 1
    assert doc["first_divergence"]["name"] == "ctx.pre_norm"
    assert [p["name"] for p in doc["problem_nodes"]] == ["ctx.pre_norm"]  # its problem node
    assert doc["downstream"]["groups"] == [{"name": "ctx.normed", "layer": None, "pairs": 1}]  # the norm inherits
    assert doc["headline"].startswith("ctx.pre_norm [tok=0:256]: ")
    assert doc["headline"].endswith("(first divergence; then 1 pair downstream: ctx.normed x 1)")
