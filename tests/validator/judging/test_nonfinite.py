"""Non-finite values (issue 38, item 4): a pair with no finite element rests on no finite number, so it is
inconclusive unless its rule asks for matching non-finite values, and ``nonfinite = "match"`` always says
what it let through."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from validator.app.cli import main
from validator.judging.policy import Policy
from validator.numerics.floors import measure_blocks


def _cli(capsys: pytest.CaptureFixture[str], tmp_path: Path, *argv: str) -> tuple[int, str]:
    code = main(["--home", str(tmp_path / "home"), *argv])
    return code, capsys.readouterr().out


def _save(path: Path, **tensors: torch.Tensor) -> str:
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path))
    return str(path)


def _policy(tmp_path: Path, mode: str, extra: str = "rel_l2_max = 0.01") -> str:
    path = tmp_path / f"{mode}.toml"
    path.write_text(f'[[rule]]\nmatch = "*"\nnonfinite = "{mode}"\n{extra}\n')
    return str(path)


def _mixed() -> torch.Tensor:
    """Every element non-finite: NaN in the first half, +Inf and -Inf in the second."""
    x = torch.full((64, 64), math.nan, dtype=torch.float64)
    x[32:, :32], x[32:, 32:] = math.inf, -math.inf
    return x


def test_all_inf_in_every_run_is_inconclusive_with_and_without_a_floor(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inf = _save(tmp_path / "inf.safetensors", x=torch.full((64, 64), math.inf))
    for floor in ((), ("--floor", inf, inf)):
        code, out = _cli(capsys, tmp_path, "compare", inf, inf, *floor, "--json")
        doc = json.loads(out)
        pair = doc["pairs"][0]
        assert code == 3 and doc["verdict"] == "inconclusive", doc["headline"]
        assert doc["headline"].startswith("1 pair(s) with no finite element, e.g. x: no finite element: 4096 matching ±Inf")
        assert pair["status"] == "inconclusive" and not pair["borderline"]
        assert any("4096 matching ±Inf" in n for n in pair["notes"])
        assert 'a rule with nonfinite = "match" accepts matching NaN/Inf' in pair["reasons"][0]
    # a finite floor pair does not make an all-Inf pair judgeable
    g = torch.Generator().manual_seed(1)
    ref = torch.randn(64, 64, generator=g)
    fa, fb = _save(tmp_path / "fa.safetensors", x=ref), _save(tmp_path / "fb.safetensors", x=ref + 1e-3)
    neg = _save(tmp_path / "neg.safetensors", x=torch.full((64, 64), -math.inf))
    code, out = _cli(capsys, tmp_path, "compare", neg, neg, "--floor", fa, fb)
    assert code == 3 and "verdict: INCONCLUSIVE: 1 pair(s) with no finite element" in out


def test_match_passes_a_pair_with_no_finite_element_and_the_headline_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    mixed = _save(tmp_path / "mixed.safetensors", x=_mixed())
    code, out = _cli(capsys, tmp_path, "compare", mixed, mixed)  # default nonfinite = "fail": NaN fails
    assert code == 1 and "FAIL: x: NaN: 2048 in A, 2048 in B" in out
    code, out = _cli(capsys, tmp_path, "compare", mixed, mixed, "--policy", _policy(tmp_path, "match"), "--json")
    doc = json.loads(out)
    notes = doc["pairs"][0]["notes"]
    assert code == 0 and doc["verdict"] == "pass"
    assert '2048 matching NaN element(s), accepted by nonfinite = "match" and not compared' in notes
    assert 'no finite element: passes on its 2048 matching NaN and 2048 matching ±Inf element(s) alone (nonfinite = "match")' in notes
    assert doc["headline"] == (
        'all 1 pairs within their limits; 1 of them with no finite element, passed on matching NaN/Inf alone (nonfinite = "match"), e.g. x'
    )
    # a floor rule: the same, and the table's notes and headline carry it
    code, out = _cli(capsys, tmp_path, "compare", mixed, mixed, "--floor", mixed, mixed, "--policy", _policy(tmp_path, "match", "floor_multiple = 1.5"))
    assert code == 0 and "note: x: no finite element: passes on its" in out and "passed on matching NaN/Inf alone" in out
    # a different non-finite value still fails under "match"
    other = _mixed()
    other[0, 0] = math.inf
    code, out = _cli(capsys, tmp_path, "compare", mixed, _save(tmp_path / "other.safetensors", x=other), "--policy", _policy(tmp_path, "match"))
    assert code == 1 and "1 element(s) differ in NaN/Inf" in out


def test_match_always_notes_the_nan_it_accepted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    g = torch.Generator().manual_seed(2)
    x = torch.randn(64, 64, generator=g, dtype=torch.float64)
    x[:2] = math.nan  # 128 NaN among finite values that are compared
    a, b = _save(tmp_path / "a.safetensors", x=x), _save(tmp_path / "b.safetensors", x=x + 1e-6 * x.nan_to_num())
    code, out = _cli(capsys, tmp_path, "compare", a, b, "--policy", _policy(tmp_path, "match"), "--json")
    doc = json.loads(out)
    assert code == 0 and '128 matching NaN element(s), accepted by nonfinite = "match" and not compared' in doc["pairs"][0]["notes"]
    assert "no finite element" not in out
    # without block sums (no NaN count) the note counts the matching non-finite elements
    m, _ = measure_blocks(x, x.clone())
    d = Policy.from_dict({"rule": [{"match": "*", "nonfinite": "match", "rel_l2_max": 0.01}]}).decide("x", m, None, have_floor=False)
    assert d.status == "pass" and d.notes == ('128 matching NaN/±Inf element(s), accepted by nonfinite = "match" and not compared',)
    # no NaN, nothing to say
    m, blocks = measure_blocks(x.nan_to_num(), x.nan_to_num())
    assert Policy.from_dict({"rule": [{"match": "*", "nonfinite": "match"}]}).decide("x", m, None, have_floor=False, blocks=blocks).notes == ()


def test_ignore_does_not_pass_a_pair_with_no_finite_element(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    mixed = _save(tmp_path / "mixed.safetensors", x=_mixed())
    code, out = _cli(capsys, tmp_path, "compare", mixed, mixed, "--policy", _policy(tmp_path, "ignore"))
    assert code == 3 and 'no finite element: 2048 matching NaN and 2048 matching ±Inf element(s), nothing to judge (nonfinite = "ignore")' in out
    # one run non-finite everywhere, the other finite: not a single element to compare either
    finite = _save(tmp_path / "finite.safetensors", x=torch.ones(64, 64, dtype=torch.float64))
    code, out = _cli(capsys, tmp_path, "compare", finite, mixed, "--policy", _policy(tmp_path, "ignore"))
    assert code == 3 and "no finite element: 0 of 4096 element(s) non-finite in A, 4096 in B" in out


def test_only_a_pair_without_any_finite_element_is_affected() -> None:
    policy = Policy()
    x = torch.randn(16, 16, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    x[:, :15] = math.inf  # one finite element in each row: judged as before
    m, blocks = measure_blocks(x, x.clone())
    d = policy.decide("x", m, None, have_floor=False, blocks=blocks)
    assert d.status == "pass" and not d.no_finite and d.notes == ("240 matching ±Inf element(s), counted and not compared",)
    empty = torch.zeros(0, 4, dtype=torch.float64)  # no element at all: unchanged (identical, passes)
    m, blocks = measure_blocks(empty, empty)
    assert policy.decide("e", m, None, have_floor=False, blocks=blocks).status == "pass"
    m, blocks = measure_blocks(torch.full((3,), math.inf), torch.full((3,), math.inf))
    d = policy.decide("i", m, None, have_floor=False, blocks=blocks)
    assert d.status == "inconclusive" and d.no_finite and not d.borderline
