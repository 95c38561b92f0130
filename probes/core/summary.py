"""On-device summary statistics of a captured tensor (summary mode).

``summarize(t)`` returns a float64 tensor of 5 values on ``t``'s device, in this order
(:data:`SUMMARY_FIELDS`)::

    [0] norm       L2 norm of all elements
    [1] absmax     largest absolute value
    [2] mean       arithmetic mean of all elements
    [3] nonfinite  number of NaN and +-inf elements
    [4] checksum   position-weighted sum of the raw bit patterns, mod 2**32 (see below)

norm, absmax and mean follow IEEE arithmetic over every element: one NaN makes all three NaN, an inf
makes norm and absmax inf; ``nonfinite`` says how many there were (for float8 the bit patterns decide).
Complex tensors are summarised as their real view (``torch.view_as_real``). An empty tensor gives
``[0, 0, nan, 0, 0]``. norm and mean agree with a float64 computation to about 1e-6 relative or better;
absmax, nonfinite and checksum exactly.

Checksum. The tensor's bytes (row-major, little-endian, as stored in a bundle) are read as signed 16-bit
words (signed 8-bit words for 1-byte dtypes); word ``i`` is weighted by ``(i mod 2**16) + 1`` and the
weighted words are summed modulo 2**32 (a value in [0, 2**32), exact in the float64 result)::

    checksum = sum_i word_i * ((i mod 65536) + 1)  mod 2**32

(Until issue 19 it was ``sum_i word_i * ((i mod 65521) + 1) mod 2**48``: the fused kernel's form costs one
integer multiply-add per word in wrapping 32-bit arithmetic, and a power-of-two period needs no division.)

Integer addition is associative, so the value does not depend on the reduction order, chunking or device:
identical bytes give identical checksums everywhere. The position weights make it sensitive to swapped
elements or rows (a plain sum of bit patterns is not). Any change of one element changes it; it is a
checksum, not a cryptographic hash. The torch path sums exactly in int64 (partial sums stay below 2**58)
and reduces at the end; the fused path's 32-bit sums wrap, which leaves them exact modulo 2**32.

Two implementations give these values:

- **fused** (:mod:`probes.core.fused_summary`, Triton): CUDA tensors of bf16, f16, f32, f64 and float8 (e4m3fn,
  e5m2). Two kernel launches per tensor: one pass that reads it once, one program that adds the partial
  rows in a fixed order and writes the result (and a CUDA graph slot's generation counter). Per element
  float32 (float64 for float64 input), float64 across lanes and programs; a program whose largest finite
  |x| is outside [2**-40, 2**60] sums again in float64. Used when Triton imports; never during import of
  this module.
- **torch** (plain PyTorch, the fallback): everything else, and everything when Triton is missing. 16- and
  32-bit floats on CUDA are reduced with float32 accumulation in torch's tree reductions; other dtypes and
  everything on the CPU in float64, one chunk at a time. The non-finite count is the number of NaNs in
  ``x - x``. About 13 small kernels for a tensor of one chunk; temporaries are bounded by ``chunk``
  (about 9 bytes per element of one chunk).

Both run as device kernels with no host synchronisation, so they can be captured in a CUDA graph. A
non-contiguous input is first copied to a contiguous temporary (one more kernel).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from types import ModuleType
from typing import Literal

import torch

__all__ = [
    "CHECKSUM_BITS",
    "CHECKSUM_PERIOD",
    "SUMMARY_FIELDS",
    "SUMMARY_NBYTES",
    "describe",
    "fused",
    "prepare",
    "summarize",
    "summarize_many",
]

SUMMARY_FIELDS = ("norm", "absmax", "mean", "nonfinite", "checksum")
SUMMARY_NBYTES = 8 * len(SUMMARY_FIELDS)
CHECKSUM_BITS = 32
CHECKSUM_PERIOD = 1 << 16
_CHECKSUM_MASK = (1 << CHECKSUM_BITS) - 1
_NATIVE = (torch.float16, torch.bfloat16, torch.float32)

_weights_cache: dict[torch.device, torch.Tensor] = {}
_fused_module: list[ModuleType | None] = []  # [] until tried; [None] when Triton is missing
Backend = Literal["auto", "fused", "torch"]


def fused() -> ModuleType | None:
    """:mod:`probes.core.fused_summary`, imported on first use; ``None`` where Triton cannot be imported."""
    if not _fused_module:
        try:
            from . import fused_summary
        except ImportError:
            _fused_module.append(None)
        else:
            _fused_module.append(fused_summary)
    return _fused_module[0]


def _capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def _weights(device: torch.device) -> torch.Tensor:
    """int64 ``[1, 2, ..., 65536]`` on ``device``; cached, except while a CUDA graph is being captured
    (a tensor made during capture only gets its values when the graph replays)."""
    w = _weights_cache.get(device)
    if w is None:
        w = torch.arange(1, CHECKSUM_PERIOD + 1, dtype=torch.int64, device=device)
        if not _capturing(device):
            _weights_cache[device] = w
    return w


def prepare(device: torch.device | str) -> None:
    """Create this device's cached checksum weights now (call before CUDA graph capture)."""
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    if _capturing(dev):
        raise RuntimeError("probes.core.summary.prepare() must be called outside CUDA graph capture")
    _weights(dev)
    mod = fused() if dev.type == "cuda" else None
    if mod is not None:
        mod.warm_up(dev)  # compile now: not while a graph is being captured


def _words(flat: torch.Tensor) -> torch.Tensor:
    if flat.dtype == torch.bool:
        flat = flat.view(torch.uint8)
    return flat.view(torch.int8) if flat.element_size() == 1 else flat.view(torch.int16)


def _checksum(flat: torch.Tensor, chunk: int) -> torch.Tensor:
    """int64 0-dim tensor: the checksum of the module docstring. 4-5 kernels per chunk."""
    words = _words(flat)
    w = _weights(words.device)
    period = CHECKSUM_PERIOD
    step = period * max(1, min(chunk // period, 1 << 10))  # whole periods; partial sums stay < 2**57
    parts = []
    total = words.numel()
    for start in range(0, total, step):
        piece = words[start : start + step]
        m = piece.numel()
        rows = -(-m // period)
        if m < period:  # less than one period: weights 1..m
            wide = piece.to(torch.int64).mul_(w[:m])
        elif rows * period == m:
            wide = piece.view(rows, period).to(torch.int64).mul_(w)
        else:  # ragged: zero-pad to whole periods (zeros add nothing)
            wide = torch.zeros(rows, period, dtype=torch.int64, device=words.device)
            wide.view(-1)[:m].copy_(piece)
            wide.mul_(w)
        parts.append(wide.sum())
    acc = parts[0] if len(parts) == 1 else torch.stack(parts).bitwise_and_(_CHECKSUM_MASK).sum()
    return acc.bitwise_and_(_CHECKSUM_MASK)


def _reduce_input(c: torch.Tensor) -> tuple[torch.Tensor, torch.dtype]:
    """The tensor to reduce and the accumulation dtype (see the module docstring)."""
    if c.is_cuda and c.dtype in _NATIVE:
        return c, torch.float32
    if c.dtype == torch.float64:
        return c, torch.float64
    return c.to(torch.float64), torch.float64  # CPU, integers, bool, float8


def _chunk_stats(c: torch.Tensor, acc: torch.dtype, mean: bool) -> list[torch.Tensor]:
    """[norm, absmax, mean (or sum), nonfinite] as 0-dim ``acc`` tensors; 6 kernels."""
    centre = torch.mean(c, dtype=acc) if mean else torch.sum(c, dtype=acc)
    norm = torch.linalg.vector_norm(c, 2, dtype=acc)
    amax = torch.linalg.vector_norm(c, math.inf, dtype=acc)
    # x - x is 0 for every finite x and NaN for NaN and +-inf: count the NaNs as ones (exact below 2**24)
    nonfinite = torch.sub(c, c).nan_to_num_(nan=1.0).sum(dtype=acc)
    return [norm, amax, centre, nonfinite]


def _flat(t: torch.Tensor) -> torch.Tensor:
    """``t`` detached, complex as its real view, flattened and contiguous (a copy when it is not)."""
    x = t.detach()
    if x.is_complex():
        x = torch.view_as_real(x)
    flat = x.reshape(-1)
    return flat if flat.is_contiguous() else flat.contiguous()


def _fused_for(backend: Backend, on_cuda: bool) -> ModuleType | None:
    """The fused module if ``backend`` asks for it (``"auto"``: on CUDA only); Triton is imported only then."""
    mod = fused() if backend == "fused" or (backend == "auto" and on_cuda) else None
    if backend == "fused" and mod is None:
        raise RuntimeError("the fused summary needs Triton, which cannot be imported here")
    return mod


def summarize(
    t: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
    chunk: int = 1 << 24,
    counter: torch.Tensor | None = None,
    backend: Backend = "auto",
) -> torch.Tensor:
    """The 5-value float64 summary of ``t`` (layout in the module docstring), computed on ``t``'s device.

    ``out``: a float64 tensor of 5 elements on the same device to write into (a slot). ``counter``: an
    int64 one-element tensor to add 1 to after the summary is written (a CUDA graph slot's generation).
    ``backend``: ``"auto"`` (fused for CUDA float tensors where Triton imports, else torch), ``"fused"``
    (also on the CPU under ``TRITON_INTERPRET=1``; raises where Triton is missing) or ``"torch"``.
    Reads ``t`` only; never synchronises with the host.
    """
    flat = _flat(t)
    if out is None:
        out = torch.empty(len(SUMMARY_FIELDS), dtype=torch.float64, device=flat.device)
    elif out.dtype != torch.float64 or out.shape != (len(SUMMARY_FIELDS),) or out.device != flat.device:
        raise ValueError(f"summary out must be float64 [{len(SUMMARY_FIELDS)}] on {flat.device}")
    mod = _fused_for(backend, flat.is_cuda)
    if mod is not None and flat.dtype in mod.FUSED_DTYPES:
        mod.summarize_fused(flat, out, counter)
        return out
    _summarize_torch(flat, out, chunk)
    if counter is not None:
        counter.add_(1)
    return out


def summarize_many(
    tensors: list[torch.Tensor],
    *,
    out: torch.Tensor,
    rows: list[int] | None = None,
    chunk: int = 1 << 24,
    backend: Backend = "auto",
    host_buffer: Callable[[int], torch.Tensor] | None = None,
) -> torch.Tensor:
    """The summaries of ``tensors`` (all on ``out``'s device) into rows ``rows`` (default 0, 1, ...) of ``out``
    (float64 [k, 5]): the same bits as :func:`summarize` of each one alone.

    On CUDA with Triton the fused ones take a few launches for the whole list (one pass kernel per dtype, one
    finishing kernel), not two per tensor; the others go one by one. Reads the tensors only; never
    synchronises with the host. The tensors must not change before the kernels run on the current stream.
    ``host_buffer(nbytes)``: pinned memory for the fused path's table of work, kept by the caller until the
    kernels have run (default: torch's caching host allocator).
    """
    if out.dtype != torch.float64 or out.dim() != 2 or out.shape[1] != len(SUMMARY_FIELDS):
        raise ValueError(f"summary rows must be float64 [k, {len(SUMMARY_FIELDS)}]")
    rows = list(range(len(tensors))) if rows is None else rows
    mod = _fused_for(backend, out.is_cuda)
    batch: list[torch.Tensor] = []
    batch_rows: list[int] = []
    for t, row in zip(tensors, rows, strict=True):
        flat = _flat(t)
        if flat.device != out.device:
            raise ValueError(f"summary rows are on {out.device}, a tensor on {flat.device}")
        if mod is not None and flat.dtype in mod.FUSED_DTYPES:
            batch.append(flat)
            batch_rows.append(row)
        else:
            summarize(flat, out=out[row], chunk=chunk, backend="torch")
    if batch:
        assert mod is not None
        mod.summarize_many_fused(batch, out, batch_rows, host_buffer)
    return out


def _summarize_torch(flat: torch.Tensor, out: torch.Tensor, chunk: int) -> None:
    """The torch fallback: ``flat`` contiguous and 1-D; about 13 kernels for a tensor of one chunk."""
    n = flat.numel()
    if n == 0:
        out.zero_()
        out[2].fill_(math.nan)
        return
    chunk = max(1, min(chunk, 1 << 24))  # float32 counts of non-finite values stay exact
    checksum = _checksum(flat, chunk).double()
    if n <= chunk:
        c, acc = _reduce_input(flat)
        torch.stack([*_chunk_stats(c, acc, mean=True), checksum], out=out)
        return
    norms, maxes, sums, bad = [], [], [], []
    for start in range(0, n, chunk):
        c, acc = _reduce_input(flat[start : start + chunk])
        norm, amax, total, nonfinite = _chunk_stats(c, acc, mean=False)
        norms.append(norm)
        maxes.append(amax)
        sums.append(total)
        bad.append(nonfinite)
    norm = torch.stack(norms).double().square_().sum().sqrt_()
    amax = torch.stack(maxes).amax().double()
    mean = torch.stack(sums).double().sum().div_(n)
    nonfinite = torch.stack(bad).double().sum()
    torch.stack([norm, amax, mean, nonfinite, checksum], out=out)


def describe(summary: torch.Tensor) -> dict[str, float]:
    """A host summary tensor as ``{field: value}`` (synchronises if ``summary`` is on a device)."""
    values = summary.detach().to("cpu", torch.float64).tolist()
    return dict(zip(SUMMARY_FIELDS, values, strict=True))
