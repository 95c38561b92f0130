"""The blob store interface, on the local directory and on a real S3 server (SeaweedFS)."""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from validator.errors import InputError
from validator.store.blobs import BlobStore, LocalBlobStore

S3 = os.environ.get("VALIDATOR_TEST_S3_ENDPOINT")


BUCKET = "validator-tests"


def _s3_url() -> str:
    """One shared bucket, a fresh prefix per test."""
    import boto3
    from botocore.exceptions import ClientError

    client = boto3.client("s3", endpoint_url=S3, region_name="us-east-1")
    try:
        client.create_bucket(Bucket=BUCKET)
    except ClientError as exc:
        if exc.response["Error"]["Code"] not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
            raise
    return f"s3://{BUCKET}/t-{uuid.uuid4().hex[:10]}?endpoint={S3}"


@pytest.fixture(autouse=True)
def _aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")


@pytest.fixture(params=["local"] + (["s3"] if S3 else []))
def blob_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BlobStore]:
    if request.param == "local":
        yield LocalBlobStore(tmp_path / "blobs")
    else:
        from validator.store.blobs_s3 import S3BlobStore

        yield S3BlobStore.from_url(_s3_url(), cache_dir=tmp_path / "cache")


def test_put_is_content_addressed_and_never_overwrites(blob_store: BlobStore) -> None:
    data = b"hello tensor bytes" * 1000
    sha = hashlib.sha256(data).hexdigest()
    assert blob_store.put([data[:7], data[7:]]) == (sha, len(data), True)
    assert blob_store.put([data]) == (sha, len(data), False)
    assert blob_store.exists(sha)
    assert blob_store.path(sha).read_bytes() == data


def test_hash_mismatch_is_refused(blob_store: BlobStore) -> None:
    with pytest.raises(InputError, match="hash mismatch"):
        blob_store.put([b"abc"], expect_sha256="0" * 64)
    assert not blob_store.exists(hashlib.sha256(b"abc").hexdigest())


def test_open_tensor_round_trip(blob_store: BlobStore) -> None:
    t = torch.randn(3, 5).to(torch.bfloat16)
    raw = t.view(torch.uint8).numpy().tobytes()
    sha, n, _ = blob_store.put([raw])
    back = blob_store.open_tensor(sha, torch.bfloat16, (3, 5), n)
    assert torch.equal(back, t)


def test_read_into_fills_a_slice_of_a_larger_buffer(blob_store: BlobStore) -> None:
    raw = bytes(range(256)) * 3
    sha, n, _ = blob_store.put([raw])
    buf = bytearray(b"x" * (n + 8))
    blob_store.read_into(sha, memoryview(buf)[4 : 4 + n])
    assert bytes(buf) == b"xxxx" + raw + b"xxxx"
    with pytest.raises(InputError, match="shorter than"):
        blob_store.read_into(sha, memoryview(bytearray(n + 1)))
    with pytest.raises(InputError, match="missing"):
        blob_store.read_into("0" * 64, memoryview(bytearray(4)))


@pytest.mark.parametrize("bad", ["../../etc/passwd", "ab/../../x", "A" * 64, ""])
def test_names_are_never_paths(blob_store: BlobStore, bad: str) -> None:
    with pytest.raises(InputError, match="not a sha256"):
        blob_store.path(bad)


@pytest.mark.skipif(not S3, reason="needs the SeaweedFS S3 server that scripts/services starts")
def test_service_on_object_storage(tmp_path: Path) -> None:
    from tests.factories import tensors, write_tp_bundle
    from validator.service import Service
    from validator.settings import Settings

    svc = Service(Settings(home=tmp_path / "home", blob_url=_s3_url()))
    try:
        full = tensors()
        svc.ingest(write_tp_bundle(tmp_path, "a", full, tp=4))
        assert not (tmp_path / "home" / "blobs").exists() or not any((tmp_path / "home" / "blobs").rglob("??/*"))
        c = svc.compare("a", str(tmp_path / "a"))
        assert c.verdict == "pass" and all(p.metrics.rel_l2 == 0.0 for p in c.pairs)
    finally:
        svc.close()


def _flip(path: Path, at: int) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 1]))


@pytest.mark.parametrize("numel", [64, (2 << 20) // 4])  # read into memory; memory-mapped (above SMALL_BLOB)
def test_a_local_blob_flipped_on_disk_is_refused(tmp_path: Path, numel: int) -> None:
    """Local reads are checked against the digest as S3 reads are, also after a first good read (the file's
    change time tells a new version of it)."""
    store = LocalBlobStore(tmp_path / "blobs")
    t = torch.arange(numel, dtype=torch.float32)
    sha, n, _ = store.put([t.numpy().tobytes()])
    assert torch.equal(store.open_tensor(sha, torch.float32, (numel,), n), t)
    fresh = LocalBlobStore(tmp_path / "blobs")  # as another process would
    assert torch.equal(fresh.open_tensor(sha, torch.float32, (numel,), n), t)
    _flip(store.path(sha), n // 2)
    with pytest.raises(InputError, match=f"blob {sha} in .* does not match its digest"):
        store.open_tensor(sha, torch.float32, (numel,), n)
    with pytest.raises(InputError, match="does not match its digest"):
        store.read_into(sha, memoryview(bytearray(n)))


def test_a_stored_run_with_a_flipped_blob_never_passes(tmp_path: Path) -> None:
    from probes import BundleWriter
    from validator.service import Service
    from validator.settings import Settings

    big, small = torch.randn(512, 1024), torch.randn(16, 16)  # 2 MiB: memory-mapped; 1 KiB: read
    with BundleWriter(tmp_path / "src", run_name="src", part="p0") as w:
        w.add("big", big)
        w.add("small", small)
    svc = Service(Settings(home=tmp_path / "home"))
    try:
        svc.ingest(tmp_path / "src", name="stored")
        assert svc.compare("stored", str(tmp_path / "src")).verdict == "pass"
        for t in (big, small):
            _flip(svc.blobs.path(hashlib.sha256(t.numpy().tobytes()).hexdigest()), 100)
        with pytest.raises(InputError, match="does not match its digest"):
            svc.compare("stored", str(tmp_path / "src"))
    finally:
        svc.close()
