"""On-device summary statistics of a captured tensor (summary mode).

``summarize(t)`` returns a float64 tensor of 5 values on ``t``'s device, in this order
(:data:`SUMMARY_FIELDS`)::

    [0] norm       L2 norm of all elements
    [1] absmax     largest absolute value
    [2] mean       arithmetic mean of all elements
    [3] nonfinite  number of NaN and +-inf elements
    [4] checksum   position-weighted sum of the raw bit patterns, mod 2**48 (see below)

norm, absmax and mean follow IEEE arithmetic over every element: one NaN makes all three NaN, an inf
makes norm and absmax inf; ``nonfinite`` says how many there were. On CUDA, 16- and 32-bit floats are
reduced with float32 accumulation in tree reductions (bf16/f16 are widened inside the reduction kernels,
without a widened copy of the tensor; relative error about 1e-6 or less); everything else, and everything
on the CPU (whose float32 reductions are less accurate), is widened to float64 one chunk at a time. Complex tensors are
summarised as their real view (``torch.view_as_real``). An empty tensor gives ``[0, 0, nan, 0, 0]``.

Checksum. The tensor's bytes (row-major, little-endian, as stored in a bundle) are read as signed 16-bit
words (signed 8-bit words for 1-byte dtypes); word ``i`` is weighted by ``(i mod 65521) + 1`` and the
weighted words are summed in int64, reduced mod 2**48 (exact in the float64 result)::

    checksum = sum_i word_i * ((i mod 65521) + 1)  mod 2**48

Integer addition is associative, so the value does not depend on the reduction order, chunking or device:
identical bytes give identical checksums everywhere. The position weights make it sensitive to swapped
elements or rows (a plain sum of bit patterns is not). Any change of one element changes it; it is a
checksum, not a cryptographic hash. Every partial sum stays below 2**58, so nothing overflows.

Everything runs as device kernels with no host synchronisation, so it can be captured in a CUDA graph.
The work is chunked (``chunk`` elements for the statistics, the nearest whole number of 65521-word periods
for the checksum) so that temporaries stay bounded: about 9 bytes per element of one chunk, ~150 MB at
the default 2**24; a non-contiguous input is first copied to a contiguous temporary.
"""

from __future__ import annotations

import math

import torch

__all__ = [
    "CHECKSUM_BITS",
    "CHECKSUM_PERIOD",
    "SUMMARY_FIELDS",
    "SUMMARY_NBYTES",
    "describe",
    "summarize",
]

SUMMARY_FIELDS = ("norm", "absmax", "mean", "nonfinite", "checksum")
SUMMARY_NBYTES = 8 * len(SUMMARY_FIELDS)
CHECKSUM_BITS = 48
CHECKSUM_PERIOD = 65521  # largest prime below 2**16
_CHECKSUM_MASK = (1 << CHECKSUM_BITS) - 1
_NATIVE = (torch.float16, torch.bfloat16, torch.float32)

_weights_cache: dict[torch.device, torch.Tensor] = {}


def _capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def _weights(device: torch.device) -> torch.Tensor:
    """int64 ``[1, 2, ..., 65521]`` on ``device``; cached, except while a CUDA graph is being captured
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
        raise RuntimeError("probes.summary.prepare() must be called outside CUDA graph capture")
    _weights(dev)


def _words(flat: torch.Tensor) -> torch.Tensor:
    if flat.dtype == torch.bool:
        flat = flat.view(torch.uint8)
    return flat.view(torch.int8) if flat.element_size() == 1 else flat.view(torch.int16)


def _checksum(flat: torch.Tensor, chunk: int) -> torch.Tensor:
    words = _words(flat)
    w = _weights(words.device)
    period = CHECKSUM_PERIOD
    step = period * max(1, min(chunk // period, 1 << 10))  # whole periods; partial sums stay < 2**57
    parts = []
    total = words.numel()
    for start in range(0, total, step):
        chunk = words[start : start + step]
        m = chunk.numel()
        whole = (m // period) * period
        if whole:
            wide = chunk[:whole].view(-1, period).to(torch.int64)
            wide.mul_(w)
            parts.append(wide.sum())
        if m > whole:
            tail = chunk[whole:].to(torch.int64)
            tail.mul_(w[: m - whole])
            parts.append(tail.sum())
    if len(parts) == 1:
        return parts[0].bitwise_and(_CHECKSUM_MASK)
    if len(parts) == 2:
        return (parts[0] + parts[1]).bitwise_and_(_CHECKSUM_MASK)
    return torch.stack(parts).bitwise_and_(_CHECKSUM_MASK).sum().bitwise_and_(_CHECKSUM_MASK)


def _stats(flat: torch.Tensor, chunk: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(norm, absmax, sum, nonfinite) as 0-dim tensors: float64, float64, float64, int64."""
    floating = flat.is_floating_point()  # integers and bool are always finite
    norms, maxes, sums, finite = [], [], [], []
    n = flat.numel()
    for start in range(0, n, chunk):
        c = flat[start : start + chunk]
        if c.dtype in _NATIVE and c.is_cuda:
            acc = torch.float32
        elif c.dtype == torch.float64:
            acc = torch.float64
        else:  # CPU, integers, bool, float8: widen this chunk to float64
            c = c.to(torch.float64)
            acc = torch.float64
        sums.append(torch.sum(c, dtype=acc))
        norms.append(torch.linalg.vector_norm(c, 2, dtype=acc))
        maxes.append(torch.linalg.vector_norm(c, math.inf, dtype=acc))
        if floating:
            finite.append(torch.isfinite(c).sum())
    if len(sums) == 1:
        norm, amax, total = norms[0].double(), maxes[0].double(), sums[0].double()
    else:
        norm = torch.stack(norms).double().square_().sum().sqrt_()
        amax = torch.stack(maxes).amax().double()
        total = torch.stack(sums).double().sum()
    if finite:
        nonfinite = n - (finite[0] if len(finite) == 1 else torch.stack(finite).sum())
    else:
        nonfinite = torch.zeros((), dtype=torch.int64, device=flat.device)
    return norm, amax, total, nonfinite


def summarize(t: torch.Tensor, *, out: torch.Tensor | None = None, chunk: int = 1 << 24) -> torch.Tensor:
    """The 5-value float64 summary of ``t`` (layout in the module docstring), computed on ``t``'s device.

    ``out``: a float64 tensor of 5 elements on the same device to write into (a CUDA graph slot).
    Reads ``t`` only; never synchronises with the host.
    """
    x = t.detach()
    if x.is_complex():
        x = torch.view_as_real(x)
    if out is None:
        out = torch.empty(len(SUMMARY_FIELDS), dtype=torch.float64, device=x.device)
    elif out.dtype != torch.float64 or out.shape != (len(SUMMARY_FIELDS),) or out.device != x.device:
        raise ValueError(f"summary out must be float64 [{len(SUMMARY_FIELDS)}] on {x.device}")
    n = x.numel()
    if n == 0:
        out.zero_()
        out[2].fill_(math.nan)
        return out
    flat = x.reshape(-1)  # a contiguous copy when x is not contiguous
    if not flat.is_contiguous():
        flat = flat.contiguous()
    norm, amax, total, nonfinite = _stats(flat, max(1, chunk))
    checksum = _checksum(flat, max(1, chunk))
    torch.stack([norm, amax, total / n, nonfinite.double(), checksum.double()], out=out)
    return out


def describe(summary: torch.Tensor) -> dict[str, float]:
    """A host summary tensor as ``{field: value}`` (synchronises if ``summary`` is on a device)."""
    values = summary.detach().to("cpu", torch.float64).tolist()
    return dict(zip(SUMMARY_FIELDS, values, strict=True))
