"""Manifest sizes are checked before any work, and the LoRA B zero check's hashing is bounded (issue 39, item 2).

A manifest is caller-chosen JSON: a `*lora_B*` tensor at version 1 declaring a 4 TiB shape once made the diff hash
4 TiB of zeros. Now the shape is refused when the manifest is read, and the zero hash has a documented cap.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from validator.errors import InputError
from validator.judging.manifest_diff import MAX_LORA_B_BYTES, diff_manifests, zero_sha256, zero_sha256s
from validator.runs.sources import open_path
from validator.runs.weight_manifest import MAX_TENSOR_BYTES, manifest_from_dict, manifest_of_view, read_manifest

EXE = str(Path(sys.executable).parent / "validator")


def _doc(shape: list[Any], dtype: str = "float32", name: str = "layer.lora_B.weight", version: int = 1) -> dict[str, Any]:
    return {
        "format": "validator.weight_manifest",
        "version": version,
        "tensors": {name: {"dtype": dtype, "shape": shape, "sha256": "0" * 64}},
    }


def test_zero_hashes_match_hashlib_across_chunk_boundaries() -> None:
    sizes = [0, 1, 63, 64, 65, (1 << 20) - 1, 1 << 20, (1 << 20) + 7, 3 << 20]
    got = zero_sha256s(sizes)
    assert got == {n: hashlib.sha256(bytes(n)).hexdigest() for n in sizes}
    assert zero_sha256(65) == got[65] and zero_sha256s([]) == {}


def test_zero_hash_refuses_sizes_above_the_cap() -> None:
    with pytest.raises(ValueError, match="sizes are 0 to"):
        zero_sha256(MAX_LORA_B_BYTES + 1)
    with pytest.raises(ValueError, match="sizes are 0 to"):
        zero_sha256s([5, -1])


@pytest.mark.parametrize(
    ("shape", "dtype", "message"),
    [
        ([1099511627776], "float32", r"shape \[1099511627776\] of float32 is more than 68719476736 bytes \(64 GiB\)"),
        ([MAX_TENSOR_BYTES // 2 + 1], "bfloat16", "is more than 68719476736 bytes"),
        ([1 << 40] * 64, "uint8", "is more than"),  # stops multiplying at the cap
        ([2] * 65, "uint8", "has 65 dimensions; a tensor has at most 64"),
        ([1 << 63, 0], "uint8", "has a dimension above"),
        ([10**4000], "uint8", "has a dimension above"),
    ],
)
def test_manifest_sizes_refused_when_read(tmp_path: Path, shape: list[int], dtype: str, message: str) -> None:
    p = tmp_path / "m.json"
    p.write_text(json.dumps(_doc(shape, dtype)))
    t0 = time.monotonic()
    with pytest.raises(InputError, match=f"m.json, tensor 'layer.lora_B.weight': .*{message}"):
        read_manifest(p)
    assert time.monotonic() - t0 < 5


def test_sizes_at_the_caps_are_accepted() -> None:
    m = manifest_from_dict(_doc([MAX_TENSOR_BYTES // 4], name="w"))
    assert m.tensors["w"].nbytes == MAX_TENSOR_BYTES
    assert manifest_from_dict(_doc([0, (1 << 63) - 1])).tensors["layer.lora_B.weight"].nbytes == 0


def test_lora_b_above_the_zero_check_cap_is_refused_before_any_hashing() -> None:
    big = manifest_from_dict(_doc([MAX_LORA_B_BYTES // 2 + 1], "float16"), source="a")
    t0 = time.monotonic()
    with pytest.raises(InputError, match=r"^a, tensor 'layer.lora_B.weight': a LoRA B factor of float16\[1073741825\] "
                       r"is 2147483650 bytes, more than the 2147483648 \(2 GiB\) the version-1 zero check accepts"):
        diff_manifests(big, big)
    assert time.monotonic() - t0 < 1  # refused up front: nothing hashed
    later = manifest_from_dict(_doc([MAX_LORA_B_BYTES // 2 + 1], "float16", version=2))
    assert diff_manifests(later, later).verdict == "identical"  # only version 1 is checked; nothing to hash


def test_lora_b_zero_check_of_many_sizes_is_one_pass() -> None:
    tensors = {f"l{i}.lora_B.weight": {"dtype": "uint8", "shape": [n], "sha256": hashlib.sha256(bytes(n)).hexdigest()}
               for i, n in enumerate(range((4 << 20) - 200, 4 << 20))}
    m = manifest_from_dict({"format": "validator.weight_manifest", "version": 1, "tensors": tensors})
    t0 = time.monotonic()
    d = diff_manifests(m, m)
    assert d.verdict == "identical" and d.lora_b["A"] == {"checked": 200, "nonzero": []}
    assert time.monotonic() - t0 < 5  # 200 sizes of 4 MiB each: one 4 MiB pass, not 800 MiB


def test_stored_size_must_match_the_shape(tmp_path: Path) -> None:
    save_file({"w": torch.ones(4, 2)}, str(tmp_path / "a.safetensors"))
    view = open_path(tmp_path / "a.safetensors")
    assert manifest_of_view(view).tensors["w"].nbytes == 32
    view.tensors[0] = replace(view.tensors[0], nbytes=31)
    with pytest.raises(InputError, match=r"tensor 'w': shape \[4, 2\] of float32 is 32 bytes, but 31 bytes are recorded"):
        manifest_of_view(view)


def test_console_script_refuses_a_huge_manifest(tmp_path: Path) -> None:
    """The installed `validator manifest diff`: exit 2 at once, naming the file, the tensor and the problem."""
    p = tmp_path / "huge.json"
    p.write_text(json.dumps(_doc([1099511627776])))
    r = subprocess.run([EXE, "manifest", "diff", str(p), str(p)], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "VALIDATOR_HOME": str(tmp_path / "h")})
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith(f"validator: error: {p}, tensor 'layer.lora_B.weight': shape [1099511627776] of float32")
    assert r.stdout == ""
