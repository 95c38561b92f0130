"""Feeding a stored tensor's bytes to the blob store in bounded pieces (ingest with bounded memory).

``Service._store_tensor`` hashes and copies each tensor through a memory map of its safetensors file.
Every page it touches stays resident (and counts in RSS) until the whole tensor is done, so the peak
grows with the largest tensor. :func:`ref_byte_chunks` reads the same bytes with ``readinto`` into one
reused buffer instead: the resident cost is the buffer, whatever the tensor size.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

__all__ = ["CHUNK_BYTES", "file_byte_chunks", "ref_byte_chunks", "tensor_file_location"]

CHUNK_BYTES = 8 << 20


def file_byte_chunks(path: str | Path, offset: int, nbytes: int, chunk: int = CHUNK_BYTES) -> Iterator[memoryview]:
    """``nbytes`` bytes of ``path`` from ``offset``, in pieces of at most ``chunk`` bytes.

    Each piece is a view of one reused buffer, valid until the next piece is requested (consume it at
    once, as ``BlobStore.put`` does). Raises ``OSError`` if the file is shorter than promised.
    """
    buf = bytearray(min(chunk, nbytes) or 1)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        f.seek(offset)
        left = nbytes
        while left:
            want = min(left, len(buf))
            got = f.readinto(view[:want])  # type: ignore[attr-defined]
            if not got:
                raise OSError(f"{path}: file ended {left} bytes before the tensor's end")
            left -= got
            yield view[:got]
        if hasattr(os, "posix_fadvise"):  # the pages were read once; let the cache drop them first
            os.posix_fadvise(f.fileno(), offset, nbytes, os.POSIX_FADV_DONTNEED)


def tensor_file_location(ref: Any) -> tuple[Path, int, int] | None:
    """(file, byte offset, byte count) of a ``TensorRef`` read from a safetensors file, else ``None``.

    Works with the loaders ``validator.sources`` builds today (``functools.partial(SafetensorsFile.load,
    key)``); a ``TensorRef`` field naming the location would make this explicit.
    """
    from ..tensorfile import SafetensorsFile

    loader = getattr(ref, "loader", None)
    if not isinstance(loader, functools.partial) or loader.keywords or len(loader.args) != 1:
        return None
    owner = getattr(loader.func, "__self__", None)
    if not isinstance(owner, SafetensorsFile) or getattr(loader.func, "__func__", None) is not SafetensorsFile.load:
        return None
    entry = owner.entries.get(loader.args[0])
    if entry is None:
        return None
    return owner.path, entry.begin, entry.nbytes


def ref_byte_chunks(ref: Any, chunk: int = CHUNK_BYTES) -> Iterator[memoryview]:
    """The raw bytes of ``ref`` (as ``probes.bundle.tensor_bytes(ref.load())`` would give them), streamed.

    Safetensors entries are read from their file in pieces; anything else (a stored blob, a custom
    loader) is loaded and sliced.
    """
    loc = tensor_file_location(ref)
    if loc is not None:
        yield from file_byte_chunks(*loc, chunk=chunk)
        return
    from probes.bundle import tensor_bytes

    t: torch.Tensor = ref.load()
    data = tensor_bytes(t)
    for start in range(0, len(data), chunk):
        yield data[start : start + chunk]
