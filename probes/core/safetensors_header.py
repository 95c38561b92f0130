"""The header of a ``.safetensors`` file, read and validated before any tensor is touched.

safetensors never unpickles, but a corrupt or hostile file can still claim offsets beyond its end, overlap
tensors, or use an unknown dtype. Every such problem is a :class:`HeaderError` whose message names the file and
the tensor. Only the 8-byte length and the JSON header are read; no tensor data, no torch (an entry's
:attr:`TensorEntry.dtype` imports it). The weight manifests (:mod:`probes.rl.weights`) and the validator's
safetensors reading (``validator.runs.tensorfile``) both read headers here.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = ["DTYPE_NAMES", "ITEMSIZES", "MAX_HEADER_BYTES", "HeaderError", "TensorEntry", "read_header"]

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


class HeaderError(ValueError):
    """A file whose header cannot be trusted; the message names the file (and the tensor)."""


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
        import torch

        dtype: torch.dtype = getattr(torch, self.dtype_name)
        return dtype


def _err(path: Path, msg: str, key: str | None = None) -> HeaderError:
    return HeaderError(f"{path}" + (f", tensor {key!r}" if key is not None else "") + f": {msg}")


def read_header(path: str | Path) -> tuple[dict[str, str], dict[str, TensorEntry]]:
    """``(metadata, entries)`` of a safetensors file: its ``__metadata__`` (strings) and, by tensor name, where
    each tensor's bytes lie, checked against the file's size, the dtype's item size and the other tensors."""
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise _err(path, "not a safetensors file (shorter than its 8-byte header length)")
            (hlen,) = struct.unpack("<Q", head)
            if hlen > MAX_HEADER_BYTES:
                raise _err(path, f"header of {hlen} bytes exceeds the {MAX_HEADER_BYTES}-byte limit")
            if 8 + hlen > size:
                raise _err(path, f"truncated: header claims {hlen} bytes but the file has {size - 8}")
            raw = f.read(hlen)
    except OSError as exc:
        raise _err(path, f"cannot read: {exc.strerror or exc}") from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise _err(path, "corrupt header (not valid UTF-8 JSON)") from None
    if not isinstance(header, dict):
        raise _err(path, "corrupt header (not a JSON object)")
    meta = header.pop("__metadata__", None) or {}
    if not isinstance(meta, dict):
        raise _err(path, "__metadata__ must be an object")
    metadata = {str(k): str(v) for k, v in meta.items()}
    data_start = 8 + hlen
    data_len = size - data_start
    entries: dict[str, TensorEntry] = {}
    spans: list[tuple[int, int, str]] = []
    for key, info in header.items():
        e = entries[key] = _entry(path, key, info, data_start, data_len)
        if e.nbytes:
            spans.append((e.begin, e.end, key))
    spans.sort()
    for (_, end0, k0), (b1, _, k1) in zip(spans, spans[1:]):
        if b1 < end0:
            raise _err(path, f"data overlaps tensor {k0!r}", k1)
    return metadata, entries


def _entry(path: Path, key: str, info: Any, data_start: int, data_len: int) -> TensorEntry:
    if not isinstance(info, dict):
        raise _err(path, "header entry is not an object", key)
    code = info.get("dtype")
    if not isinstance(code, str) or code not in DTYPE_NAMES:
        raise _err(path, f"unknown dtype {code!r}", key)
    shape = info.get("shape")
    if not isinstance(shape, list) or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape):
        raise _err(path, f"bad shape {shape!r}", key)
    if len(shape) > 64 or math.prod(max(s, 1) for s in shape) >= 1 << 62:  # torch would overflow
        raise _err(path, f"shape {shape} is too large", key)
    offs = info.get("data_offsets")
    if (
        not isinstance(offs, list)
        or len(offs) != 2
        or not all(isinstance(o, int) and not isinstance(o, bool) for o in offs)
        or not 0 <= offs[0] <= offs[1]
    ):
        raise _err(path, f"bad data_offsets {offs!r}", key)
    dname = DTYPE_NAMES[code]
    expected = math.prod(shape) * ITEMSIZES[dname]
    if offs[1] - offs[0] != expected:
        raise _err(
            path, f"data_offsets span {offs[1] - offs[0]} bytes but shape {shape} of {code} needs {expected}", key
        )
    if offs[1] > data_len:
        raise _err(path, f"truncated: tensor data ends at byte {offs[1]} but the file holds {data_len} data bytes", key)
    return TensorEntry(key, dname, tuple(shape), data_start + offs[0], data_start + offs[1])
