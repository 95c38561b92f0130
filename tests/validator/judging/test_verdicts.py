"""Verdicts: floors of every kind, intervals, borderlines, non-finite rules and the deciding reason."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from tests.paths import ROOT
from validator.app.cli import main
from validator.numerics.floors import (
    BLOCKS,
    BlockSums,
    block_sums,
    bootstrap_interval,
    bootstrap_intervals,
    more_precise,
    rounding_sums,
)

EXAMPLE_POLICY = ROOT / "examples" / "policies" / "k3-dflash-pp-pd.toml"


def _cli(capsys, tmp_path: Path, *argv: str) -> tuple[int, str, str]:
    code = main(["--home", str(tmp_path / "home"), *argv])
    out, err = capsys.readouterr()
    return code, out, err


def _save(path: Path, **tensors: torch.Tensor) -> str:
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path))
    return str(path)


# -- block sums and intervals against float64 NumPy ------------------------------------------------


def _np_blocks(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    # rows along the first dimension when it has at least BLOCKS entries, else every element is a row
    rows = a.reshape(a.shape[0], a.size // a.shape[0]) if a.ndim > 1 and a.shape[0] >= BLOCKS else a.reshape(-1, 1)
    rb = b.reshape(rows.shape)
    n = min(BLOCKS, rows.shape[0])
    d2, a2 = np.zeros(n), np.zeros(n)
    for j in range(n):
        lo, hi = j * rows.shape[0] // n, (j + 1) * rows.shape[0] // n
        x, y = rows[lo:hi].astype(np.float64), rb[lo:hi].astype(np.float64)
        ok = np.isfinite(x) & np.isfinite(y)
        d2[j] = np.sum((np.where(ok, y, 0.0) - np.where(ok, x, 0.0)) ** 2)
        a2[j] = np.sum(np.where(ok, x, 0.0) ** 2)
    return d2, a2


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn])
@pytest.mark.parametrize("shape", [(300, 17), (5,), (0, 4), (3, 2, 7), ()])
def test_block_sums_match_float64_numpy(dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    g = torch.Generator().manual_seed(3)
    a = torch.randn(shape, generator=g, dtype=torch.float64)
    b = a + 0.01 * torch.randn(shape, generator=g, dtype=torch.float64)
    if a.numel() > 4:
        a.view(-1)[1], b.view(-1)[2], a.view(-1)[3], b.view(-1)[3] = math.nan, math.inf, -math.inf, -math.inf
    a, b = a.to(dtype), b.to(dtype)
    got = block_sums(a, b)
    na, nb = a.double().numpy(), b.double().numpy()
    d2, a2 = _np_blocks(na, nb)
    rel = 1e-12 if dtype == torch.float64 else 1e-6  # the engine's stated accuracy (float32 inside a block)
    assert np.allclose(got.d2, d2, rtol=rel, atol=0) and np.allclose(got.a2, a2, rtol=rel, atol=0)
    assert got.nan_a == int(np.isnan(na).sum()) and got.nan_b == int(np.isnan(nb).sum())
    assert got.inf_matched == int((np.isinf(na) & (na == nb)).sum())


def test_rounding_floor_is_the_reference_rounded() -> None:
    a = torch.randn(200, 30, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    got = rounding_sums(a, "float16")
    x = a.numpy()
    expect = np.linalg.norm(x.astype(np.float16).astype(np.float64) - x) / np.linalg.norm(x)
    assert got.rel_l2 == pytest.approx(expect, rel=1e-12)
    assert 1e-4 < got.rel_l2 < 1e-3  # about a third of float16's unit roundoff
    assert more_precise("float64", "bfloat16") and not more_precise("bfloat16", "bfloat16")
    assert not more_precise("int64", "float32")


def test_interval_brackets_the_ratio_and_is_deterministic() -> None:
    g = torch.Generator().manual_seed(2)
    a = torch.randn(512, 64, generator=g, dtype=torch.float64)
    floor = block_sums(a, a + 1e-3 * torch.randn(512, 64, generator=g, dtype=torch.float64))
    cand = block_sums(a, a + 2e-3 * torch.randn(512, 64, generator=g, dtype=torch.float64))
    lo, hi = bootstrap_interval(cand, floor)
    ratio = cand.rel_l2 / floor.rel_l2
    assert lo < ratio < hi and 1.8 < lo and hi < 2.2
    assert bootstrap_interval(cand, floor) == (lo, hi)
    assert bootstrap_interval(cand, cand) == (1.0, 1.0)  # paired: the same errors give exactly 1


@pytest.mark.parametrize(("blocks", "zero_reference_blocks"), [(64, 0), (64, 40), (3, 0), (3, 2)])
def test_interval_ends_are_the_nearest_ranks_of_the_resampled_values(blocks: int, zero_reference_blocks: int) -> None:
    """The 2.5% and 97.5% nearest ranks (25th and 975th of 1,000) of the resampled rel_l2 values, undefined
    resamples (every drawn reference block zero) counted as +inf."""
    from validator.numerics.floors import RESAMPLES, BlockSums, _draws

    rng = np.random.default_rng(7)
    d2, a2 = rng.random(blocks) * 1e-4, rng.random(blocks) + 0.5
    a2[:zero_reference_blocks] = 0.0
    draws, _ = _draws(blocks, None, RESAMPLES)  # [blocks, resamples]: how often each resample draws each block
    with np.errstate(divide="ignore", invalid="ignore"):  # float64 NumPy, on its own
        values = np.sqrt((draws * d2[:, None]).sum(0) / (draws * a2[:, None]).sum(0))
    values = np.sort(np.where(np.isnan(values), np.inf, values))
    lo, hi = bootstrap_interval(BlockSums(d2, a2, blocks))
    for got, want in ((lo, values[24]), (hi, values[974])):
        assert got == want or math.isclose(got, want, rel_tol=1e-12)
    assert math.isinf(hi) == (blocks == 3 and zero_reference_blocks == 2)  # (2/3)^3 of the resamples undefined


def _sums(rng: np.random.Generator, blocks: int, rows: int, zero_reference_blocks: int = 0) -> BlockSums:
    d2, a2 = rng.random(blocks) * 1e-4, rng.random(blocks) + 0.5
    a2[:zero_reference_blocks] = 0.0
    return BlockSums(d2, a2, rows)


def test_intervals_drawn_together_are_each_pairs_alone() -> None:
    """bootstrap_intervals of pairs drawn alike and not (no floor, a paired floor, floors of other block or
    row counts, a floor of no blocks, no blocks at all), mixed in one call: each one's interval alone."""
    rng = np.random.default_rng(11)
    wanted: list[tuple[BlockSums, BlockSums | None]] = []
    for blocks, rows in ((64, 640), (64, 640), (3, 3), (64, 64), (0, 0)):
        cand = _sums(rng, blocks, rows, zero_reference_blocks=blocks // 3)
        for floor in (None, _sums(rng, blocks, rows), _sums(rng, blocks, rows + 1), _sums(rng, 5, 5), _sums(rng, 0, 0)):
            wanted.append((cand, floor))
    alone = [bootstrap_interval(cand, floor) for cand, floor in wanted]
    assert bootstrap_intervals(wanted) == alone
    assert bootstrap_intervals(wanted[::-3]) == alone[::-3]
    assert alone[-1] == (0.0, 0.0) and len(set(alone)) > 15


def test_decisions_of_many_pairs_are_each_pairs_alone() -> None:
    """Policy.decide_many: the decisions of Policy.decide one by one, whichever intervals each pair draws."""
    from validator.judging.policy import Floor, Policy
    from validator.numerics.floors import measure_blocks

    g = torch.Generator().manual_seed(5)
    ref = torch.randn(128, 32, generator=g, dtype=torch.float64)
    floor_m, floor_b = measure_blocks(ref, ref + 1e-3 * torch.randn(128, 32, generator=g, dtype=torch.float64))
    floors = [None, Floor("measured", floor_m.rel_l2, floor_b), Floor("rounding", floor_m.rel_l2), Floor("none", reason="no")]
    pairs = []
    for i, scale in enumerate((0.0, 5e-4, 1e-3, 2e-3, 1e-2)):
        m, blocks = measure_blocks(ref, ref + scale * torch.randn(128, 32, generator=g, dtype=torch.float64))
        for j, floor in enumerate(floors):
            pairs.append((f"x{i}", m, floor, ("float64", "bfloat16"), blocks if (i + j) % 3 else None))
    rules = [{"match": "x1", "rel_l2_max": 2e-3, "floor_multiple": 2.0, "cosine_min": 0.9999},
             {"match": "x2", "floor_multiple": 1.2, "floor_min_rel_l2": 1e-3, "rounding_multiple": 2.0},
             {"match": "x3", "max_abs_max": 0.01, "rel_l2_max": 1e-3}]  # fmt: skip
    seen = []
    for policy in (Policy(), Policy.from_dict({"rule": rules})):
        for have_floor in (False, True):
            alone = [policy.decide(n, m, f, have_floor=have_floor, dtypes=d, blocks=b) for n, m, f, d, b in pairs]
            assert policy.decide_many(pairs, have_floor=have_floor) == alone
            seen += alone
    assert {d.status for d in seen} == {"pass", "fail", "inconclusive"}
    assert {d.judged for d in seen} == {None, "rel_l2", "x floor"}
    assert sum(d.interval is not None and d.interval[0] < d.interval[1] for d in seen) > 10


# -- the bugs of issue 16 --------------------------------------------------------------------------


def test_all_nan_fails_by_default(tmp_path: Path, capsys) -> None:
    nan = _save(tmp_path / "nan.safetensors", x=torch.full((64, 64), math.nan))
    code, out, _ = _cli(capsys, tmp_path, "compare", nan, nan)
    assert code == 1 and "FAIL: x: NaN: 4096 in A, 4096 in B" in out
    # a rule can accept NaN where both runs have it
    (tmp_path / "p.toml").write_text('[[rule]]\nmatch = "*"\nnonfinite = "match"\nrel_l2_max = 0.01\n')
    code, out, _ = _cli(capsys, tmp_path, "compare", nan, nan, "--policy", str(tmp_path / "p.toml"))
    assert code == 0, out


def test_matching_infinities_pass_and_are_counted(tmp_path: Path, capsys) -> None:
    x = torch.randn(32, 8, dtype=torch.float64)
    x[0, :3] = -math.inf
    a = _save(tmp_path / "a.safetensors", logits=x)
    b = _save(tmp_path / "b.safetensors", logits=x.clone())
    code, out, _ = _cli(capsys, tmp_path, "compare", a, b, "--json")
    pair = json.loads(out)["pairs"][0]
    assert code == 0 and any("3 matching ±Inf" in n for n in pair["notes"])
    y = x.clone()
    y[0, 0] = 0.0
    b2 = _save(tmp_path / "b2.safetensors", logits=y)
    code, out, _ = _cli(capsys, tmp_path, "compare", a, b2)
    assert code == 1 and "differ in NaN/Inf" in out


def test_borderline_pair_is_inconclusive_with_its_interval(tmp_path: Path, capsys) -> None:
    g = torch.Generator().manual_seed(5)
    ref = torch.randn(40, 4, generator=g, dtype=torch.float64)
    e1, e2 = torch.randn(40, 4, generator=g, dtype=torch.float64), torch.randn(40, 4, generator=g, dtype=torch.float64)
    e2 *= 1.5 * e1.norm() / e2.norm()  # exactly the 1.5x limit, from independent errors on 40 rows
    files = [_save(tmp_path / f"{n}.safetensors", x=ref + 1e-3 * e) for n, e in (("ref", 0 * e1), ("fl", e1), ("c", e2))]
    code, out, _ = _cli(capsys, tmp_path, "compare", files[0], files[2], "--floor", files[0], files[1], "--json")
    doc = json.loads(out)
    pair = doc["pairs"][0]
    assert code == 3 and pair["status"] == "inconclusive" and pair["borderline"]
    lo, hi = pair["interval"]
    assert lo < 1.5 < hi and "borderline" in doc["headline"] and "straddles 1.5x" in doc["headline"]


def test_stage_level_tensors_get_a_rounding_floor(tmp_path: Path, capsys) -> None:
    g = torch.Generator().manual_seed(6)
    ref = torch.randn(256, 32, generator=g, dtype=torch.float64)
    a = _save(tmp_path / "a.safetensors", y=ref, stage=ref * 2)
    fl = _save(tmp_path / "f.safetensors", y=ref.bfloat16())  # the floor pair has no `stage`
    ok = _save(tmp_path / "ok.safetensors", y=ref.bfloat16(), stage=(ref * 2).bfloat16())
    code, out, _ = _cli(capsys, tmp_path, "compare", a, ok, "--floor", a, fl, "--json")
    by = {p["name"]: p for p in json.loads(out)["pairs"]}
    assert code == 0 and by["stage"]["floor_kind"] == "rounding" and by["y"]["floor_kind"] == "measured"
    assert by["stage"]["value"] == pytest.approx(1.0)
    # ten bf16 roundings' worth of error fails against the rounding floor
    bad = _save(tmp_path / "bad.safetensors", y=ref.bfloat16(), stage=(ref * 2 * (1 + 0.02 * torch.randn(256, 32, generator=g, dtype=torch.float64))).bfloat16())
    code, out, _ = _cli(capsys, tmp_path, "compare", a, bad, "--floor", a, fl)
    assert code == 1 and "FAIL: stage:" in out and "rounding floor" in out
    # no floor of any kind (same dtype, not in the floor pair): inconclusive, and the reason says so
    same = _save(tmp_path / "same.safetensors", y=ref, stage=ref * 2 + 1e-3)
    code, out, _ = _cli(capsys, tmp_path, "compare", a, same, "--floor", a, fl)
    assert code == 3 and "without a floor" in out and "not in the floor pair" in out


def test_headline_names_tensors_missing_on_one_side(tmp_path: Path, capsys) -> None:
    x = torch.ones(4, dtype=torch.float64)
    a = _save(tmp_path / "a.safetensors", x=x)
    b = _save(tmp_path / "b.safetensors", x=x, **{f"extra{i}": x.clone() for i in range(9)})
    code, out, _ = _cli(capsys, tmp_path, "compare", a, b)
    assert code == 1 and "verdict: FAIL: 9 tensor(s) only in B" in out and "9 only in B" in out


def test_example_policy_fails_a_bad_pair_without_a_floor(tmp_path: Path, capsys) -> None:
    g = torch.Generator().manual_seed(7)
    ref = torch.randn(512, 64, generator=g)
    cand = ref + 0.185 * torch.randn(512, 64, generator=g)  # rel_l2 ~0.185: 6x the bf16 bound
    a = _save(tmp_path / "a.safetensors", **{"ctx.pre_norm": ref.bfloat16()})
    b = _save(tmp_path / "b.safetensors", **{"ctx.pre_norm": cand.bfloat16()})
    code, out, _ = _cli(capsys, tmp_path, "compare", a, b, "--policy", str(EXAMPLE_POLICY))
    assert code == 1 and "rel_l2 0.18" in out and "> 0.03" in out


def test_padded_rows_and_single_tokens_get_honest_intervals(tmp_path: Path, capsys) -> None:
    g = torch.Generator().manual_seed(8)
    # 8 decode slots, 4 of them padding (zero in every run): a 10x drift must fail, not turn borderline
    ref = torch.randn(8, 512, generator=g, dtype=torch.float64)
    ref[4:] = 0
    e1, e2 = torch.randn(8, 512, generator=g, dtype=torch.float64), torch.randn(8, 512, generator=g, dtype=torch.float64)
    e1[4:], e2[4:] = 0, 0
    files = [_save(tmp_path / f"{n}.safetensors", x=ref + s * e) for n, s, e in (("r", 0, e1), ("f", 1e-3, e1), ("c", 1e-2, e2))]
    code, out, _ = _cli(capsys, tmp_path, "compare", files[0], files[2], "--floor", files[0], files[1], "--json")
    pair = json.loads(out)["pairs"][0]
    assert code == 1 and pair["status"] == "fail" and all(math.isfinite(x) for x in pair["interval"])
    # one decode token: the interval comes from blocks of elements, not a single row
    row = torch.randn(1, 7168, generator=g, dtype=torch.float64)
    a = _save(tmp_path / "a.safetensors", h=row)
    b = _save(tmp_path / "b.safetensors", h=row + 0.03 * torch.randn(1, 7168, generator=g, dtype=torch.float64))
    code, out, _ = _cli(capsys, tmp_path, "compare", a, b, "--json")
    lo, hi = json.loads(out)["pairs"][0]["interval"]
    assert lo < hi


def test_floor_pair_with_nan_is_not_used_as_a_floor(tmp_path: Path, capsys) -> None:
    g = torch.Generator().manual_seed(9)
    ref = torch.randn(256, 16, generator=g, dtype=torch.float64)
    bad_floor = (ref + 1e-3).clone()
    bad_floor[:128] = math.nan
    a = _save(tmp_path / "a.safetensors", x=ref)
    fl = _save(tmp_path / "fl.safetensors", x=bad_floor)
    c = _save(tmp_path / "c.safetensors", x=ref + 1e-3 * torch.randn(256, 16, generator=g, dtype=torch.float64))
    code, out, _ = _cli(capsys, tmp_path, "compare", a, c, "--floor", a, fl, "--json")
    pair = json.loads(out)["pairs"][0]
    assert code == 3 and pair["floor_kind"] == "none" and "floor pair has NaN" in " ".join(pair["reasons"])


def test_effective_rule_is_the_matching_rule_else_the_default_for_the_dtypes() -> None:
    from validator.judging.policy import FLOOR_MULTIPLE, Policy, Rule, default_rel_l2

    pol = Policy.from_dict({"rule": [{"match": "draft.*", "rel_l2_max": 0.5}]})
    assert pol.effective_rule("draft.k", ("float32", "bfloat16"), have_floor=True) == Rule(match="draft.*", rel_l2_max=0.5)
    for dtypes in (("float32", "bfloat16"), ("float32", "float32"), ("int64", "int64")):
        assert pol.effective_rule("hidden", dtypes, have_floor=False) == Rule(rel_l2_max=default_rel_l2(*dtypes))
        assert Policy().effective_rule("hidden", dtypes, have_floor=True) == Rule(floor_multiple=FLOOR_MULTIPLE)
    assert Policy().effective_rule("hidden", ("float32", "bfloat16"), have_floor=False).rel_l2_max == 3e-2


# -- issue 38: a printed FAIL never shows a bound within its limit ---------------------------------------


def test_fail_just_above_the_limit_prints_its_lower_bound_above_it(tmp_path: Path, capsys) -> None:
    import re

    from validator.judging.report import format_comparison

    g = torch.Generator().manual_seed(38)
    ref = torch.randn(256, 16, generator=g, dtype=torch.float64)
    e1, e2 = torch.randn(256, 16, generator=g, dtype=torch.float64), torch.randn(256, 16, generator=g, dtype=torch.float64)
    files = {n: _save(tmp_path / f"{n}.safetensors", x=ref + 1e-3 * e) for n, e in (("ref", 0 * e1), ("fl", e1), ("c1", e2))}
    code, out, _ = _cli(capsys, tmp_path, "compare", files["ref"], files["c1"], "--floor", files["ref"], files["fl"], "--json")
    lo1 = json.loads(out)["pairs"][0]["interval"][0]
    # the candidate's error scaled so that its interval's lower end is 1.50004: every resampled ratio scales alike
    scale = 1.50004 / lo1
    cand = _save(tmp_path / "c.safetensors", x=ref + scale * 1e-3 * e2)
    code, out, _ = _cli(capsys, tmp_path, "compare", files["ref"], cand, "--floor", files["ref"], files["fl"], "--json")
    doc = json.loads(out)
    lo, hi = doc["pairs"][0]["interval"]
    assert code == 1 and 1.5 < lo < 1.5001, (lo, hi)
    got = re.search(r"(\S+)x measured floor \[(\S+), (\S+)\] > 1\.5x", doc["headline"])
    assert got is not None, doc["headline"]
    shown_value, shown_lo, shown_hi = (float(x) for x in got.groups())
    assert 1.5 < shown_lo <= lo and shown_hi >= hi and shown_value > 1.5  # was "[1.5, ...] > 1.5x"
    # the table (CLI, Markdown, dashboard) prints the same interval, outward and clear of the limit
    cell = re.search(r"x \[(\S+), (\S+)\]\s+1\.5x", format_comparison(doc))
    assert cell is not None and 1.5 < float(cell[1]) <= lo and float(cell[2]) >= hi


def test_thousands_of_undecided_pairs_are_each_counted_once() -> None:
    """An INCONCLUSIVE verdict over thousands of undecided pairs: each counted under one reason (borderline first,
    then no finite element, then no floor), the pairs told apart by identity (a list's ``in`` would compare
    every pair with every other, field by field: seconds for 4,464 pairs)."""
    from validator.judging.compare import PairResult, pair_frontier, tensor_verdict
    from validator.judging.policy import Decision, Policy

    pairs = [
        PairResult(f"t{i % 3}", {"layer": i}, f"t{i % 3} [layer={i}]", "inconclusive", None,
                   Decision("inconclusive", 0.03, ("undecided",), borderline=i % 2 == 0, no_finite=i % 3 == 0))
        for i in range(4464)
    ]
    verdict, reasons = tensor_verdict(pairs, [], [], Policy(), pair_frontier(pairs))
    assert verdict == "inconclusive"
    assert reasons[0] == ("2232 pair(s) borderline, e.g. t0 [layer=0]: undecided; 744 pair(s) with no finite element, "
                          "e.g. t0 [layer=3]: undecided; 1488 pair(s) without a floor, e.g. t1 [layer=1]: undecided")
