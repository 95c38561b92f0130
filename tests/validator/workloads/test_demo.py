from __future__ import annotations

import json
from pathlib import Path

from validator.app.cli import main


def test_demo_stores_four_runs_and_compares(tmp_path: Path, capsys) -> None:
    code = main(["--home", str(tmp_path / "h"), "demo", "--json", "--out", str(tmp_path / "b")])
    out = capsys.readouterr().out
    assert code == 0
    doc = json.loads(out)
    assert set(doc["runs"]) == {"ref", "concat", "partial-bf16", "partial-fp32"}
    fp32 = doc["comparisons"]["partial-fp32"]
    assert fp32["verdict"] == "pass"
    # fp32 accumulation reproduces the single-GEMM error: floor ratio ~1 on every floored tensor
    ratios = [p["floor_ratio"] for p in fp32["pairs"] if p["floor_kind"] == "measured"]
    assert ratios and all(0.9 < r < 1.1 for r in ratios)
    # every tensor got a floor: stage-level tensors (no single-GEMM counterpart) their rounding floor
    kinds = {p["name"]: p["floor_kind"] for p in fp32["pairs"] if p["rel_l2"] != 0}
    assert kinds["ctx.running"] == "rounding" and kinds["ctx.pre_norm"] == "measured"
    assert fp32["counts"]["inconclusive"] == 0
    # bf16 accumulation fails by the default policy, on the pre-norm sum, clear of its interval
    bf16_doc = doc["comparisons"]["partial-bf16"]
    assert bf16_doc["verdict"] == "fail" and bf16_doc["headline"].startswith("ctx.pre_norm")
    bf16 = {p["name"]: p for p in bf16_doc["pairs"]}
    assert bf16["ctx.pre_norm"]["status"] == "fail" and bf16["ctx.pre_norm"]["interval"][0] > 1.5
    code = main(["--home", str(tmp_path / "h"), "runs", "--json"])
    assert code == 0 and len(json.loads(capsys.readouterr().out)["runs"]) == 4


def test_demo_text_numbers_its_steps_and_prints_the_commands(tmp_path: Path, capsys) -> None:
    code = main(["--home", str(tmp_path / "h"), "demo", "--out", str(tmp_path / "b")])
    out = capsys.readouterr().out
    assert code == 0
    assert "\n3. compare partial-fp32" in out and "\n4. compare partial-bf16" in out
    # the commands that reproduce the verdicts with the default policy, and the verdicts themselves
    commands = [line.strip() for line in out.splitlines() if line.strip().startswith("validator compare ")]
    assert len(commands) == 2 and all("--floor" in c and "--policy" not in c for c in commands)
    assert "partial-fp32: PASS" in out and "partial-bf16: FAIL: ctx.pre_norm" in out
