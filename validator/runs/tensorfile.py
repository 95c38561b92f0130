"""Reading safetensors files safely: the header is validated before any tensor is touched.

safetensors never unpickles, but a corrupt or hostile file can still claim offsets beyond its end,
overlap tensors, or use an unknown dtype. Every such problem becomes an :class:`InputError` naming the
file and the tensor. Tensor data is memory-mapped, so reading one tensor does not read the others.

Headers, dtypes, shapes and byte sizes are plain data here: parsing and validating a file (and so an
ingest, which streams the bytes) does not import torch. Only materialising a tensor (:meth:`SafetensorsFile.load`,
:func:`raw_tensor`, :func:`torch_dtype`, :data:`DTYPES`) does.
"""

from __future__ import annotations

import json
import math
import mmap
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

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

MAX_HEADER_BYTES = 100 * 1024 * 1024

# safetensors dtype code -> dtype name (as torch spells it without "torch.", and as records store it)
DTYPE_NAMES: dict[str, str] = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U8": "uint8",
    "BOOL": "bool",
}
# dtype name -> bytes per element
ITEMSIZES: dict[str, int] = {
    "float64": 8,
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
}


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


@dataclass(frozen=True)
class TensorEntry:
    key: str
    dtype_name: str  # "bfloat16" (see DTYPE_NAMES)
    shape: tuple[int, ...]
    begin: int  # absolute byte offset in the file
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin

    @property
    def dtype(self) -> torch.dtype:
        """The torch dtype (imports torch)."""
        return torch_dtype(self.dtype_name)


class SafetensorsFile:
    """A validated safetensors file. ``entries`` maps key -> :class:`TensorEntry`."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.metadata: dict[str, str] = {}
        self.entries: dict[str, TensorEntry] = {}
        self._parse()

    def _err(self, msg: str, key: str | None = None) -> InputError:
        where = f"{self.path}" + (f", tensor {key!r}" if key is not None else "")
        return InputError(f"{where}: {msg}")

    def _parse(self) -> None:
        try:
            size = self.path.stat().st_size
            with open(self.path, "rb") as f:
                head = f.read(8)
                if len(head) < 8:
                    raise self._err("not a safetensors file (shorter than its 8-byte header length)")
                (hlen,) = struct.unpack("<Q", head)
                if hlen > MAX_HEADER_BYTES:
                    raise self._err(f"header of {hlen} bytes exceeds the {MAX_HEADER_BYTES}-byte limit")
                if 8 + hlen > size:
                    raise self._err(f"truncated: header claims {hlen} bytes but the file has {size - 8}")
                raw = f.read(hlen)
        except OSError as exc:
            raise self._err(f"cannot read: {exc.strerror or exc}") from None
        try:
            header = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            raise self._err("corrupt header (not valid UTF-8 JSON)") from None
        if not isinstance(header, dict):
            raise self._err("corrupt header (not a JSON object)")
        meta = header.pop("__metadata__", None) or {}
        if not isinstance(meta, dict):
            raise self._err("__metadata__ must be an object")
        self.metadata = {str(k): str(v) for k, v in meta.items()}
        data_start = 8 + hlen
        data_len = size - data_start
        spans: list[tuple[int, int, str]] = []
        for key, info in header.items():
            self.entries[key] = self._entry(key, info, data_start, data_len)
            e = self.entries[key]
            if e.nbytes:
                spans.append((e.begin, e.end, key))
        spans.sort()
        for (_, end0, k0), (b1, _, k1) in zip(spans, spans[1:]):
            if b1 < end0:
                raise self._err(f"data overlaps tensor {k0!r}", k1)

    def _entry(self, key: str, info: Any, data_start: int, data_len: int) -> TensorEntry:
        if not isinstance(info, dict):
            raise self._err("header entry is not an object", key)
        code = info.get("dtype")
        if not isinstance(code, str) or code not in DTYPE_NAMES:
            raise self._err(f"unknown dtype {code!r}", key)
        shape = info.get("shape")
        if not isinstance(shape, list) or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape):
            raise self._err(f"bad shape {shape!r}", key)
        if len(shape) > 64 or math.prod(max(s, 1) for s in shape) >= 1 << 62:  # torch would overflow
            raise self._err(f"shape {shape} is too large", key)
        offs = info.get("data_offsets")
        if (
            not isinstance(offs, list)
            or len(offs) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) for o in offs)
            or not 0 <= offs[0] <= offs[1]
        ):
            raise self._err(f"bad data_offsets {offs!r}", key)
        dname = DTYPE_NAMES[code]
        expected = math.prod(shape) * ITEMSIZES[dname]
        if offs[1] - offs[0] != expected:
            raise self._err(f"data_offsets span {offs[1] - offs[0]} bytes but shape {shape} of {code} needs {expected}", key)
        if offs[1] > data_len:
            raise self._err(f"truncated: tensor data ends at byte {offs[1]} but the file holds {data_len} data bytes", key)
        return TensorEntry(key, dname, tuple(shape), data_start + offs[0], data_start + offs[1])

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
