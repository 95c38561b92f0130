"""Reading one blob as a tensor from wherever a store URL points, without a store object or a local cache: what
a comparison worker on another machine does (validator.executors). The bytes come straight from the
store (a directory every worker mounts, or S3), are checked against their sha256 where they are downloaded,
and nothing is written to the worker's disk."""

from __future__ import annotations

import functools
import hashlib
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from validator.errors import InputError, ValidatorError
from validator.runs.tensorfile import raw_tensor, torch_dtype
from validator.store.blobs import LocalBlobStore, check_sha

if TYPE_CHECKING:
    import torch

__all__ = ["open_blob_range", "open_blob_tensor", "open_file_range", "open_file_tensor", "READ_CHUNK", "RANGE_BYTES", "RANGE_STREAMS"]

READ_CHUNK = 8 << 20  # bytes per piece of an S3 body copied into the tensor's buffer
RANGE_BYTES = 64 << 20  # an object larger than this is read in ranges of this size (S3 range reads)...
RANGE_STREAMS = 8  # ...this many at a time


def open_file_tensor(path: str, offset: int, nbytes: int, dtype: str, shape: tuple[int, ...]) -> torch.Tensor:
    """A tensor stored raw at ``offset`` of a file (a safetensors file on a shared filesystem), memory-mapped."""
    return raw_tensor(Path(path), offset, nbytes, torch_dtype(dtype), shape)


def open_file_range(path: str, offset: int, dtype: str, start: int, stop: int) -> torch.Tensor:
    """Elements ``start .. stop`` (row-major) of a tensor stored raw at ``offset`` of a file, as a 1-D tensor
    read into memory: exactly those bytes are read (positioned reads, nothing mapped), so a task that measures
    a range of a huge tensor holds the range, not the tensor. ``OSError`` if the file ends before ``stop``."""
    import torch

    size = torch_dtype(dtype).itemsize
    nbytes = (stop - start) * size
    if nbytes <= 0:
        return torch.empty(0, dtype=torch_dtype(dtype))
    buf = bytearray(nbytes)
    view = memoryview(buf)
    pos = offset + start * size
    with open(path, "rb", buffering=0) as f:
        done = 0
        while done < nbytes:
            got = os.preadv(f.fileno(), [view[done : done + min(nbytes - done, READ_CHUNK)]], pos + done)
            if not got:
                raise OSError(f"{path}: file ended {nbytes - done} bytes before the range's end")
            done += got
    return torch.frombuffer(buf, dtype=torch.uint8).view(torch_dtype(dtype))


def open_blob_range(
    url: str, sha256: str, dtype: str, nbytes: int, start: int, stop: int, *, range_bytes: int | None = None
) -> torch.Tensor:
    """Elements ``start .. stop`` of the blob ``sha256`` (``nbytes`` in all) of the store at ``url``, as a 1-D
    tensor, reading only their bytes: positioned reads of the blob's file (``file://``) or S3 range GETs of
    ``range_bytes`` each, side by side (``s3://``). The blob's digest covers the whole object, so a range
    cannot be checked against it; the object's length is checked against ``nbytes`` (S3: one HEAD)."""
    import torch

    check_sha(sha256)
    size = torch_dtype(dtype).itemsize
    if not 0 <= start <= stop or stop * size > nbytes:
        raise InputError(f"elements {start}..{stop} are outside blob {sha256} ({nbytes} bytes of {dtype})")
    if url.startswith("file://"):
        path = LocalBlobStore(Path(url[len("file://") :])).path(sha256)
        try:
            length = path.stat().st_size
        except FileNotFoundError:
            raise InputError(f"blob {sha256} is missing from {url[len('file://'):]}") from None
        if length != nbytes:
            raise InputError(f"blob {sha256} in {url[len('file://'):]} is {length} bytes, its record says {nbytes}")
        return open_file_range(str(path), 0, dtype, start, stop)
    if not url.startswith("s3://"):
        raise InputError(f"unsupported blob store URL {url!r} (use file://PATH or s3://BUCKET/PREFIX)")
    if start == stop:
        return torch.empty(0, dtype=torch_dtype(dtype))
    store = _s3_store(url)
    _check_length(store, url, sha256, nbytes)
    lo, hi = start * size, stop * size
    buf = bytearray(hi - lo)
    _read_spans(store, url, sha256, memoryview(buf), lo, hi, range_bytes or RANGE_BYTES, whole=False)
    return torch.frombuffer(buf, dtype=torch.uint8).view(torch_dtype(dtype))


def _read_spans(store: Any, url: str, sha256: str, view: memoryview, lo: int, hi: int, step: int, *, whole: bool) -> None:
    """Bytes ``lo:hi`` of the object into ``view`` (``view[0]`` is byte ``lo``): one GET when they fit in
    ``step`` (``whole``: without a Range header), else GETs of ``step`` bytes, RANGE_STREAMS side by side."""
    edges = [*range(lo, hi, step), hi]
    spans = list(zip(edges, edges[1:]))
    if len(spans) == 1:
        _read_range(store, url, sha256, view, lo, hi, whole=whole, base=lo)
        return
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=min(RANGE_STREAMS, len(spans)), thread_name_prefix="blob-range") as ex:
        list(ex.map(lambda se: _read_range(store, url, sha256, view, se[0], se[1], whole=False, base=lo), spans))


def _check_length(store: Any, url: str, sha256: str, nbytes: int) -> None:
    """The object's length is the record's (a HEAD request)."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        head = store.client.head_object(Bucket=store.bucket, Key=store.key(sha256))
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
            raise InputError(f"blob {sha256} is missing from object storage ({url.split('?')[0]})") from None
        raise ValidatorError(f"object storage: {exc}") from None
    except BotoCoreError as exc:
        raise ValidatorError(f"object storage: {exc}") from None
    if int(head.get("ContentLength", nbytes)) != nbytes:
        raise InputError(f"blob {sha256} in object storage is {head['ContentLength']} bytes, its record says {nbytes}")


def open_blob_tensor(
    url: str, sha256: str, dtype: str, shape: tuple[int, ...], nbytes: int, *, range_bytes: int | None = None
) -> torch.Tensor:
    """The blob ``sha256`` of the store at ``url`` (``file://PATH`` or ``s3://BUCKET/PREFIX?endpoint=...``)
    as a tensor. A directory is memory-mapped in place. An S3 object is read into memory once, in ranges of
    ``range_bytes`` (default :data:`RANGE_BYTES`) fetched side by side when it is larger than one, and its
    digest is checked (memory: the tensor's bytes, nothing more)."""
    check_sha(sha256)
    if url.startswith("file://"):
        return LocalBlobStore(Path(url[len("file://") :])).open_tensor(sha256, torch_dtype(dtype), shape, nbytes)
    if url.startswith("s3://"):
        return _s3_tensor(url, sha256, dtype, shape, nbytes, range_bytes or RANGE_BYTES)
    raise InputError(f"unsupported blob store URL {url!r} (use file://PATH or s3://BUCKET/PREFIX)")


@functools.lru_cache(maxsize=8)
def _s3_store(url: str) -> Any:
    from validator.store.blobs_s3 import S3BlobStore

    # the cache directory is never written: reads below go to memory, not through S3BlobStore.path
    return S3BlobStore.from_url(url, cache_dir=Path(tempfile.gettempdir()) / "validator-blob-read")


def _read_range(store: Any, url: str, sha256: str, view: memoryview, start: int, end: int, whole: bool, base: int = 0) -> None:
    """Bytes ``start:end`` of the object into ``view[start - base:end - base]`` (one GET; ``whole``: without a
    Range; ``base``: the object's offset of ``view[0]``)."""
    from botocore.exceptions import BotoCoreError, ClientError

    pos = start
    try:
        kwargs = {} if whole else {"Range": f"bytes={start}-{end - 1}"}
        obj = store.client.get_object(Bucket=store.bucket, Key=store.key(sha256), **kwargs)
        for chunk in obj["Body"].iter_chunks(READ_CHUNK):
            stop = pos + len(chunk)
            if stop > end:
                raise InputError(f"blob {sha256} in object storage is longer than its record says ({len(view)} bytes)")
            view[pos - base : stop - base] = chunk
            pos = stop
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code")
        if code in ("404", "NoSuchKey", "NotFound"):
            raise InputError(f"blob {sha256} is missing from object storage ({url.split('?')[0]})") from None
        if code in ("416", "InvalidRange"):
            raise InputError(f"blob {sha256} in object storage is shorter than its record's {len(view)} bytes") from None
        raise ValidatorError(f"object storage: {exc}") from None
    except BotoCoreError as exc:
        raise ValidatorError(f"object storage: {exc}") from None
    if pos != end:
        raise InputError(f"blob {sha256} in object storage is shorter than its record's {len(view)} bytes")


def _s3_tensor(url: str, sha256: str, dtype: str, shape: tuple[int, ...], nbytes: int, range_bytes: int) -> torch.Tensor:
    import torch

    tdtype = torch_dtype(dtype)
    if nbytes == 0:
        return torch.empty(shape, dtype=tdtype)
    store = _s3_store(url)
    buf = bytearray(nbytes)
    view = memoryview(buf)
    _read_spans(store, url, sha256, view, 0, nbytes, range_bytes, whole=True)
    if nbytes > range_bytes:  # ranged GETs stop at the record's length: a longer object shows only in a HEAD
        _check_length(store, url, sha256, nbytes)
    if hashlib.sha256(view).hexdigest() != sha256:
        raise InputError(f"blob {sha256} in object storage does not match its digest")
    return torch.frombuffer(buf, dtype=torch.uint8).view(tdtype).reshape(shape)
