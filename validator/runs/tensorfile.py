"""Reading safetensors files safely: the header is validated before any tensor is touched.

safetensors never unpickles, but a corrupt or hostile file can still claim offsets beyond its end,
overlap tensors, or use an unknown dtype. The header is read and checked by
:func:`probes.core.safetensors_header.read_header` (shared with the probes' weight manifests); every such
problem becomes an :class:`InputError` naming the file and the tensor. Tensor data is memory-mapped, so
reading one tensor does not read the others.

Headers, dtypes, shapes and byte sizes are plain data here: parsing and validating a file (and so an
ingest, which streams the bytes) does not import torch. Only materialising a tensor (:meth:`SafetensorsFile.load`,
:func:`raw_tensor`, :func:`torch_dtype`, :data:`DTYPES`) does.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from probes.core.safetensors_header import DTYPE_NAMES, ITEMSIZES, HeaderError, TensorEntry, read_header
from validator.errors import InputError

if TYPE_CHECKING:
    import torch

    DTYPES: dict[str, torch.dtype]  # safetensors dtype code -> torch dtype (built on first use, see __getattr__)

__all__ = [
    "DTYPES",
    "DTYPE_NAMES",
    "ITEMSIZES",
    "TensorEntry",
    "SafetensorsFile",
    "check_dtype",
    "torch_dtype",
    "dtype_name",
    "raw_tensor",
    "file_byte_chunks",
]

CHUNK_BYTES = 8 << 20


def __getattr__(name: str) -> Any:
    if name == "DTYPES":  # needs torch: built on first use, so that importing this module does not load it
        import torch

        table = {code: getattr(torch, dname) for code, dname in DTYPE_NAMES.items()}
        globals()["DTYPES"] = table
        return table
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def check_dtype(name: str, *, where: str = "") -> str:
    """The dtype name (``bfloat16``) of a record's dtype name or a safetensors code (``BF16``); no torch."""
    if name in ITEMSIZES:
        return name
    got = DTYPE_NAMES.get(name)
    if got is None:
        raise InputError(f"{where}unknown dtype {name!r}")
    return got


def torch_dtype(name: str, *, where: str = "") -> torch.dtype:
    """Torch dtype from a record's dtype name (``bfloat16``) or a safetensors code (``BF16``)."""
    import torch

    dtype: torch.dtype = getattr(torch, check_dtype(name, where=where))
    return dtype


def dtype_name(t: torch.dtype) -> str:
    return str(t).removeprefix("torch.")


class SafetensorsFile:
    """A validated safetensors file. ``entries`` maps key -> :class:`TensorEntry`."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            self.metadata, self.entries = read_header(self.path)
        except HeaderError as exc:
            raise InputError(str(exc)) from None

    def _err(self, msg: str, key: str | None = None) -> InputError:
        where = f"{self.path}" + (f", tensor {key!r}" if key is not None else "")
        return InputError(f"{where}: {msg}")

    def load(self, key: str) -> torch.Tensor:
        """The tensor, memory-mapped read-only (copy-on-write): nothing else in the file is read."""
        e = self.entries.get(key)
        if e is None:
            raise self._err("no such tensor in file", key)
        return raw_tensor(self.path, e.begin, e.nbytes, e.dtype, e.shape)


DROP_BEHIND_BYTES = 1 << 20


def file_byte_chunks(path: str | Path, offset: int, nbytes: int, chunk: int = CHUNK_BYTES) -> Iterator[memoryview]:
    """``nbytes`` bytes of ``path`` from ``offset``, in pieces of at most ``chunk`` bytes.

    Each piece is a view of one reused buffer, valid until the next is requested (consume it at once, as
    ``BlobStore.put`` does): resident memory is the buffer, whatever the tensor size. Raises ``OSError``
    if the file is shorter than promised.
    """
    buf = bytearray(min(chunk, nbytes) or 1)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        f.seek(offset)
        left = nbytes
        while left:
            got = f.readinto(view[: min(left, len(buf))])
            if not got:
                raise OSError(f"{path}: file ended {left} bytes before the tensor's end")
            left -= got
            yield view[:got]
        # read once: let the page cache drop a large tensor's pages first (small ones share pages with
        # their neighbours, and a system call each costs more than the pages)
        if nbytes >= DROP_BEHIND_BYTES and hasattr(os, "posix_fadvise"):
            os.posix_fadvise(f.fileno(), offset, nbytes, os.POSIX_FADV_DONTNEED)


def raw_tensor(path: Path, offset: int, nbytes: int, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    """A tensor over ``nbytes`` raw bytes at ``offset`` of ``path``, memory-mapped copy-on-write."""
    import torch

    if nbytes == 0:
        return torch.empty(shape, dtype=dtype)
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    buf = torch.frombuffer(memoryview(mm)[offset : offset + nbytes], dtype=torch.uint8)
    return buf.view(dtype).reshape(shape)
