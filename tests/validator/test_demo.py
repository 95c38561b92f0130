from __future__ import annotations

import json
from pathlib import Path

from validator.cli import main


def test_demo_stores_four_runs_and_compares(tmp_path: Path, capsys) -> None:
    code = main(["--home", str(tmp_path / "h"), "demo", "--json", "--out", str(tmp_path / "b")])
    out = capsys.readouterr().out
    assert code == 0
    doc = json.loads(out)
    assert set(doc["runs"]) == {"ref", "concat", "partial-bf16", "partial-fp32"}
    fp32 = doc["comparisons"]["partial-fp32"]
    assert fp32["verdict"] == "pass"
    # fp32 accumulation reproduces the single-GEMM error: floor ratio ~1 on every floored tensor
    ratios = [p["floor_ratio"] for p in fp32["pairs"] if p["floor_ratio"] is not None]
    assert ratios and all(0.9 < r < 1.1 for r in ratios)
    # bf16 accumulation is measurably worse at the pre-norm sum
    bf16 = {p["name"]: p for p in doc["comparisons"]["partial-bf16"]["pairs"]}
    assert bf16["ctx.pre_norm"]["floor_ratio"] > 1.3
    code = main(["--home", str(tmp_path / "h"), "runs", "--json"])
    assert code == 0 and len(json.loads(capsys.readouterr().out)["runs"]) == 4
