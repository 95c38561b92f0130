"""Weight-sync manifests: per tensor its dtype, shape and the SHA256 of its bytes (docs/rl.md, "Weight manifests").

Write one on the trainer and one on the rollout engine after each weight sync, then ``validator manifest diff``
them. The hash covers the tensor's elements in row-major order as little-endian bytes, exactly the bytes a
``.safetensors`` file stores, so a manifest written here from a state dict equals the one ``validator manifest
write`` computes from the same tensors saved with safetensors.

Imports torch only (and nothing of ``validator``)::

    from probes.rl.weights import write_manifest
    write_manifest(model.state_dict(), "manifests/trainer-v3.json", version=3)
    write_manifest(["/ckpt/model-00001.safetensors", ...], "manifests/engine-v3.json", version=3)
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from probes.core.safetensors_header import HeaderError, TensorEntry, read_header

if TYPE_CHECKING:
    import torch

__all__ = [
    "MANIFEST_FORMAT",
    "MANIFEST_VERSION",
    "ManifestWriteError",
    "manifest_doc",
    "manifest_from_safetensors",
    "manifest_from_state_dict",
    "safetensors_tensors",
    "save_manifest",
    "tensor_entry",
    "write_manifest",
]

MANIFEST_FORMAT = "validator.weight_manifest"
MANIFEST_VERSION = 1
_CHUNK = 8 << 20
_DROP_BEHIND = 1 << 20  # a tensor read once this large: let the page cache drop its pages


class ManifestWriteError(ValueError):
    """A tensor or file that cannot go into a manifest (the message names it)."""


def tensor_entry(dtype: str, shape: Iterable[int], sha: str, version: int | None = None) -> dict[str, Any]:
    """One tensor's entry: ``dtype``, ``shape``, ``sha256`` and, when given, its own ``version``."""
    e: dict[str, Any] = {"dtype": dtype, "shape": [int(s) for s in shape], "sha256": sha}
    if version is not None:
        e["version"] = int(version)
    return e


def manifest_doc(tensors: Mapping[str, Mapping[str, Any]], version: int | None) -> dict[str, Any]:
    """The manifest document of ``tensors`` (name -> :func:`tensor_entry`), its tensors sorted by name."""
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
        tensors[str(name)] = tensor_entry(str(t.dtype).removeprefix("torch."), t.shape, tensor_sha256(t))
    return manifest_doc(tensors, version)


def _files(items: list[str | os.PathLike[str]]) -> list[Path]:
    files: list[Path] = []
    for p in map(Path, items):
        if p.is_dir():
            found = sorted(p.glob("*.safetensors"))
            if not found:
                raise ManifestWriteError(f"{p}: no .safetensors files in this directory")
            files.extend(found)
        elif p.exists():
            files.append(p)
        else:
            raise ManifestWriteError(f"{p}: no such file or directory")
    return files


def _file_sha256(path: Path, e: TensorEntry) -> str:
    """SHA256 of the tensor's bytes as stored, read in pieces of at most ``_CHUNK`` bytes into one buffer."""
    h = hashlib.sha256()
    try:
        with open(path, "rb", buffering=0) as f:
            f.seek(e.begin)
            view = memoryview(bytearray(min(_CHUNK, e.nbytes) or 1))
            left = e.nbytes
            while left:
                got = f.readinto(view[: min(left, len(view))])
                if not got:
                    raise OSError(f"{path}: file ended {left} bytes before the tensor's end")
                h.update(view[:got])
                left -= got
            if e.nbytes >= _DROP_BEHIND and hasattr(os, "posix_fadvise"):
                os.posix_fadvise(f.fileno(), e.begin, e.nbytes, os.POSIX_FADV_DONTNEED)
    except OSError as exc:
        raise ManifestWriteError(f"{path}, tensor {e.key!r}: cannot read: {exc}") from None
    return h.hexdigest()


def safetensors_tensors(
    paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
) -> Iterator[tuple[Path, TensorEntry, str]]:
    """Each tensor of ``.safetensors`` files (a file, a directory of them, or a list of either): its file, its
    header entry and the SHA256 of its bytes as stored. Headers are validated before any byte is hashed; a
    tensor name in two files is refused."""
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    where: dict[str, Path] = {}
    for f in _files(items):
        try:
            _, entries = read_header(f)
        except HeaderError as exc:
            raise ManifestWriteError(str(exc)) from None
        for key, e in entries.items():
            if key in where:
                raise ManifestWriteError(f"tensor {key!r} is in both {where[key]} and {f}")
            where[key] = f
            yield f, e, _file_sha256(f, e)


def manifest_from_safetensors(
    paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]], *, version: int | None = None
) -> dict[str, Any]:
    """The manifest of ``.safetensors`` files (a file, a directory of them, or a list): bytes hashed as stored."""
    tensors = {e.key: tensor_entry(e.dtype_name, e.shape, sha) for _, e, sha in safetensors_tensors(paths)}
    return manifest_doc(tensors, version)


def save_manifest(doc: Mapping[str, Any], path: str | os.PathLike[str]) -> None:
    """Write a manifest document to ``path`` as JSON, atomically (a hidden temporary file renamed into place)."""
    out = Path(path)
    tmp = out.with_name(f".tmp-{out.name}")
    tmp.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, out)


def write_manifest(
    source: Mapping[str, torch.Tensor] | str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
    path: str | os.PathLike[str],
    *,
    version: int | None = None,
) -> dict[str, Any]:
    """Write the manifest of a state dict or of safetensors files to ``path`` (JSON; atomically) and return it."""
    if isinstance(source, Mapping):
        doc = manifest_from_state_dict(source, version=version)
    else:
        doc = manifest_from_safetensors(source, version=version)
    save_manifest(doc, path)
    return doc
