"""The run bundle writer (format v1, see docs/bundle-format.md). Needs torch and safetensors only.

Importing this module does not import torch (the validator reads bundles without it): the functions that
take tensors import it when called.

Layout::

    BUNDLE/
      manifest.json                      run name, labels, format version
      parts/<part>/tensors-00000.safetensors
      parts/<part>/part.json             written last: the part's tensor records (its presence = complete)

Each rank writes its own part (``part="pp3-tp1"``); parts merge on ingest. Tensors are stored under
opaque keys (``t000000``), never under their names, so a name can never become a path.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .shards import Coords, ShardSpec

if TYPE_CHECKING:
    import torch

__all__ = [
    "BUNDLE_FORMAT",
    "BUNDLE_VERSION",
    "BundleWriter",
    "BundleError",
    "check_tensor_name",
    "ensure_manifest",
    "tensor_sha256",
    "write_json_atomic",
]

BUNDLE_FORMAT = "validator-bundle"
BUNDLE_VERSION = 1
MANIFEST = "manifest.json"
PART_FILE = "part.json"

_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:\-\[\]]*")
PART_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}")  # a part (rank) name: a directory under parts/


class BundleError(ValueError):
    """A bundle that cannot be written or read as asked."""


def check_tensor_name(name: str) -> str:
    """Tensor names are identifiers (letters, digits, ``_ . : - [ ]``), never paths."""
    if not isinstance(name, str) or not name or len(name) > 256:
        raise BundleError(f"tensor name {name!r} must be a non-empty string of at most 256 characters")
    if ".." in name or not _NAME_RE.fullmatch(name):
        raise BundleError(
            f"tensor name {name!r} is not allowed: use letters, digits and _ . : - [ ] (no path separators or '..')"
        )
    return name


def tensor_bytes(t: torch.Tensor) -> memoryview:
    """The tensor's raw little-endian bytes, row-major (as safetensors stores them)."""
    import torch

    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    flat = t.contiguous().reshape(-1)
    if flat.numel() == 0:
        return memoryview(b"")
    return memoryview(flat.view(torch.uint8).numpy().data)


def tensor_sha256(t: torch.Tensor) -> str:
    return hashlib.sha256(tensor_bytes(t)).hexdigest()


def ensure_manifest(
    root: Path, run_name: str | None, labels: Mapping[str, str], extra: Mapping[str, Any] | None = None
) -> None:
    """Create ``root/manifest.json`` atomically, or check an existing one belongs to ``run_name``
    (``None``: any run). Every writer of a bundle (tensor parts, acceptance parts) calls this."""
    mpath = Path(root) / MANIFEST
    if mpath.exists():
        if run_name is None:
            return
        try:
            existing = json.loads(mpath.read_text())
        except (OSError, ValueError) as exc:
            raise BundleError(f"{mpath}: unreadable manifest: {exc}") from None
        if existing.get("run", {}).get("name") != run_name:
            raise BundleError(
                f"{mpath}: bundle belongs to run {existing.get('run', {}).get('name')!r}, not {run_name!r}"
            )
        return
    run: dict[str, Any] = {"name": run_name or Path(root).name, "labels": {str(k): str(v) for k, v in labels.items()}}
    run.update(extra or {})
    manifest = {
        "format": BUNDLE_FORMAT,
        "version": BUNDLE_VERSION,
        "run": run,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    write_json_atomic(mpath, manifest)


def write_json_atomic(path: Path, obj: Any, *, compact: bool = False) -> None:
    """``obj`` as JSON at ``path``, all or nothing. ``compact``: no indentation (Python's C encoder: a part's
    records, tens of thousands in a long run, encode about ten times faster)."""
    path = Path(path)
    text = (
        json.dumps(obj, sort_keys=True, separators=(",", ":")) if compact else json.dumps(obj, indent=1, sort_keys=True)
    )
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


_FULL = ShardSpec.full()
_FULL_KEY = ("full", 0, 1, None, 0, 1, None)  # _FULL's fields
_DTYPE_NAMES: dict[Any, str] = {}  # torch dtype -> its name in part.json ("bfloat16")


def _record(r: tuple[Any, ...], file: str) -> dict[str, Any]:
    """A tensor's entry in part.json, from what :meth:`BundleWriter.add` kept."""
    name, key, (step, request, tokens, layer, extra), pp_stage, tp_rank, tp_size, shard, dtype, shape, sha, nbytes = r
    coords = Coords(step, request, tokens, layer, pp_stage, tp_rank, tp_size, extra)
    return {
        "name": name,
        "key": key,
        "coords": coords.to_dict(),
        "shard": ShardSpec(*shard).to_dict(),
        "dtype": dtype,
        "shape": list(shape),
        "sha256": sha,
        "nbytes": nbytes,
        "file": file,
    }


class BundleWriter:
    """Writes one part of a run bundle.

    >>> with BundleWriter("out/run1", run_name="run1", labels={"model": "kimi-k3"}) as w:
    ...     w.add("ctx.pre_norm", x, step=0, layer=19, shard=ShardSpec.partial(2, 8))

    Tensors are copied to host memory when added (so later in-place changes by the caller do not leak
    into the bundle) and flushed to a new safetensors file whenever ``max_file_bytes`` is reached.
    ``close()`` writes ``part.json``; a part without it is incomplete and is refused on ingest.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        run_name: str | None = None,
        labels: dict[str, str] | None = None,
        part: str = "part0",
        manifest: dict[str, Any] | None = None,
        max_file_bytes: int = 1 << 30,
    ) -> None:
        if not PART_RE.fullmatch(part):
            raise BundleError(f"part name {part!r} must be 1-64 letters, digits, '_', '.', '-'")
        self.root = Path(path)
        self.part = part
        self.part_dir = self.root / "parts" / part
        if (self.part_dir / PART_FILE).exists():
            raise BundleError(f"{self.part_dir}: part {part!r} already exists in this bundle")
        self.part_dir.mkdir(parents=True, exist_ok=True)
        ensure_manifest(self.root, run_name or self.root.name, labels or {}, manifest or {})
        self.max_file_bytes = max_file_bytes
        self._pending: dict[str, torch.Tensor] = {}
        self._pending_records: list[tuple[Any, ...]] = []
        self._pending_bytes = 0
        self._records: list[dict[str, Any]] = []
        self._files = 0
        self._count = 0
        self._seen: set[tuple[Any, ...]] = set()
        self._names: set[str] = set()
        self.closed = False

    def add(
        self,
        name: str,
        tensor: torch.Tensor,
        *,
        shard: ShardSpec | str | None = None,
        **coords: Any,
    ) -> None:
        """Add one tensor. ``coords``: step, request, tokens, layer, pp_stage, tp_rank, tp_size, or extra keys."""
        import torch

        if self.closed:
            raise BundleError(f"{self.part_dir}: writer is closed")
        if name not in self._names:  # a probe adds the same few names over and over
            self._names.add(check_tensor_name(name))
        if not isinstance(tensor, torch.Tensor):
            raise BundleError(f"tensor {name!r}: expected a torch.Tensor, got {type(tensor).__name__}")
        spec = shard if isinstance(shard, ShardSpec) else _FULL if shard is None else ShardSpec.from_dict(shard)
        c = Coords.make(**coords)
        shard_key = (
            _FULL_KEY
            if spec is _FULL
            else (spec.kind, spec.index, spec.count, spec.dim, spec.replica, spec.replicas, spec.replication)
        )
        ident = (name, c.identity(), shard_key, c.pp_stage, c.tp_rank)
        if ident in self._seen:
            raise BundleError(f"tensor {name!r} ({c.label() or 'no coords'}, {spec}) was already added to this part")
        self._seen.add(ident)
        t = tensor.detach()
        host = t.clone(memory_format=torch.contiguous_format) if t.is_cpu else t.to("cpu").contiguous()
        nbytes = host.nbytes
        key = f"t{self._count:06d}"
        self._count += 1
        raw = (host.view(torch.uint8) if host.dim() else host.reshape(1).view(torch.uint8)) if nbytes else None
        sha = hashlib.sha256(raw.numpy().data if raw is not None else b"").hexdigest()
        # kept as a tuple of plain values until flush (the cycle collector skips those: a long run holds many)
        dtype = _DTYPE_NAMES.get(host.dtype) or _DTYPE_NAMES.setdefault(
            host.dtype, str(host.dtype).removeprefix("torch.")
        )
        self._pending_records.append(
            (name, key, ident[1], c.pp_stage, c.tp_rank, c.tp_size, shard_key, dtype, tuple(host.shape), sha, nbytes)
        )
        self._pending[key] = host
        self._pending_bytes += nbytes
        if self._pending_bytes >= self.max_file_bytes:
            self.flush()

    def room_for(self, nbytes: int) -> bool:
        """Would adding ``nbytes`` more leave the pending tensors under ``max_file_bytes`` (no file written)?"""
        return self._pending_bytes + nbytes < self.max_file_bytes

    def flush(self) -> None:
        if not self._pending:
            return
        from safetensors.torch import save_file

        fname = f"tensors-{self._files:05d}.safetensors"
        tmp = self.part_dir / f".tmp-{fname}"
        save_file(self._pending, str(tmp))
        os.replace(tmp, self.part_dir / fname)
        self._files += 1
        self._records.extend(_record(r, fname) for r in self._pending_records)
        self._pending, self._pending_records, self._pending_bytes = {}, [], 0

    def close(self, extra: dict[str, Any] | None = None) -> None:
        if self.closed:
            return
        self.flush()
        write_json_atomic(
            self.part_dir / PART_FILE,
            {"part": self.part, "tensors": self._records, **({"extra": extra} if extra else {})},
            compact=True,
        )
        self.closed = True

    def __enter__(self) -> BundleWriter:
        return self

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        if exc_type is None:
            self.close()
