from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from validator.errors import InputError
from validator.runs.tensorfile import SafetensorsFile


def _raw(path: Path, header: dict, data: bytes, hlen: int | None = None) -> Path:
    h = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(h) if hlen is None else hlen) + h + data)
    return path


def test_reads_valid_file_lazily(tmp_path: Path) -> None:
    p = tmp_path / "ok.safetensors"
    t = {"a": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.ones(4, dtype=torch.bfloat16)}
    save_file(t, str(p))
    f = SafetensorsFile(p)
    assert set(f.entries) == {"a", "b"}
    assert torch.equal(f.load("a"), t["a"]) and torch.equal(f.load("b"), t["b"])


@pytest.mark.parametrize(
    "header, data, hlen, msg",
    [
        ({"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, b"\0" * 8, None, "truncated"),
        ({"x": {"dtype": "Q7", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4, None, "unknown dtype 'Q7'"),
        ({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 8, None, "needs 8"),
        (
            {"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
             "y": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}},
            b"\0" * 12, None, "overlaps",
        ),
        ({"x": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, b"\0" * 4, None, "bad shape"),
        ({}, b"", 10**12, "exceeds"),
        ({}, b"", 10**6, "header claims"),
    ],
)
def test_bad_files_name_file_and_problem(tmp_path: Path, header: dict, data: bytes, hlen: int | None, msg: str) -> None:
    p = _raw(tmp_path / "bad.safetensors", header, data, hlen)
    with pytest.raises(InputError) as exc:
        SafetensorsFile(p)
    assert msg in str(exc.value) and "bad.safetensors" in str(exc.value)


def test_garbage_and_tiny_files(tmp_path: Path) -> None:
    p = tmp_path / "g.safetensors"
    p.write_bytes(b"abc")
    with pytest.raises(InputError, match="shorter than"):
        SafetensorsFile(p)
    p.write_bytes(struct.pack("<Q", 4) + b"\xff\xfe{}")
    with pytest.raises(InputError, match="corrupt header"):
        SafetensorsFile(p)


def test_truncated_real_file(tmp_path: Path) -> None:
    p = tmp_path / "t.safetensors"
    save_file({"w": torch.randn(64, 64)}, str(p))
    p.write_bytes(p.read_bytes()[:-100])
    with pytest.raises(InputError, match=r"t\.safetensors, tensor 'w': truncated"):
        SafetensorsFile(p)


def test_dtype_tables_agree_with_torch_and_safetensors(tmp_path: Path) -> None:
    """The plain-data tables (read without torch) against torch's dtypes and the codes safetensors writes."""
    from validator.runs import tensorfile as tf

    assert set(tf.DTYPE_NAMES.values()) == set(tf.ITEMSIZES)
    for code, name in tf.DTYPE_NAMES.items():
        dt = tf.DTYPES[code]
        assert tf.dtype_name(dt) == name and dt.itemsize == tf.ITEMSIZES[name]
        assert tf.torch_dtype(code) is dt and tf.torch_dtype(name) is dt and tf.check_dtype(code) == name
        t = torch.zeros(3, dtype=torch.float32).to(dt)
        save_file({"x": t}, str(tmp_path / "x.safetensors"))
        entry = SafetensorsFile(tmp_path / "x.safetensors").entries["x"]
        assert (entry.dtype_name, entry.dtype, entry.nbytes) == (name, dt, 3 * dt.itemsize), code
    with pytest.raises(InputError, match="here: unknown dtype 'complex32'"):
        tf.check_dtype("complex32", where="here: ")
