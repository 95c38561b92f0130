"""Weight-sync manifests: per tensor its dtype, shape and the SHA256 of its bytes (docs/rl.md, "Weight manifests").

Write one on the trainer and one on the rollout engine after each weight sync, then ``validator manifest diff``
them. The hash covers the tensor's elements in row-major order as little-endian bytes, exactly the bytes a
``.safetensors`` file stores, so a manifest written here from a state dict equals the one ``validator manifest
write`` computes from the same tensors saved with safetensors.

Imports torch only (and nothing of ``validator``)::

    from probes.weights import write_manifest
    write_manifest(model.state_dict(), "manifests/trainer-v3.json", version=3)
    write_manifest(["/ckpt/model-00001.safetensors", ...], "manifests/engine-v3.json", version=3)
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = ["MANIFEST_FORMAT", "ManifestWriteError", "manifest_from_safetensors", "manifest_from_state_dict", "write_manifest"]

MANIFEST_FORMAT = "validator.weight_manifest"
MANIFEST_VERSION = 1
_CHUNK = 8 << 20
_MAX_HEADER = 100 << 20
_ST_DTYPES = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2", "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool",
}


class ManifestWriteError(ValueError):
    """A tensor or file that cannot go into a manifest (the message names it)."""


def _entry(dtype: str, shape: Iterable[int], sha: str, version: int | None) -> dict[str, Any]:
    e: dict[str, Any] = {"dtype": dtype, "shape": [int(s) for s in shape], "sha256": sha}
    if version is not None:
        e["version"] = int(version)
    return e


def _doc(tensors: dict[str, dict[str, Any]], version: int | None) -> dict[str, Any]:
    doc: dict[str, Any] = {"format": MANIFEST_FORMAT, "format_version": MANIFEST_VERSION}
    if version is not None:
        doc["version"] = int(version)
    doc["tensors"] = {k: tensors[k] for k in sorted(tensors)}
    return doc


def tensor_sha256(t: torch.Tensor) -> str:
    """SHA256 of the tensor's elements, row-major, little-endian (the bytes safetensors stores)."""
    import torch

    if sys.byteorder != "little":  # pragma: no cover - every supported host is little-endian
        raise ManifestWriteError("manifests are written on little-endian hosts only")
    if t.is_sparse or t.is_quantized or t.is_complex() or t.device.type == "meta":
        raise ManifestWriteError(f"cannot hash a {t.layout} {t.dtype} tensor on {t.device}")
    flat = t.detach().to("cpu").contiguous().reshape(-1)
    raw = flat.view(torch.uint8) if flat.dtype != torch.bool else flat.to(torch.uint8)
    h = hashlib.sha256()
    n = raw.numel()
    for start in range(0, n, _CHUNK):
        h.update(raw[start : start + _CHUNK].numpy().data)
    return h.hexdigest()


def manifest_from_state_dict(state_dict: Mapping[str, torch.Tensor], *, version: int | None = None) -> dict[str, Any]:
    """The manifest of a state dict (tensors on any device are copied to the host to hash them)."""
    import torch

    tensors: dict[str, dict[str, Any]] = {}
    for name, t in state_dict.items():
        if not isinstance(t, torch.Tensor):
            raise ManifestWriteError(f"{name!r}: not a tensor ({type(t).__name__})")
        tensors[str(name)] = _entry(str(t.dtype).removeprefix("torch."), t.shape, tensor_sha256(t), None)
    return _doc(tensors, version)


def _safetensors_entries(path: Path) -> Iterable[tuple[str, str, list[int], int, int]]:
    """(name, dtype, shape, absolute begin, end) of each tensor, from the header (no tensor is loaded)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ManifestWriteError(f"{path}: not a safetensors file")
        (hlen,) = struct.unpack("<Q", head)
        if hlen > _MAX_HEADER or 8 + hlen > size:
            raise ManifestWriteError(f"{path}: bad header length {hlen}")
        try:
            header = json.loads(f.read(hlen))
        except ValueError:
            raise ManifestWriteError(f"{path}: corrupt header") from None
    if not isinstance(header, dict):
        raise ManifestWriteError(f"{path}: corrupt header")
    header.pop("__metadata__", None)
    for name, info in header.items():
        try:
            dtype = _ST_DTYPES[info["dtype"]]
            shape = [int(s) for s in info["shape"]]
            begin, end = (8 + hlen + int(o) for o in info["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise ManifestWriteError(f"{path}, tensor {name!r}: bad header entry") from None
        if not 8 + hlen <= begin <= end <= size:
            raise ManifestWriteError(f"{path}, tensor {name!r}: data outside the file")
        yield name, dtype, shape, begin, end


def _file_sha256(path: Path, begin: int, end: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        f.seek(begin)
        left = end - begin
        while left:
            got = f.read(min(left, _CHUNK))
            if not got:
                raise ManifestWriteError(f"{path}: truncated")
            h.update(got)
            left -= len(got)
    return h.hexdigest()


def manifest_from_safetensors(paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]], *, version: int | None = None) -> dict[str, Any]:
    """The manifest of ``.safetensors`` files (a file, a directory of them, or a list): bytes hashed as stored."""
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    files: list[Path] = []
    for p in map(Path, items):
        files.extend(sorted(p.glob("*.safetensors")) if p.is_dir() else [p])
    if not files:
        raise ManifestWriteError(f"no .safetensors files in {', '.join(map(str, items))}")
    tensors: dict[str, dict[str, Any]] = {}
    where: dict[str, Path] = {}
    for f in files:
        for name, dtype, shape, begin, end in _safetensors_entries(f):
            if name in tensors:
                raise ManifestWriteError(f"tensor {name!r} is in both {where[name]} and {f}")
            where[name] = f
            tensors[name] = _entry(dtype, shape, _file_sha256(f, begin, end), None)
    return _doc(tensors, version)


def write_manifest(
    source: Mapping[str, torch.Tensor] | str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
    path: str | os.PathLike[str],
    *,
    version: int | None = None,
) -> dict[str, Any]:
    """Write the manifest of a state dict or of safetensors files to ``path`` (JSON; atomically) and return it."""
    doc = manifest_from_state_dict(source, version=version) if isinstance(source, Mapping) else manifest_from_safetensors(source, version=version)
    out = Path(path)
    tmp = out.with_name(f".tmp-{out.name}")
    tmp.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, out)
    return doc
