"""Blobs in S3-compatible object storage (AWS S3, SeaweedFS, MinIO...), keyed by sha256.

Objects are written with ``If-None-Match: *`` so an existing object is never overwritten; reads go
through a local content-addressed cache (downloaded once, verified against the digest) so tensors can
still be memory-mapped.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlparse

from validator.errors import InputError, ValidatorError
from validator.store.blobs import Durability, LocalBlobStore, check_sha, write_temp

if TYPE_CHECKING:
    import torch

__all__ = ["S3BlobStore"]


class S3BlobStore:
    def __init__(self, client: Any, bucket: str, prefix: str, cache_dir: Path) -> None:
        self.client = client
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.cache = LocalBlobStore(cache_dir)

    @classmethod
    def from_url(cls, url: str, *, cache_dir: Path) -> S3BlobStore:
        """``s3://BUCKET/PREFIX?endpoint=http://host:port&region=us-east-1``; credentials from the usual
        AWS environment variables or files."""
        import boto3
        from botocore.config import Config

        u = urlparse(url)
        if not u.netloc:
            raise InputError(f"blob store URL {url!r} needs a bucket: s3://BUCKET/PREFIX")
        q = {k: v[-1] for k, v in parse_qs(u.query).items()}
        client = boto3.client(
            "s3",
            endpoint_url=q.get("endpoint") or os.environ.get("AWS_ENDPOINT_URL") or None,
            region_name=q.get("region") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1",
            config=Config(retries={"max_attempts": 5, "mode": "standard"}),
        )
        return cls(client, u.netloc, u.path, cache_dir)

    def key(self, sha256: str) -> str:
        check_sha(sha256)
        return f"{self.prefix}/{sha256[:2]}/{sha256[2:]}" if self.prefix else f"{sha256[:2]}/{sha256[2:]}"

    def exists(self, sha256: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            self.client.head_object(Bucket=self.bucket, Key=self.key(sha256))
            return True
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return False
            raise ValidatorError(f"object storage: {exc}") from None

    def put(
        self, chunks: Iterable[bytes | memoryview], *, expect_sha256: str | None = None, batch: Durability | None = None
    ) -> tuple[str, int, bool]:
        """A PUT is durable when it returns: ``batch`` has nothing to add. The spooled copy needs no fsync."""
        from botocore.exceptions import ClientError

        tmp, sha, size = write_temp(self.cache.tmp, chunks, expect_sha256, fsync=False)
        try:
            if self.exists(sha):
                return sha, size, False
            try:
                with open(tmp, "rb") as f:
                    self.client.put_object(Bucket=self.bucket, Key=self.key(sha), Body=f, IfNoneMatch="*")
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") in ("PreconditionFailed", "412"):
                    return sha, size, False  # written concurrently by someone else: same content
                raise ValidatorError(f"object storage: {exc}") from None
            return sha, size, True
        finally:
            Path(tmp).unlink(missing_ok=True)

    def delete(self, sha256: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self.key(sha256))
        self.cache.delete(sha256)

    def path(self, sha256: str) -> Path:
        local = self.cache.path(sha256)
        if local.exists():
            return local
        from botocore.exceptions import ClientError

        def body() -> Iterable[bytes]:
            try:
                obj = self.client.get_object(Bucket=self.bucket, Key=self.key(sha256))
            except ClientError as exc:
                raise InputError(f"blob {sha256} is missing from object storage ({exc})") from None
            yield from obj["Body"].iter_chunks(8 << 20)

        self.cache.put(body(), expect_sha256=sha256)
        return local

    def open_tensor(self, sha256: str, dtype: torch.dtype, shape: tuple[int, ...], nbytes: int) -> torch.Tensor:
        if nbytes == 0:
            import torch

            return torch.empty(shape, dtype=dtype)
        self.path(sha256)
        return self.cache.open_tensor(sha256, dtype, shape, nbytes)

    def read_into(self, sha256: str, out: memoryview) -> None:
        if len(out):
            self.path(sha256)
            self.cache.read_into(sha256, out)
