"""`validator probe transformers` end to end on the committed GSM8K-trained pair: D-only vs PD through a
safetensors KV hand-off (TP4 -> TP8 by KV head, two processes) is equivalent; a broken hand-off fails
where it is broken. Bad input is refused with exit 2."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.paths import ROOT
from validator.app.cli import main

pytest.importorskip("transformers")

POLICY = ROOT / "examples" / "policies" / "hf-tiny-pd.toml"


def _compare(tmp_path: Path, capsys: Any, a: Path, b: Path) -> tuple[int, dict[str, Any]]:
    capsys.readouterr()
    code = main(["--home", str(tmp_path / "h"), "compare", str(a), str(b), "--json", "--policy", str(POLICY)])
    return code, json.loads(capsys.readouterr().out)


def test_parts_and_outputs(bundles: dict[str, Path]) -> None:
    assert sorted(p.name for p in (bundles["d-only"] / "parts").iterdir()) == ["donly"]
    assert sorted(p.name for p in (bundles["pd"] / "parts").iterdir()) == ["decode", "prefill"]
    assert not (bundles["pd"] / "handoff").exists()
    runs = {m: json.loads((b / "hf-run.json").read_text())["processes"] for m, b in bundles.items()}
    assert runs["d-only"][0]["outputs"] == runs["pd"][1]["outputs"]  # greedy: the same text
    pos = runs["d-only"][0]["per_position"]
    assert 0.3 < pos[-1] <= pos[0] < 0.95, pos


def test_d_only_vs_pd_equivalent(bundles: dict[str, Path], tmp_path: Path, capsys: Any) -> None:
    code, doc = _compare(tmp_path, capsys, bundles["d-only"], bundles["pd"])
    assert code == 0 and doc["verdict"] == "pass", doc["reasons"]
    names = {p["name"] for p in doc["pairs"]}
    assert {"target.k", "draft.v", "target.hidden", "target.logits", "draft.logits"} <= names
    assert not doc["only_a"] and not doc["only_b"]
    assert doc["acceptance"]["verdict"] == "pass"


def test_d_only_vs_broken_pd_fails_at_the_misplaced_heads(bundles: dict[str, Path], tmp_path: Path,
                                                          capsys: Any) -> None:
    code, doc = _compare(tmp_path, capsys, bundles["d-only"], bundles["pd-broken"])
    assert code == 1 and doc["verdict"] == "fail"
    kv = [p for p in doc["pairs"] if p["name"] in ("target.k", "target.v")]
    bad = {p["coords"]["layer"] for p in kv if p["status"] == "fail"}
    assert bad == {1}  # layer 1's cache is the one misplaced; every other layer arrived intact
    assert all(p["status"] == "pass" for p in doc["pairs"] if p["name"] in ("draft.k", "draft.v"))


def test_bad_input_exit_2(tmp_path: Path, capsys: Any) -> None:
    bad = tmp_path / "p.jsonl"
    bad.write_text('{"text": 1}\n')
    assert main(["probe", "transformers", "--out", str(tmp_path / "o"), "--prompts", str(bad)]) == 2
    assert f"{bad} line 1" in capsys.readouterr().err
    assert main(["probe", "transformers", "--out", str(tmp_path / "o"), "--model", str(tmp_path)]) == 2
    assert "no config.json" in capsys.readouterr().err
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text((ROOT / "examples/models/gsm8k-llama-tiny/target/config.json").read_text())
    (tmp_path / "m" / "model.safetensors").write_bytes(b"not safetensors")
    assert main(["probe", "transformers", "--out", str(tmp_path / "o"), "--model", str(tmp_path / "m")]) == 2
    assert f"{tmp_path / 'm'}: cannot load the model" in capsys.readouterr().err
    cfg = tmp_path / "c.json"
    cfg.write_text('{"model_type": "llama", "hidden_size": "wide"}')
    assert main(["probe", "transformers", "--out", str(tmp_path / "o"), "--model", str(cfg)]) == 2
    assert f"{cfg}: invalid llama config" in capsys.readouterr().err
