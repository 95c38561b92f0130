"""The blob store: content-addressed bytes. Paths come only from sha256 digests, never from names.

One small interface, :class:`BlobStore`, with two implementations: the local content-addressed directory
(the embedded default) and S3-compatible object storage (:mod:`validator.blobs_s3`), chosen by a URL in
settings. Writes never overwrite an existing object.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

import torch

from .errors import InputError
from .tensorfile import raw_tensor

__all__ = ["BlobStore", "LocalBlobStore", "open_blob_store", "check_sha", "write_temp"]

_SHA_RE = re.compile(r"[0-9a-f]{64}")


def check_sha(sha256: str) -> str:
    if not isinstance(sha256, str) or not _SHA_RE.fullmatch(sha256):
        raise InputError(f"not a sha256 digest: {sha256!r}")
    return sha256


class BlobStore(Protocol):
    def put(self, chunks: Iterable[bytes | memoryview], *, expect_sha256: str | None = None) -> tuple[str, int, bool]:
        """Store bytes; returns (sha256, size, created). Refuses content not matching ``expect_sha256``."""
        ...

    def exists(self, sha256: str) -> bool: ...

    def delete(self, sha256: str) -> None: ...

    def path(self, sha256: str) -> Path:
        """A local file holding the blob (object stores download it into a local cache first)."""
        ...

    def open_tensor(self, sha256: str, dtype: torch.dtype, shape: tuple[int, ...], nbytes: int) -> torch.Tensor: ...


def open_blob_store(url: str | None, *, local_dir: Path, cache_dir: Path) -> BlobStore:
    """``None`` or ``file://PATH``: local directory; ``s3://bucket/prefix?endpoint=URL``: object storage."""
    if not url:
        return LocalBlobStore(local_dir)
    if url.startswith("file://"):
        return LocalBlobStore(Path(url[len("file://") :]))
    if url.startswith("s3://"):
        from .blobs_s3 import S3BlobStore

        return S3BlobStore.from_url(url, cache_dir=cache_dir)
    raise InputError(f"unsupported blob store URL {url!r} (use file://PATH or s3://BUCKET/PREFIX)")


def write_temp(tmp_dir: Path, chunks: Iterable[bytes | memoryview], expect_sha256: str | None) -> tuple[str, str, int]:
    """Spool ``chunks`` to a temporary file in ``tmp_dir``, hashing on the way: (tmp path, sha256, size)."""
    h = hashlib.sha256()
    size = 0
    fd, tmp = tempfile.mkstemp(dir=tmp_dir)
    try:
        with os.fdopen(fd, "wb") as f:
            for c in chunks:
                h.update(c)
                f.write(c)
                size += len(c)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    sha = h.hexdigest()
    if expect_sha256 is not None and sha != expect_sha256:
        Path(tmp).unlink(missing_ok=True)
        raise InputError(f"content hash mismatch: record says {expect_sha256}, bytes hash to {sha}")
    return tmp, sha, size


class LocalBlobStore:
    """``ROOT/ab/cdef...``: one file per distinct content; ``ROOT/tmp`` holds writes in progress."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.tmp = self.root / "tmp"
        self.tmp.mkdir(parents=True, exist_ok=True)

    def path(self, sha256: str) -> Path:
        check_sha(sha256)
        return self.root / sha256[:2] / sha256[2:]

    def exists(self, sha256: str) -> bool:
        return self.path(sha256).exists()

    def put(self, chunks: Iterable[bytes | memoryview], *, expect_sha256: str | None = None) -> tuple[str, int, bool]:
        tmp, sha, size = write_temp(self.tmp, chunks, expect_sha256)
        try:
            dest = self.path(sha)
            dest.parent.mkdir(exist_ok=True)
            try:
                os.link(tmp, dest)  # fails if it exists: never overwrite
                created = True
            except FileExistsError:
                created = False
            return sha, size, created
        finally:
            Path(tmp).unlink(missing_ok=True)

    def delete(self, sha256: str) -> None:
        self.path(sha256).unlink(missing_ok=True)

    def open_tensor(self, sha256: str, dtype: torch.dtype, shape: tuple[int, ...], nbytes: int) -> torch.Tensor:
        p = self.path(sha256)
        if nbytes and not p.exists():
            raise InputError(f"blob {sha256} is missing from {self.root}")
        return raw_tensor(p, 0, nbytes, dtype, shape)
