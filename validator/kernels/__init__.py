"""One-pass comparison kernels: every field of :class:`~validator.metrics.TensorMetrics` from a single
read of both tensors, with float64 accumulation and exact ULP histograms.

:func:`validator.metrics.compare_tensors` routes through :func:`compare_fast` first and falls back
to its streamed torch reference where no kernel applies (integer/bool inputs, MPS, no C compiler,
CUDA without Triton). The results are those of the reference: every count, ``max_abs`` and the ULP
metrics are identical, and the sums differ only in float64 summation order (about 1e-15 relative,
the same freedom the reference's own ``chunk_elems`` has).

- CPU (``cpu.py``): a C kernel (``_cpu_kernel.c``, built at first use with the system compiler and
  cached) run by one thread per core over chunks of the flat tensors, views of memory-mapped
  safetensors included, so nothing is copied.
- CUDA (``cuda.py``): large contiguous same-dtype pairs take the CUDA C engine (``_cuda_kernel.cu``,
  built by NVRTC: a sampled p99 window, then one main pass; one host sync), the others fused Triton
  kernels. A pair like one the CUDA C engine compared before is launched by :func:`start_lane` before
  ``compare_tensors`` checks its inputs.

Environment: ``VALIDATOR_KERNELS=0`` disables both (reference only), ``VALIDATOR_NATIVE=0`` only the
CPU kernel, ``VALIDATOR_THREADS`` sets the CPU threads, ``VALIDATOR_KERNEL_CACHE`` the build folder.
"""

from __future__ import annotations

import functools
import os
from types import ModuleType
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from ..metrics import TensorMetrics

__all__ = ["compare_fast", "backend_for", "info", "start_lane"]


@functools.cache
def _cuda() -> ModuleType:
    """validator.kernels.cuda, imported once (an import statement per call costs on a GPU's short calls)."""
    from . import cuda

    return cuda


def _enabled() -> bool:
    return os.environ.get("VALIDATOR_KERNELS", "1") != "0"


def backend_for(a: torch.Tensor, b: torch.Tensor) -> str:
    """Which path ``compare_tensors(a, b)`` takes: ``"cpu-native"``, ``"cuda-c"`` (the NVRTC-built CUDA C
    engine), ``"cuda-triton"`` or ``"reference"``."""
    from .. import metrics

    if not _enabled():
        return "reference"
    device = metrics._compute_device(a, b)
    if device.type == "cuda":
        from . import cuda

        return cuda.engine_for(a, b, device) if cuda.supports(a, b, device) else "reference"
    if device.type == "cpu":
        from . import cpu
        from ._native import library

        return "cpu-native" if cpu.supports(a, b) and library() is not None else "reference"
    return "reference"


def compare_fast(
    a: torch.Tensor, b: torch.Tensor, *, atol: float, rtol: float, chunk_elems: int
) -> TensorMetrics | None:
    """The metrics through a one-pass kernel, or ``None`` where none applies (inputs already checked)."""
    if not _enabled():
        return None
    from .. import metrics

    device = metrics._compute_device(a, b)
    if device.type == "cuda":
        got: TensorMetrics | None = _cuda().compare_cuda(a, b, device, atol=atol, rtol=rtol, chunk_elems=chunk_elems)
        return got
    if device.type == "cpu":
        from . import cpu

        return cpu.compare_cpu(a, b, atol=atol, rtol=rtol, chunk_elems=chunk_elems)
    return None


def start_lane(a: object, b: object, atol: object, rtol: object) -> Any:
    """A comparison launched on the CUDA C engine for a pair like one it ran before (unchecked inputs:
    ``cuda.lane_start`` checks what the kernels rely on), or ``None``. See ``metrics.compare_tensors``."""
    if not _enabled():
        return None
    return _cuda().lane_start(a, b, atol, rtol)


def info() -> dict[str, Any]:
    """What is available here (for benchmarks and bug reports)."""
    from . import cpu
    from ._native import build_error, library

    out: dict[str, Any] = {
        "enabled": _enabled(),
        "cpu_native": library() is not None,
        "cpu_native_error": build_error(),
        "cpu_threads": cpu.threads(),
        "cuda": torch.cuda.is_available(),
    }
    if torch.cuda.is_available():
        from . import cuda

        out["triton"] = cuda.available()
        out["cuda_config"] = dict(cuda.CONFIG)
    return out
