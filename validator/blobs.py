"""The blob store: content-addressed bytes. Paths come only from sha256 digests, never from names.

One small interface (put / open / path / exists) so an object-storage implementation can sit beside the
local directory. Writes never overwrite an existing object.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from collections.abc import Iterable
from pathlib import Path

import torch

from .errors import InputError
from .tensorfile import raw_tensor

__all__ = ["LocalBlobStore"]

_SHA_RE = re.compile(r"[0-9a-f]{64}")


class LocalBlobStore:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.tmp = self.root / "tmp"
        self.tmp.mkdir(parents=True, exist_ok=True)

    def path(self, sha256: str) -> Path:
        if not _SHA_RE.fullmatch(sha256):
            raise InputError(f"not a sha256 digest: {sha256!r}")
        return self.root / sha256[:2] / sha256[2:]

    def exists(self, sha256: str) -> bool:
        return self.path(sha256).exists()

    def put(self, chunks: Iterable[bytes | memoryview], *, expect_sha256: str | None = None) -> tuple[str, int, bool]:
        """Store bytes; returns (sha256, size, created). Verifies ``expect_sha256`` when given."""
        h = hashlib.sha256()
        size = 0
        fd, tmp = tempfile.mkstemp(dir=self.tmp)
        try:
            with os.fdopen(fd, "wb") as f:
                for c in chunks:
                    h.update(c)
                    f.write(c)
                    size += len(c)
                f.flush()
                os.fsync(f.fileno())
            sha = h.hexdigest()
            if expect_sha256 is not None and sha != expect_sha256:
                raise InputError(f"content hash mismatch: record says {expect_sha256}, bytes hash to {sha}")
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

    def read_bytes(self, sha256: str) -> bytes:
        return self.path(sha256).read_bytes()
