"""Every backend against float64 NumPy on the classes of pair the engine's benchmark times
(``benchmarks/engine_bench.py``: near-identical, drifting at 1e-2 and 5e-2, with NaN/Inf, bf16 against float32, and
the projection probe's partial-bf16 capture against its float64 reference), as a comparison measures them: rows of
7168 elements, the row blocks of ``floors._edges``. Three sizes: one row (the CPU's NumPy pass, at most
``small.NUMPY_MAX`` elements), and numba's pass on the calling thread and on its threads (``small.SMALL`` elements
and more)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from benchmarks.engine_bench import CLASSES
from tests.validator.numerics.test_backends import assert_block_sums, assert_blocks
from tests.validator.numerics.test_metrics import _assert_matches, _np_metrics
from validator.numerics import floors
from validator.numerics.backends import Totals
from validator.numerics.backends.cpu import cpu_totals
from validator.numerics.backends.reference import reference_totals
from validator.numerics.backends.small import NUMPY_MAX, SMALL, small_totals
from validator.numerics.metrics import metrics_from_totals

ATOL, RTOL = 1e-5, 1e-3
SHAPES = {"numpy": (1, 7168), "serial": (8, 7168), "parallel": (40, 7168)}
assert 7168 <= NUMPY_MAX < SHAPES["serial"][0] * 7168 <= SMALL < SHAPES["parallel"][0] * 7168
Backend = Callable[[torch.Tensor, torch.Tensor, list[int]], Totals]


def _cuda(a: torch.Tensor, b: torch.Tensor, edges: list[int]) -> Totals:
    from validator.numerics.backends.cuda import cuda_totals

    return cuda_totals(a, b, atol=ATOL, rtol=RTOL, chunk_elems=1 << 22, edges=edges)


BACKENDS: dict[str, tuple[str, Backend]] = {
    "reference": ("cpu", lambda a, b, e: reference_totals(a, b, ATOL, RTOL, 1 << 16, e)),
    "cpu": ("cpu", lambda a, b, e: cpu_totals(a, b, atol=ATOL, rtol=RTOL, edges=e)),
    "cpu-small": ("cpu", lambda a, b, e: small_totals(a, b, atol=ATOL, rtol=RTOL, edges=e)),
    "cuda": ("cuda", _cuda),
}


@pytest.mark.parametrize("backend", list(BACKENDS))
@pytest.mark.parametrize("size", list(SHAPES))
@pytest.mark.parametrize("cls", list(CLASSES))
def test_backend_matches_numpy_on_every_class(cls: str, size: str, backend: str) -> None:
    device, run = BACKENDS[backend]
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    shape = SHAPES[size]
    a, b = (t.view(shape) for t in CLASSES[cls](shape[0] * shape[1], device))
    edges = list(floors._edges(shape))
    totals = run(a, b, edges)
    a, b = a.cpu(), b.cpu()
    _assert_matches(metrics_from_totals(totals, a.dtype, b.dtype, ATOL, RTOL), _np_metrics(a, b, ATOL, RTOL))
    assert_blocks(totals, a, b, edges)


@pytest.mark.parametrize("cls", list(CLASSES))
def test_a_comparison_measures_every_class_as_numpy_does(cls: str) -> None:
    """``floors.measure_blocks``, the call a comparison makes (the backend chosen by where the pair is)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    shape = SHAPES["parallel"]
    a, b = (t.view(shape) for t in CLASSES[cls](shape[0] * shape[1], device))
    m, blocks = floors.measure_blocks(a, b)
    a, b = a.cpu(), b.cpu()
    _assert_matches(m, _np_metrics(a, b, ATOL, RTOL))
    nonfinite = (blocks.nan_a, blocks.nan_b, blocks.inf_matched)
    assert_block_sums(blocks.d2, blocks.a2, nonfinite, a, b, list(floors._edges(shape)))
