"""probes.rl.weights: the manifest of a state dict equals the one of the same tensors saved as safetensors, and the
hash is the SHA256 of the little-endian row-major bytes."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from probes.rl.weights import ManifestWriteError, manifest_from_safetensors, manifest_from_state_dict, write_manifest


def _sd() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "w.bf16": torch.randn(5, 3, generator=g).to(torch.bfloat16),
        "w.f32": torch.randn(4, generator=g),
        "w.t": torch.randn(3, 6, generator=g).t(),  # not contiguous: hashed in row-major order
        "lora_B": torch.zeros(2, 8, dtype=torch.float16),
        "scalar": torch.tensor(3.0, dtype=torch.float64),
        "mask": torch.tensor([True, False, True]),
        "ids": torch.arange(7, dtype=torch.int64),
        "fp8": torch.randn(4, generator=g).to(torch.float8_e4m3fn),
    }


def test_hash_is_sha256_of_little_endian_row_major_bytes() -> None:
    sd = _sd()
    m = manifest_from_state_dict(sd, version=1)
    assert m["format"] == "validator.weight_manifest" and m["version"] == 1
    f32 = sd["w.f32"].numpy().astype("<f4")
    assert m["tensors"]["w.f32"] == {
        "dtype": "float32",
        "shape": [4],
        "sha256": hashlib.sha256(f32.tobytes()).hexdigest(),
    }
    t = np.ascontiguousarray(sd["w.t"].numpy()).astype("<f4")
    assert m["tensors"]["w.t"]["sha256"] == hashlib.sha256(t.tobytes()).hexdigest()
    assert m["tensors"]["lora_B"]["sha256"] == hashlib.sha256(bytes(2 * 8 * 2)).hexdigest()
    assert m["tensors"]["scalar"]["shape"] == []


def test_state_dict_and_safetensors_manifests_agree(tmp_path: Path) -> None:
    sd = _sd()
    save_file({k: v.contiguous() for k, v in sd.items() if k.startswith("w.")}, str(tmp_path / "a.safetensors"))
    save_file({k: v.contiguous() for k, v in sd.items() if not k.startswith("w.")}, str(tmp_path / "b.safetensors"))
    assert manifest_from_safetensors(tmp_path, version=2) == manifest_from_state_dict(sd, version=2)
    doc = write_manifest(sd, tmp_path / "m.json", version=2)
    assert json.loads((tmp_path / "m.json").read_text()) == doc
    assert not list(tmp_path.glob(".tmp-*"))


def test_errors_name_the_tensor_or_file(tmp_path: Path) -> None:
    with pytest.raises(ManifestWriteError, match="'x': not a tensor"):
        manifest_from_state_dict({"x": [1, 2]})  # type: ignore[dict-item]
    (tmp_path / "bad.safetensors").write_bytes(b"abc")
    with pytest.raises(ManifestWriteError, match="bad.safetensors: not a safetensors file"):
        manifest_from_safetensors(tmp_path / "bad.safetensors")
    save_file({"k": torch.zeros(2)}, str(tmp_path / "c.safetensors"))
    save_file({"k": torch.ones(2)}, str(tmp_path / "d.safetensors"))
    with pytest.raises(ManifestWriteError, match="tensor 'k' is in both"):
        manifest_from_safetensors([tmp_path / "c.safetensors", tmp_path / "d.safetensors"])
