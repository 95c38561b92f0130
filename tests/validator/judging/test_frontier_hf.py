"""Known answer on the transformers engine (the committed tiny pair, on the CPU): a broken PD hand-off, with
``--break head`` and with ``--break layer``, parts at the hand-off tensors of target layer 1 at step 0, once
per request, and everything that fails later is downstream of it; acceptance parts later, at a verify step."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.paths import ROOT
from validator.app.cli import main

pytest.importorskip("transformers")

POLICY = ROOT / "examples" / "policies" / "hf-tiny-pd.toml"
NAMES = "target.hidden,target.k,target.v,draft.k,draft.v,draft.logits"
COMMON = ["--limit", "2", "--max-new-tokens", "8", "--threads", "1", "--names", NAMES]


@pytest.fixture(scope="module")
def hf(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """D-only and both broken PD runs, as `validator probe transformers` writes them (2 prompts, 8 tokens)."""
    root = tmp_path_factory.mktemp("hf-frontier")
    runs = {"d-only": ["--mode", "d-only"], "head": ["--mode", "pd-broken", "--break", "head"],
            "layer": ["--mode", "pd-broken", "--break", "layer"]}
    for name, mode in runs.items():
        assert main(["probe", "transformers", *mode, "--out", str(root / name), *COMMON]) == 0
    return {name: root / name for name in runs}


@pytest.mark.parametrize("broken", ["head", "layer"])
def test_broken_handoff_parts_at_layer_1_at_step_0(hf: dict[str, Path], broken: str, tmp_path: Path, capsys: Any) -> None:
    capsys.readouterr()
    code = main(["--home", str(tmp_path / "h"), "compare", str(hf["d-only"]), str(hf[broken]), "--json",
                 "--policy", str(POLICY)])
    doc = json.loads(capsys.readouterr().out)
    assert code == 1 and doc["verdict"] == "fail"
    first = doc["first_divergence"]
    assert first["where"] == "target.k layer 1, step 0, request q000"
    assert first["label"].startswith("target.k [step=0 req=q000 ") and doc["headline"].startswith(first["label"])
    # one problem node per request: each request's hand-off broke on its own
    assert [p["where"] for p in doc["problem_nodes"]] == [f"target.k layer 1, step 0, request q00{i}" for i in range(2)]
    # everything else that fails is downstream: the same layer's V, then what the decode computed from the cache
    failing = [p for p in doc["pairs"] if p["status"] in ("fail", "error")]
    assert doc["downstream"]["pairs"] == len(failing) - 2
    groups = {(g["name"], g["layer"]): g["pairs"] for g in doc["downstream"]["groups"]}
    assert groups[("target.v", 1)] == 2
    step0 = [p for p in failing if p["coords"]["step"] == 0]
    assert {(p["name"], p["coords"]["layer"]) for p in step0} == {("target.k", 1), ("target.v", 1)}
    # acceptance and the greedy output part at a verify step, after the tensors did
    parting = doc["acceptance"]["frontier"]
    assert parting["requests"] == 2
    if parting["first_acceptance"] is not None:
        assert parting["first_acceptance"]["acceptance_step"] >= 1
    capsys.readouterr()
    main(["--home", str(tmp_path / "h"), "compare", str(hf["d-only"]), str(hf[broken]), "--policy", str(POLICY)])
    text = capsys.readouterr().out
    verdict = text[text.index("\nverdict: FAIL: target.k [step=0 req=q000 "):]
    assert "\n  first divergence: target.k layer 1, step 0, request q000\n" in verdict
    assert "\n  problem nodes (failing, every upstream pair passing): 2: target.k layer 1 x 2\n" in verdict
    assert f"\n  then {len(failing) - 2} pairs downstream: " in verdict
    assert "\n  acceptance " in verdict
