"""Weight manifests (docs/rl.md, "Weight manifests"): read and validate one, or compute one from safetensors.

A manifest is JSON::

    {"format": "validator.weight_manifest", "format_version": 1, "version": 3,
     "tensors": {"model.layers.0.mlp.up_proj.lora_B.weight": {"dtype": "bfloat16", "shape": [4096, 16],
                                                              "sha256": "<64 hex>", "version": 3}}}

``version`` (the weight version, an int >= 0) is optional at the top and per tensor (a tensor's overrides the
top's). The hash covers the elements in row-major order as little-endian bytes: what a ``.safetensors`` file
stores, and what ``probes.weights`` hashes from a state dict. No torch here.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from validator.errors import InputError
from validator.runs.tensorfile import ITEMSIZES, SafetensorsFile, file_byte_chunks

__all__ = [
    "MANIFEST_FORMAT",
    "ManifestTensor",
    "WeightManifest",
    "load_side",
    "manifest_from_dict",
    "manifest_of_safetensors",
    "read_manifest",
    "write_manifest",
]

MANIFEST_FORMAT = "validator.weight_manifest"
MANIFEST_FORMAT_VERSION = 1
_HEX64 = re.compile(r"[0-9a-f]{64}")
_MAX_MANIFEST_BYTES = 256 << 20


@dataclass(frozen=True)
class ManifestTensor:
    dtype: str
    shape: tuple[int, ...]
    sha256: str
    version: int | None = None

    @property
    def nbytes(self) -> int:
        n = ITEMSIZES[self.dtype]
        for s in self.shape:
            n *= s
        return n

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"dtype": self.dtype, "shape": list(self.shape), "sha256": self.sha256}
        if self.version is not None:
            d["version"] = self.version
        return d


@dataclass(frozen=True)
class WeightManifest:
    """Tensors by name; ``version`` the manifest's weight version; ``files`` (name -> (file, entry)) when it was
    computed from safetensors files, so that changed tensors can be compared numerically."""

    tensors: dict[str, ManifestTensor]
    version: int | None = None
    source: str = "manifest"
    files: dict[str, tuple[SafetensorsFile, str]] = field(default_factory=dict, repr=False, compare=False)

    def tensor_version(self, name: str) -> int | None:
        v = self.tensors[name].version
        return self.version if v is None else v

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"format": MANIFEST_FORMAT, "format_version": MANIFEST_FORMAT_VERSION}
        if self.version is not None:
            doc["version"] = self.version
        doc["tensors"] = {k: self.tensors[k].to_dict() for k in sorted(self.tensors)}
        return doc


def _version(v: Any, where: str) -> int | None:
    if v is None:
        return None
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise InputError(f"{where}: 'version' must be an int >= 0, got {v!r:.60}")
    return v


def manifest_from_dict(doc: Any, *, source: str = "manifest") -> WeightManifest:
    """Validate a parsed manifest; errors name the source, the tensor and the field."""
    if not isinstance(doc, dict):
        raise InputError(f"{source}: a manifest must be a JSON object, got {type(doc).__name__}")
    if doc.get("format") != MANIFEST_FORMAT:
        raise InputError(f"{source}: not a weight manifest ('format' must be {MANIFEST_FORMAT!r}, got {doc.get('format')!r:.60})")
    fv = doc.get("format_version", MANIFEST_FORMAT_VERSION)
    if fv != MANIFEST_FORMAT_VERSION:
        raise InputError(f"{source}: unsupported format_version {fv!r:.20} (this validator reads {MANIFEST_FORMAT_VERSION})")
    version = _version(doc.get("version"), source)
    tensors = doc.get("tensors")
    if not isinstance(tensors, dict):
        raise InputError(f"{source}: 'tensors' must be an object (tensor name -> entry)")
    out: dict[str, ManifestTensor] = {}
    for name, e in tensors.items():
        where = f"{source}, tensor {name!r}"
        if not isinstance(e, dict):
            raise InputError(f"{where}: entry must be an object")
        dtype = e.get("dtype")
        if dtype not in ITEMSIZES:
            raise InputError(f"{where}: unknown dtype {dtype!r:.40} (one of {', '.join(sorted(ITEMSIZES))})")
        shape = e.get("shape")
        if not isinstance(shape, list) or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape):
            raise InputError(f"{where}: 'shape' must be a list of ints >= 0, got {shape!r:.60}")
        sha = e.get("sha256")
        if not isinstance(sha, str) or not _HEX64.fullmatch(sha):
            raise InputError(f"{where}: 'sha256' must be 64 lowercase hex digits, got {sha!r:.80}")
        out[name] = ManifestTensor(dtype, tuple(shape), sha, _version(e.get("version"), where))
    return WeightManifest(tensors=out, version=version, source=source)


def read_manifest(path: str | Path) -> WeightManifest:
    p = Path(path)
    try:
        if p.stat().st_size > _MAX_MANIFEST_BYTES:
            raise InputError(f"{p}: larger than {_MAX_MANIFEST_BYTES} bytes; not a manifest")
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"{p}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise InputError(f"{p}: not UTF-8 text") from None
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise InputError(f"{p}: not valid JSON ({exc})") from None
    return manifest_from_dict(doc, source=str(p))


def manifest_of_safetensors(paths: str | Path | Iterable[str | Path], *, version: int | None = None) -> WeightManifest:
    """Hash ``.safetensors`` files (a file, a directory of them, or a list of either) tensor by tensor, as stored."""
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    files: list[Path] = []
    for p in map(Path, items):
        if p.is_dir():
            found = sorted(p.glob("*.safetensors"))
            if not found:
                raise InputError(f"{p}: no .safetensors files in this directory")
            files.extend(found)
        elif p.exists():
            files.append(p)
        else:
            raise InputError(f"{p}: no such file or directory")
    tensors: dict[str, ManifestTensor] = {}
    where: dict[str, tuple[SafetensorsFile, str]] = {}
    for f in files:
        st = SafetensorsFile(f)
        for key, e in st.entries.items():
            if key in tensors:
                raise InputError(f"tensor {key!r} is in both {where[key][0].path} and {f}")
            h = hashlib.sha256()
            try:
                for chunk in file_byte_chunks(f, e.begin, e.nbytes):
                    h.update(chunk)
            except OSError as exc:
                raise InputError(f"{f}, tensor {key!r}: cannot read: {exc}") from None
            tensors[key] = ManifestTensor(e.dtype_name, e.shape, h.hexdigest())
            where[key] = (st, key)
    source = ", ".join(map(str, items)) if len(items) > 1 else str(items[0])
    return WeightManifest(tensors=tensors, version=version, source=source, files=where)


def load_side(path: str | Path, *, version: int | None = None) -> WeightManifest:
    """A manifest file (``.json``), or safetensors files / a directory hashed on the fly."""
    p = Path(path)
    if p.is_file() and p.suffix == ".json":
        m = read_manifest(p)
        if version is not None:
            m = WeightManifest(tensors=m.tensors, version=version, source=m.source)
        return m
    return manifest_of_safetensors(p, version=version)


def write_manifest(manifest: WeightManifest, path: str | Path) -> None:
    out = Path(path)
    tmp = out.with_name(f".tmp-{out.name}")
    tmp.write_text(json.dumps(manifest.to_dict(), indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, out)
