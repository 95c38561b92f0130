"""Weight manifests (docs/rl.md, "Weight manifests"): read and validate one, or compute one from safetensors.

A manifest is JSON::

    {"format": "validator.weight_manifest", "format_version": 1, "version": 3,
     "tensors": {"model.layers.0.mlp.up_proj.lora_B.weight": {"dtype": "bfloat16", "shape": [4096, 16],
                                                              "sha256": "<64 hex>", "version": 3}}}

``version`` (the weight version, an int >= 0) is optional at the top and per tensor (a tensor's overrides the
top's). The hash covers the elements in row-major order as little-endian bytes: what a ``.safetensors`` file
stores, and what ``probes.rl.weights`` hashes from a state dict. The document, its JSON file and the hashing of
safetensors files are ``probes.rl.weights``'s (one writer for the trainer's probe and this validator). No torch
here.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from probes.core.safetensors_header import TensorEntry
from probes.rl.weights import (
    MANIFEST_FORMAT,
    ManifestWriteError,
    manifest_doc,
    safetensors_tensors,
    save_manifest,
    tensor_entry,
)
from probes.rl.weights import MANIFEST_VERSION as MANIFEST_FORMAT_VERSION
from validator.errors import InputError
from validator.runs.tensorfile import ITEMSIZES, raw_tensor

if TYPE_CHECKING:
    import torch

    from validator.runs.view import RunView

__all__ = [
    "MANIFEST_FORMAT",
    "MAX_TENSOR_BYTES",
    "ManifestTensor",
    "WeightManifest",
    "check_size",
    "load_side",
    "manifest_from_dict",
    "manifest_of_safetensors",
    "manifest_of_view",
    "read_manifest",
    "write_manifest",
]

_HEX64 = re.compile(r"[0-9a-f]{64}")
_MAX_MANIFEST_BYTES = 256 << 20
# The largest tensor a manifest may declare. The largest single tensors of published checkpoints, fused MoE
# expert stacks (Llama 4 Maverick's [128, 5120, 16384] bfloat16 gate_up_proj, 20 GiB), are tens of GiB: 64 GiB
# leaves room for a float32 copy of one. Larger sizes are refused when the manifest is read (docs/rl.md).
MAX_TENSOR_BYTES = 64 << 30
_MAX_NDIM = 64  # torch's limit on dimensions
_MAX_DIM = (1 << 63) - 1


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
        return tensor_entry(self.dtype, self.shape, self.sha256, self.version)


@dataclass(frozen=True)
class WeightManifest:
    """Tensors by name; ``version`` the manifest's weight version; ``loaders`` (name -> a function returning the
    tensor) when it was computed from tensors (safetensors files, a bundle, a stored run), so that changed tensors
    can be compared numerically."""

    tensors: dict[str, ManifestTensor]
    version: int | None = None
    source: str = "manifest"
    loaders: dict[str, Callable[[], torch.Tensor]] = field(default_factory=dict, repr=False, compare=False)

    def tensor_version(self, name: str) -> int | None:
        v = self.tensors[name].version
        return self.version if v is None else v

    def to_dict(self) -> dict[str, Any]:
        return manifest_doc({k: t.to_dict() for k, t in self.tensors.items()}, self.version)


def _version(v: Any, where: str) -> int | None:
    if v is None:
        return None
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise InputError(f"{where}: 'version' must be an int >= 0, got {v!r:.60}")
    return v


def check_size(
    dtype: str,
    shape: list[int] | tuple[int, ...],
    where: str,
    *,
    nbytes: int | None = None,
    limit: int | None = MAX_TENSOR_BYTES,
) -> int:
    """The byte size of a ``dtype`` tensor of ``shape`` (ints >= 0), refused above ``limit`` (a manifest's
    :data:`MAX_TENSOR_BYTES`; None for tensors that exist, e.g. a stored run's) or when it disagrees with a
    recorded ``nbytes``. Cheap for any shape: the product stops growing at the limit."""
    if dtype not in ITEMSIZES:
        raise InputError(f"{where}: unknown dtype {dtype!r:.40}")
    if len(shape) > _MAX_NDIM:
        raise InputError(f"{where}: 'shape' has {len(shape)} dimensions; a tensor has at most {_MAX_NDIM}")
    if any(s > _MAX_DIM for s in shape):
        raise InputError(
            f"{where}: 'shape' {list(shape)!r:.80} has a dimension above {_MAX_DIM} (dimensions are int64)"
        )
    size = 0 if 0 in shape else ITEMSIZES[dtype]
    for s in shape if size else ():
        size *= s
        if limit is not None and size > limit:
            raise InputError(
                f"{where}: shape {list(shape)!r:.80} of {dtype} is more than {limit} bytes ({limit / (1 << 30):g} GiB), "
                "the largest tensor a manifest may declare"
            )
    if nbytes is not None and nbytes != size:
        raise InputError(
            f"{where}: shape {list(shape)!r:.80} of {dtype} is {size} bytes, but {nbytes} bytes are recorded"
        )
    return size


def manifest_from_dict(doc: Any, *, source: str = "manifest") -> WeightManifest:
    """Validate a parsed manifest; errors name the source, the tensor and the field."""
    if not isinstance(doc, dict):
        raise InputError(f"{source}: a manifest must be a JSON object, got {type(doc).__name__}")
    if doc.get("format") != MANIFEST_FORMAT:
        raise InputError(
            f"{source}: not a weight manifest ('format' must be {MANIFEST_FORMAT!r}, got {doc.get('format')!r:.60})"
        )
    fv = doc.get("format_version", MANIFEST_FORMAT_VERSION)
    if fv != MANIFEST_FORMAT_VERSION:
        raise InputError(
            f"{source}: unsupported format_version {fv!r:.20} (this validator reads {MANIFEST_FORMAT_VERSION})"
        )
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
        if not isinstance(shape, list) or not all(
            isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape
        ):
            raise InputError(f"{where}: 'shape' must be a list of ints >= 0, got {shape!r:.60}")
        check_size(dtype, shape, where)
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


def _load(path: Path, e: TensorEntry) -> torch.Tensor:
    return raw_tensor(path, e.begin, e.nbytes, e.dtype, e.shape)


def manifest_of_safetensors(paths: str | Path | Iterable[str | Path], *, version: int | None = None) -> WeightManifest:
    """Hash ``.safetensors`` files (a file, a directory of them, or a list of either) tensor by tensor, as stored
    (:func:`probes.rl.weights.safetensors_tensors`)."""
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    tensors: dict[str, ManifestTensor] = {}
    loaders: dict[str, Callable[[], torch.Tensor]] = {}
    try:
        for f, e, sha in safetensors_tensors(items):
            tensors[e.key] = ManifestTensor(e.dtype_name, e.shape, sha)
            loaders[e.key] = functools.partial(_load, f, e)
    except ManifestWriteError as exc:
        raise InputError(str(exc)) from None
    source = ", ".join(map(str, items)) if len(items) > 1 else str(items[0])
    return WeightManifest(tensors=tensors, version=version, source=source, loaders=loaders)


def manifest_of_view(view: RunView, *, version: int | None = None) -> WeightManifest:
    """The manifest of a run's tensors (a bundle, a stored run: their recorded SHA256 of the raw bytes, or the
    bytes hashed here). Only whole tensors: a tensor stored as TP slices or partial sums has no one hash."""
    tensors: dict[str, ManifestTensor] = {}
    loaders: dict[str, Callable[[], torch.Tensor]] = {}
    for ref in view.tensors:
        where = ("pp_stage", "tp_rank", "tp_size")  # where a copy was held, not which tensor it is
        coords = {k: v for k, v in ref.coords.to_dict().items() if k not in where and v is not None}
        name = ref.name + ("[" + ",".join(f"{k}={v}" for k, v in sorted(coords.items())) + "]" if coords else "")
        if ref.shard.kind not in ("full", "replicated"):
            raise InputError(
                f"{view.name}: tensor {name!r} is stored as {ref.shard.kind} shards; a manifest needs whole tensors"
            )
        check_size(ref.dtype, tuple(ref.shape), f"{view.name}: tensor {name!r}", nbytes=ref.nbytes, limit=None)
        sha = ref.sha256
        if sha is None:
            h = hashlib.sha256()
            for chunk in ref.byte_chunks():
                h.update(chunk)
            sha = h.hexdigest()
        entry = ManifestTensor(ref.dtype, tuple(ref.shape), sha)
        if name in tensors and tensors[name] != entry:
            raise InputError(f"{view.name}: tensor {name!r} has copies that differ")
        tensors[name] = entry
        loaders[name] = ref.load
    return WeightManifest(tensors=tensors, version=version, source=f"run {view.name!r}", loaders=loaders)


def load_side(
    path: str | Path, *, version: int | None = None, open_run: Callable[[str], RunView] | None = None
) -> WeightManifest:
    """A manifest file (``.json``), safetensors files or a directory of them hashed on the fly, a bundle
    directory, or (with ``open_run``) a stored run."""
    p = Path(path)
    if p.is_file() and p.suffix == ".json":
        m = read_manifest(p)
        if version is not None:
            m = WeightManifest(tensors=m.tensors, version=version, source=m.source)
        return m
    if p.is_dir() and (p / "manifest.json").is_file():  # a run bundle
        from validator.runs.sources import open_path

        return manifest_of_view(open_path(p), version=version)
    if not p.exists() and open_run is not None:
        return manifest_of_view(open_run(str(path)), version=version)
    return manifest_of_safetensors(p, version=version)


def write_manifest(manifest: WeightManifest, path: str | Path) -> None:
    save_manifest(manifest.to_dict(), path)
