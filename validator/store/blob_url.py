"""Which blob store a settings URL names: ``None`` or ``file://PATH`` the local content-addressed directory,
``s3://bucket/prefix?endpoint=URL`` S3-compatible object storage."""

from __future__ import annotations

from pathlib import Path

from validator.errors import InputError
from validator.store.blobs import BlobStore, LocalBlobStore
from validator.store.blobs_s3 import S3BlobStore

__all__ = ["open_blob_store"]


def open_blob_store(url: str | None, *, local_dir: Path, cache_dir: Path) -> BlobStore:
    """``None`` or ``file://PATH``: local directory; ``s3://bucket/prefix?endpoint=URL``: object storage."""
    if not url:
        return LocalBlobStore(local_dir)
    if url.startswith("file://"):
        return LocalBlobStore(Path(url[len("file://") :]))
    if url.startswith("s3://"):
        return S3BlobStore.from_url(url, cache_dir=cache_dir)
    raise InputError(f"unsupported blob store URL {url!r} (use file://PATH or s3://BUCKET/PREFIX)")
