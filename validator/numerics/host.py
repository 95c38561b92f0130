"""A small float tensor read into NumPy as it is stored, so that comparing small files needs no torch.

:class:`HostArray` holds a tensor's elements in their storage form: float64, float32 and float16 as NumPy's
types of the same name; bfloat16 as ``uint16`` and the float8 formats as ``uint8`` (their raw bits, with the
dtype's name beside them: NumPy has no such types). Nothing is converted on reading. ``runs.reassembly``
reads the tensors of at most ``backends.small.NUMPY_MAX`` elements of a comparison so, and the engine's NumPy
pass (``backends/small.py``) reads them as it reads CPU torch tensors, bit for bit; a pair with a torch tensor
on one side, a probe, the GPU or a larger pair turns it into a torch tensor (:meth:`HostArray.to_torch`).

A ``HostArray`` answers the few questions the judging code asks of a tensor: ``shape``, ``dtype`` (the name,
as ``runs.tensorfile.DTYPE_NAMES`` spells it), ``numel()`` and ``is_floating_point()``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias

import numpy as np

if TYPE_CHECKING:
    import torch

__all__ = ["STORAGE", "ULP_NAMES", "Array", "HostArray", "from_torch", "rounded"]

# dtype name -> the NumPy type its elements are stored as (the float dtypes the NumPy pass reads)
STORAGE: dict[str, type[np.generic]] = {
    "float64": np.float64,
    "float32": np.float32,
    "float16": np.float16,
    "bfloat16": np.uint16,
    "float8_e4m3fn": np.uint8,
    "float8_e5m2": np.uint8,
}
ULP_NAMES = frozenset(STORAGE) - {"float64"}  # the dtypes with ULP metrics (common.ULP_DTYPES, by name)
_AS_INT = {2: np.int16, 1: np.uint8}  # bfloat16 and float8 bits as a type torch.from_numpy takes


@dataclass(frozen=True, eq=False)
class HostArray:
    """A tensor's elements in host memory, in their storage form (see the module); ``dtype`` names its dtype."""

    bits: np.ndarray
    dtype: str

    def __post_init__(self) -> None:
        want = STORAGE.get(self.dtype)
        if want is None or self.bits.dtype != want:
            raise ValueError(f"a {self.dtype} HostArray is stored as {want}, not {self.bits.dtype}")

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.bits.shape)

    def numel(self) -> int:
        return int(self.bits.size)

    def is_floating_point(self) -> bool:
        return True

    def to_torch(self) -> torch.Tensor:
        """The same elements as a CPU torch tensor of ``dtype`` (imports torch; shares the memory)."""
        import torch

        bits = self.bits if self.bits.flags.writeable else self.bits.copy()  # torch wants writable memory
        dtype = getattr(torch, self.dtype)
        if self.dtype in ("float64", "float32", "float16"):
            return torch.from_numpy(bits)
        return torch.from_numpy(bits.view(_AS_INT[bits.itemsize])).view(dtype)


def rounded(a: HostArray, dtype: str) -> HostArray | None:
    """``a``'s elements rounded to ``dtype`` as torch's ``Tensor.to`` rounds them on the CPU (the rounding floor of
    ``numerics.floors``): the same values, a NaN's bits aside (no metric of a pair of two dtypes reads them);
    None where only torch rounds so (a float8 target or source).

    torch rounds to nearest, ties to even, through float32: a float64 bound for float16 or bfloat16 is rounded to
    float32 first (two roundings, as torch does), then to the target; float32 to bfloat16 is torch's
    ``round_to_nearest_even``, float32 to float16 NumPy's cast (the same IEEE rounding)."""
    if dtype not in ("float64", "float32", "float16", "bfloat16") or a.dtype not in STORAGE or a.bits.itemsize == 1:
        return None
    with np.errstate(over="ignore", invalid="ignore"):  # past the target's range: infinity, as in torch
        if a.dtype == "bfloat16":
            wide = (a.bits.astype(np.uint32) << 16).view(np.float32)
        else:
            wide = a.bits.astype(np.float64 if dtype == "float64" else np.float32)
        if dtype in ("float64", "float32", "float16"):
            return HostArray(wide.astype(STORAGE[dtype]), dtype)
        u = wide.view(np.uint32)
        bits = ((u + (((u >> 16) & 1) + 0x7FFF)) >> 16).astype(np.uint16)  # (wraps only past NaN's bits)
    return HostArray(np.where(np.isnan(wide), np.uint16(0x7FC0), bits), dtype)  # a NaN stays one


def from_torch(t: torch.Tensor) -> HostArray:
    """A CPU torch tensor of one of :data:`STORAGE`'s dtypes as a HostArray (a copy; for tests and tools)."""
    import torch

    name = str(t.dtype).removeprefix("torch.")
    if name not in STORAGE:
        raise ValueError(f"no HostArray holds {name}")
    c = t.detach().cpu().contiguous()
    if name in ("float64", "float32", "float16"):
        return HostArray(c.numpy().copy(), name)
    raw = c.view(torch.int16 if c.element_size() == 2 else torch.uint8).numpy()
    return HostArray(raw.view(STORAGE[name]).copy(), name)


Array: TypeAlias = "torch.Tensor | HostArray"  # what the engine measures
