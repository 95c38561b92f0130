"""The comparison engine: one read of a pair of tensors gives every total ``TensorMetrics`` needs.

Three backends, chosen by where the tensors are and what they hold, never by a setting:

- ``reference.py``: the definition, float64 NumPy on the host, streamed in pieces (integer and bool inputs,
  MPS, other accelerators, and CUDA without Triton);
- ``cuda.py``: one fused Triton pass per pair on a CUDA GPU (float dtypes), and a second kernel for what
  float32 could not decide;
- ``cpu.py``: one fused numba pass per pair on the CPU (float dtypes), on numba's own threads; small
  pairs several per pass (:func:`totals_of_many`), with the same bits; ``small.py``: pairs of at most
  ``small.NUMPY_MAX`` elements on the CPU, CPU tensors or ``host.HostArray`` (small tensors read from files
  as NumPy), in NumPy float64, with nothing to compile (numba is imported only when a larger pair comes, and
  torch only when a pair holds a torch tensor or goes to another backend).

Counts, ``max_abs`` and the largest ULP distance are exact on every backend; the sums agree with the float64
reference to about 1e-7 relative or better (``docs/performance.md``). A given backend returns
bit-identical results for the same inputs, whatever ran before and however many threads it has.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING, cast

from validator.numerics.backends.small import NUMPY_MAX, SMALL, small_totals, small_totals_many
from validator.numerics.backends.totals import Totals
from validator.numerics.host import HostArray

if TYPE_CHECKING:
    import torch

    from validator.numerics.host import Array

__all__ = ["Totals", "backend_for", "batchable", "totals_of", "totals_of_many"]


@functools.cache
def _cuda() -> ModuleType | None:
    """validator.numerics.backends.cuda, or None where Triton cannot be imported."""
    try:
        from validator.numerics.backends import cuda
    except ImportError:
        return None
    return cuda


def backend_for(a: Array, b: Array) -> str:
    """Which backend :func:`totals_of` uses for this pair: ``"cuda"``, ``"cpu"`` or ``"reference"``."""
    tensors = [t for t in (a, b) if not isinstance(t, HostArray)]  # a HostArray: a float dtype in host memory
    if not tensors:
        return "cpu"
    from validator.numerics.backends.common import FLOAT_DTYPES
    from validator.numerics.backends.reference import compute_device

    if any(t.dtype not in FLOAT_DTYPES for t in tensors):
        return "reference"
    if all(t.is_cpu for t in tensors):  # compute_device's CPU, without making a device (~2 us a pair)
        return "cpu"
    device = compute_device(tensors[0], tensors[-1])
    if device.type == "cuda" and _cuda() is not None:
        return "cuda"
    return "cpu" if device.type == "cpu" else "reference"


def as_torch(t: Array) -> torch.Tensor:
    """``t`` as a torch tensor: a HostArray's elements in one (imports torch), a tensor itself."""
    return t.to_torch() if isinstance(t, HostArray) else t


def totals_of(a: Array, b: Array, *, atol: float, rtol: float, chunk_elems: int, edges: Sequence[int] = ()) -> Totals:
    """The totals of ``a`` (reference) against ``b`` (inputs already checked), in one read of the pair.
    ``edges``: element offsets (0 first, ``numel`` last, in row-major order) of the blocks whose d² and
    a² the same pass sums (``Totals.block_d2``, ``block_a2``); one block by default."""
    backend = backend_for(a, b)
    if backend == "cpu" and a.numel() <= NUMPY_MAX:  # HostArrays as they are: no torch import for two of them
        return small_totals(a, b, atol=atol, rtol=rtol, edges=edges)
    a, b = as_torch(a), as_torch(b)  # a HostArray beside a tensor, or a large one
    if backend == "cuda":
        cuda = _cuda()
        assert cuda is not None
        got: Totals = cuda.cuda_totals(a, b, atol=atol, rtol=rtol, chunk_elems=chunk_elems, edges=edges)
        return got
    if backend == "cpu":
        from validator.numerics.backends.cpu import cpu_totals

        return cpu_totals(a, b, atol=atol, rtol=rtol, chunk_elems=chunk_elems, edges=edges)
    from validator.numerics.backends.reference import reference_totals

    return reference_totals(a, b, atol, rtol, chunk_elems, edges)


def totals_of_many(
    pairs: Sequence[tuple[Array, Array, Sequence[int]]], *, atol: float, rtol: float, chunk_elems: int
) -> list[Totals]:
    """:func:`totals_of` of each pair ``(a, b, edges)``, in order, with the same bits. Contiguous CPU pairs of
    float dtypes are measured together, one pass of the CPU engine per pair of dtypes; the others (and
    every pair on a GPU) one by one; the pairs of at most ``small.NUMPY_MAX`` elements all in one NumPy pass."""
    out: list[Totals | None] = [None] * len(pairs)
    together: dict[tuple[torch.dtype, torch.dtype], list[int]] = {}
    small: list[int] = []
    for i, (a, b, edges) in enumerate(pairs):
        cpu = backend_for(a, b) == "cpu"
        if cpu and a.numel() <= NUMPY_MAX:
            small.append(i)
        elif cpu and not isinstance(a, HostArray) and not isinstance(b, HostArray) and batchable(a, b):
            together.setdefault((a.dtype, b.dtype), []).append(i)
        else:
            out[i] = totals_of(a, b, atol=atol, rtol=rtol, chunk_elems=chunk_elems, edges=edges)
    for i, got in zip(small, small_totals_many([pairs[i] for i in small], atol=atol, rtol=rtol)):
        out[i] = got
    if together:
        from validator.numerics.backends.cpu import cpu_totals_many

        for idx in together.values():
            tensors = cast("list[tuple[torch.Tensor, torch.Tensor, Sequence[int]]]", [pairs[i] for i in idx])
            for i, got in zip(idx, cpu_totals_many(tensors, atol=atol, rtol=rtol)):
                out[i] = got
    return [t for t in out if t is not None]


def batchable(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``cpu.cpu_totals_many`` takes this pair (float dtypes on the CPU already checked): both
    contiguous, not empty and of at most SMALL elements (a larger pair keeps every thread busy alone)."""
    return 0 < a.numel() <= SMALL and a.is_contiguous() and b.is_contiguous()

