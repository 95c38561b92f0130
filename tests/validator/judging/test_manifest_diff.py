"""Weight manifests: reading (errors), hashing safetensors on the fly, the diff and its verdicts, the CLI."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from probes.rl.weights import write_manifest as probe_write
from validator.app.cli import main
from validator.errors import InputError
from validator.judging.manifest_diff import diff_manifests, zero_sha256
from validator.runs.weight_manifest import load_side, manifest_from_dict, manifest_of_safetensors, read_manifest


def _sd(seed: int = 0, lora_b_zero: bool = True) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "base.weight": torch.randn(8, 4, generator=g).to(torch.bfloat16),
        "layer.lora_A.weight": torch.randn(2, 4, generator=g),
        "layer.lora_B.weight": torch.zeros(8, 2) if lora_b_zero else torch.randn(8, 2, generator=g),
    }


def test_identical_and_content_change(tmp_path: Path) -> None:
    a = _sd()
    probe_write(a, tmp_path / "a.json", version=3)
    probe_write(dict(a), tmp_path / "b.json", version=3)
    d = diff_manifests(read_manifest(tmp_path / "a.json"), read_manifest(tmp_path / "b.json"))
    assert d.verdict == "identical" and d.exit_code == 0 and d.unchanged == 3
    b = dict(a, **{"base.weight": a["base.weight"] + 1})
    probe_write(b, tmp_path / "c.json", version=3)
    d = diff_manifests(read_manifest(tmp_path / "a.json"), read_manifest(tmp_path / "c.json"))
    assert d.verdict == "different" and [c.name for c in d.changed] == ["base.weight"] and d.changed[0].numeric is None


def test_missing_extra_dtype_shape(tmp_path: Path) -> None:
    a = _sd()
    b = {"base.weight": a["base.weight"].float(), "layer.lora_A.weight": a["layer.lora_A.weight"][:1], "new": torch.ones(1)}
    d = diff_manifests(manifest_from_dict(_doc(a)), manifest_from_dict(_doc(b)))
    assert d.missing == ("layer.lora_B.weight",) and d.extra == ("new",)
    assert {c.name: c.kind for c in d.changed} == {"base.weight": "dtype", "layer.lora_A.weight": "shape"}
    assert d.verdict == "different"
    json.dumps(d.to_dict(), allow_nan=False)


def _doc(sd: dict[str, torch.Tensor], version: int | None = None) -> dict[str, object]:
    from probes.rl.weights import manifest_from_state_dict

    return manifest_from_state_dict(sd, version=version)


def test_update_changed_nothing_and_real_update() -> None:
    a = _sd()
    d = diff_manifests(manifest_from_dict(_doc(a, 1)), manifest_from_dict(_doc(a, 2)))
    assert d.update and d.verdict == "different" and "update changed nothing" in d.reasons[0]
    b = dict(a, **{"layer.lora_B.weight": torch.full((8, 2), 0.5)})
    d = diff_manifests(manifest_from_dict(_doc(a, 1)), manifest_from_dict(_doc(b, 2)))
    assert d.verdict == "updated" and d.exit_code == 0


def test_lora_b_must_be_zero_at_version_1() -> None:
    ok = manifest_from_dict(_doc(_sd(), 1))
    bad = manifest_from_dict(_doc(_sd(lora_b_zero=False), 1))
    d = diff_manifests(ok, ok)
    assert d.verdict == "identical" and d.lora_b["A"] == {"checked": 1, "nonzero": []}
    d = diff_manifests(bad, bad)
    assert d.verdict == "different" and d.lora_b["A"]["nonzero"] == ["layer.lora_B.weight"]
    assert any("not zero at version 1" in r for r in d.reasons)
    later = manifest_from_dict(_doc(_sd(lora_b_zero=False), 2))
    assert diff_manifests(later, later).verdict == "identical"  # only version 1 is checked
    assert zero_sha256(0) == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


def test_numeric_comparison_from_safetensors(tmp_path: Path) -> None:
    a = _sd()
    b = dict(a, **{"layer.lora_A.weight": a["layer.lora_A.weight"] * 1.01, "base.weight": a["base.weight"].float()})
    save_file(a, str(tmp_path / "a.safetensors"))
    (tmp_path / "b").mkdir()
    save_file(b, str(tmp_path / "b" / "model.safetensors"))
    d = diff_manifests(load_side(tmp_path / "a.safetensors"), load_side(tmp_path / "b"))
    ch = {c.name: c for c in d.changed}
    ref = a["layer.lora_A.weight"].double().numpy()
    cand = b["layer.lora_A.weight"].double().numpy()
    want = float(np.linalg.norm(cand - ref) / np.linalg.norm(ref))
    num = ch["layer.lora_A.weight"].numeric
    assert num is not None and math.isclose(num["rel_l2"], want, rel_tol=1e-6)
    assert num["conversion"] == "float32 -> float64"
    num = ch["base.weight"].numeric
    assert num is not None and num["rel_l2"] == 0.0 and num["conversion"] == "bfloat16 and float32 -> float64"
    assert "compared as" in d.format_text()


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ([], "a manifest must be a JSON object"),
        ({"format": "x"}, "not a weight manifest"),
        ({"format": "validator.weight_manifest", "format_version": 9, "tensors": {}}, "unsupported format_version"),
        ({"format": "validator.weight_manifest", "tensors": []}, "'tensors' must be an object"),
        ({"format": "validator.weight_manifest", "version": -1, "tensors": {}}, "'version' must be an int >= 0"),
        ({"format": "validator.weight_manifest", "tensors": {"w": {"dtype": "f32", "shape": [1], "sha256": "0" * 64}}}, "tensor 'w': unknown dtype"),
        ({"format": "validator.weight_manifest", "tensors": {"w": {"dtype": "float32", "shape": [-1], "sha256": "0" * 64}}}, "tensor 'w': 'shape'"),
        ({"format": "validator.weight_manifest", "tensors": {"w": {"dtype": "float32", "shape": [1], "sha256": "xyz"}}}, "tensor 'w': 'sha256'"),
    ],
)
def test_manifest_errors(tmp_path: Path, doc: object, message: str) -> None:
    p = tmp_path / "m.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(InputError, match=f"m.json.*{message}"):
        read_manifest(p)


def test_cli_write_and_diff(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    save_file(_sd(), str(tmp_path / "v1.safetensors"))
    save_file(_sd(lora_b_zero=False), str(tmp_path / "v2.safetensors"))
    assert main(["manifest", "write", str(tmp_path / "v1.safetensors"), "-o", str(tmp_path / "m1.json"), "--version", "1"]) == 0
    assert read_manifest(tmp_path / "m1.json").to_dict() == manifest_of_safetensors(tmp_path / "v1.safetensors", version=1).to_dict()
    capsys.readouterr()
    assert main(["manifest", "diff", str(tmp_path / "m1.json"), str(tmp_path / "v1.safetensors"), "--b-version", "1"]) == 0
    assert "verdict: IDENTICAL" in capsys.readouterr().out
    assert main(["manifest", "diff", str(tmp_path / "m1.json"), str(tmp_path / "m1.json"), "--b-version", "2"]) == 1
    assert main(["manifest", "diff", str(tmp_path / "v1.safetensors"), str(tmp_path / "v2.safetensors"), "--json"]) == 1
    capsys.readouterr()
    assert main(["manifest", "diff", str(tmp_path / "v2.safetensors"), str(tmp_path / "v2.safetensors"), "--a-version", "1", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["lora_b"]["A"]["nonzero"] == ["layer.lora_B.weight"]
    (tmp_path / "bad.json").write_text("{")
    assert main(["manifest", "diff", str(tmp_path / "bad.json"), str(tmp_path / "m1.json")]) == 2
    assert "bad.json: not valid JSON" in capsys.readouterr().err
    assert main(["manifest", "diff", str(tmp_path / "nope"), str(tmp_path / "m1.json")]) == 2
    assert main(["manifest", "write", str(tmp_path / "m1.json"), "-o", str(tmp_path / "x.json")]) == 2
