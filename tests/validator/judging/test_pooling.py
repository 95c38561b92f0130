"""Intervals that hold at every size, pooled units and the comparison's FAIL level."""

from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats

from probes import BundleWriter
from validator.app.cli import main
from validator.judging.compare import Measured, floor_from, measure_tensors
from validator.judging.policy import FAMILY_ALPHA, Policy, fail_level
from validator.judging.pooling import Member, judge_units, plan_units, settled
from validator.judging.report import write_junit
from validator.numerics.floors import BlockSums, judged_intervals


def _sums(d: np.ndarray, a: np.ndarray) -> BlockSums:
    return BlockSums(d * d, a * a, len(d))


def test_interval_holds_the_exact_f_interval_of_its_elements() -> None:
    """Never narrower than the F(n, n) interval of the ratio (float64 SciPy, computed here on its own)."""
    rng = np.random.default_rng(3)
    a = rng.standard_normal(8)
    cand, floor = _sums(rng.standard_normal(8), a), _sums(rng.standard_normal(8), a)
    (lo, hi), fail_lo = judged_intervals([(cand, floor, 8)])[0]
    r2 = float(np.sum(cand.d2) / np.sum(floor.d2))
    f_lo, f_hi = math.sqrt(r2 / stats.f.ppf(0.975, 8, 8)), math.sqrt(r2 / stats.f.ppf(0.025, 8, 8))
    assert lo <= f_lo * (1 + 1e-12) and hi >= f_hi * (1 - 1e-12)
    assert fail_lo == lo  # one unit: the FAIL level is the interval's own
    # a stricter FAIL level lowers the FAIL end, never the interval shown
    (lo2, hi2), strict = judged_intervals([(cand, floor, 8)], fail_level=fail_level(1000))[0]
    assert (lo2, hi2) == (lo, hi) and strict < lo
    f_strict = math.sqrt(r2 / stats.f.ppf(1 - FAMILY_ALPHA / 2000, 8, 8))
    assert strict <= f_strict * (1 + 1e-12)
    # no floor: the chi-square interval of rel_l2
    (lo, hi), _ = judged_intervals([(cand, None, 8)])[0]
    rel2 = float(np.sum(cand.d2) / np.sum(cand.a2))
    assert lo <= math.sqrt(rel2 * 8 / stats.chi2.ppf(0.975, 8)) * (1 + 1e-12)
    assert hi >= math.sqrt(rel2 * 8 / stats.chi2.ppf(0.025, 8)) * (1 - 1e-12)


@pytest.mark.parametrize("n", [8, 16, 64])
def test_tiny_null_pairs_are_covered_and_never_fail(n: int) -> None:
    """Random null pairs of n elements: the 95% interval misses the true ratio (1) at most ~5% of the time (300
    draws: 8% allows for sampling), and none FAILs against the default 1.5x."""
    rng = np.random.default_rng(n)
    wanted = []
    for _ in range(300):
        a = rng.standard_normal(n)
        wanted.append((_sums(rng.standard_normal(n), a), _sums(rng.standard_normal(n), a), n))
    got = judged_intervals(wanted)
    miss = sum(not lo <= 1.0 <= hi for (lo, hi), _ in got)
    assert miss <= 0.08 * len(got)
    assert not any(f > 1.5 for _, f in got)


def _members(rng: np.random.Generator, count: int, n: int, drift: dict[int, float]) -> list[Member | None]:
    out: list[Member | None] = []
    for i in range(count):
        a = rng.standard_normal(n)
        cand = _sums(drift.get(i, 1.0) * rng.standard_normal(n), a)
        out.append(Member("x floor", 1.5, "measured", cand, _sums(rng.standard_normal(n), a), n))
    return out


def test_pooled_units_pass_many_equal_small_pairs_and_find_one_layer() -> None:
    rng = np.random.default_rng(7)
    ids = [("router", {"step": s, "layer": layer}) for s in range(50) for layer in range(4)]
    plan = plan_units(ids)
    assert [(n, s) for n, s, _ in plan[:2]] == [("router", "all"), ("router", "step=0")]
    assert len(plan) == 1 + 50 + 4
    level = fail_level(len(ids) + len(plan))
    units = judge_units(plan, _members(rng, len(ids), 8, {}), level=level)
    whole = next(u for u in units if u.scope == "all")
    assert whole.status == "pass" and whole.elements == 200 * 8
    assert not any(u.status == "fail" for u in units)
    assert settled(units) == set(range(len(ids)))
    # layer 2 drifts 2x at every step: its unit fails, and the pairs it holds are not settled
    drift = {i: 2.0 for i, (_, c) in enumerate(ids) if c["layer"] == 2}
    units = judge_units(plan, _members(rng, len(ids), 8, drift), level=level)
    failed = {u.scope for u in units if u.status == "fail"}
    assert "layer=2" in failed and not failed & {"layer=0", "layer=1", "layer=3"}
    assert not settled(units) & set(drift)


def test_unpoolable_members_are_left_out() -> None:
    rng = np.random.default_rng(1)
    members = _members(rng, 3, 8, {})
    other = members[2]
    assert other is not None
    members[1] = None  # an error, or no finite element
    members[2] = Member("x floor", 4.0, "rounding", other.blocks, other.floor, 8)  # another limit: pools apart
    plan = plan_units([("x", {"step": i}) for i in range(3)])
    assert judge_units(plan, members, level=0.95) == []  # one poolable member left: no unit


def _bundle(root: Path, name: str, values: dict[tuple[int, int], torch.Tensor]) -> str:
    with BundleWriter(root / name, run_name=name, part="tp0") as w:
        for (step, layer), t in values.items():
            w.add("router", t, step=step, layer=layer)
    return str(root / name)


def test_compare_passes_a_run_of_small_equal_tensors_through_its_pooled_units(tmp_path: Path, capsys) -> None:
    """40 router tensors of 8 elements (10 steps x 4 layers): alone each is borderline; the run PASSes through
    its capture point's pooled unit, and the JSON, the counts line and the table say so. A 3x drift in one layer
    FAILs the run, naming that layer's unit."""
    g = torch.Generator().manual_seed(0)
    keys = [(s, layer) for s in range(10) for layer in range(4)]
    ref = {k: torch.randn(8, generator=g, dtype=torch.float64) for k in keys}

    def noisy(scale: dict[int, float]) -> dict[tuple[int, int], torch.Tensor]:
        return {k: v + 1e-3 * scale.get(k[1], 1.0) * torch.randn(8, generator=g, dtype=torch.float64) for k, v in ref.items()}

    a = _bundle(tmp_path, "a", ref)
    fb = _bundle(tmp_path, "fb", noisy({}))
    b = _bundle(tmp_path, "b", noisy({}))
    code = main(["--home", str(tmp_path / "home"), "compare", a, b, "--floor", a, fb, "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0 and doc["verdict"] == "pass", doc["headline"]
    assert doc["pooled_counts"]["settled_pairs"] == sum(p["pooled_pass"] for p in doc["pairs"]) > 0
    whole = next(u for u in doc["pooled"] if u["scope"] == "all")
    assert whole["status"] == "pass" and whole["pairs"] == 40
    assert "pooled unit" in doc["headline"]
    main(["--home", str(tmp_path / "home"), "compare", a, b, "--floor", a, fb])
    text = capsys.readouterr().out
    assert "pooled units" in text and "ok (pooled)" in text and "router [all, 40 pairs]" in text

    # JUnit: a pair settled by pooling passes; each pooled unit is a testcase
    write_junit(doc, tmp_path / "j.xml")
    suite = ET.parse(tmp_path / "j.xml").getroot()
    assert suite.get("failures") == "0"
    assert any(c.get("classname") == "validator.pooled" and c.get("name") == "router [all, 40 pairs]" for c in suite)
    settled_case = next(c for c in suite if c.get("name") == next(p["label"] for p in doc["pairs"] if p["pooled_pass"]))
    assert settled_case.find("skipped") is None and settled_case.find("failure") is None

    bad = _bundle(tmp_path, "bad", noisy({3: 3.0}))
    code = main(["--home", str(tmp_path / "home"), "compare", a, bad, "--floor", a, fb, "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 1 and doc["verdict"] == "fail"
    assert any(u["scope"] == "layer=3" and u["status"] == "fail" for u in doc["pooled"])
    assert "layer=3" in " ".join(doc["reasons"])
    write_junit(doc, tmp_path / "bad.xml")
    failed = [c.get("name") for c in ET.parse(tmp_path / "bad.xml").getroot() if c.find("failure") is not None]
    assert "router [layer=3, 10 pairs]" in failed


def test_a_pair_beyond_its_limit_at_95_but_not_at_the_fail_level_is_borderline() -> None:
    """The same 3x pair of 64 elements FAILs alone and is borderline among 10,000 units, its reason naming the
    comparison's FAIL level and the lower end there."""
    g = torch.Generator().manual_seed(5)
    a = torch.randn(64, generator=g, dtype=torch.float64)
    fb = a + 1e-3 * torch.randn(64, generator=g, dtype=torch.float64)
    b = a + 3e-3 * torch.randn(64, generator=g, dtype=torch.float64)
    floor = floor_from(measure_tensors(a, fb), Measured(None, None), have_floor=True)
    got = measure_tensors(a, b)
    assert got.metrics is not None

    pair = [("x", got.metrics, floor, ("float64", "float64"), got.blocks)]
    alone = Policy().decide_many(pair, have_floor=True)[0]
    many = Policy().decide_many(pair, have_floor=True, units=10_000)[0]
    assert alone.status == "fail" and alone.interval is not None and alone.interval[0] > 1.5
    assert many.status == "inconclusive" and many.borderline and many.interval == alone.interval
    assert many.fail_bound is not None and many.fail_bound < 1.5 < alone.interval[0]
    assert "FAIL level (0.999995)" in many.reasons[0]
