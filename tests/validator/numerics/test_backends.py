"""validator.numerics.backends: every backend against float64 NumPy, at the engine's stated accuracy.

Backends: the float64 reference, the CPU backend (numba) on contiguous inputs and on strided views
(copied in pieces), its NumPy pass for small pairs (``small.py``) on both, the Triton backend on a GPU (where there is one) and the same Triton kernels run
by Triton's interpreter on the CPU (in a subprocess, which sets ``TRITON_INTERPRET=1`` before Triton
is imported).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.triton_interpreter import interpreted
from tests.validator.numerics.test_metrics import _assert_matches, _np_metrics
from validator.numerics import backends as kernels
from validator.numerics.backends import Totals, cpu
from validator.numerics.backends.cpu import cpu_totals
from validator.numerics.backends.reference import reference_totals
from validator.numerics.backends.small import small_totals
from validator.numerics.metrics import TensorMetrics, compare_tensors, metrics_from_totals

DTYPES = [torch.bfloat16, torch.float16, torch.float32, torch.float64, torch.float8_e4m3fn, torch.float8_e5m2]
ULP_DTYPES = DTYPES[:3] + DTYPES[4:]
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
Case = tuple[torch.Tensor, torch.Tensor, float, float]


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def pair(dtype: torch.dtype, n: int, seed: int = 0, noise: float = 0.01) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(n, generator=g, dtype=torch.float64) * 3
    b = a * (1 + noise * torch.randn(n, generator=g, dtype=torch.float64)) + 1e-3 * torch.randn(
        n, generator=g, dtype=torch.float64
    )
    return a.to(dtype), b.to(dtype)


def with_nonfinite(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    a, b = a.clone(), b.clone()
    if a.dtype == torch.float8_e4m3fn:  # no infinities in this format
        a[3], b[3], b[8], a[9], b[9] = math.nan, math.nan, math.nan, math.nan, 1.0
        return a, b
    a[3], b[3] = math.nan, math.nan  # same kind: passes, not a mismatch
    a[5], b[5] = math.inf, math.inf
    a[6], b[6] = -math.inf, math.inf  # mismatch
    b[8] = math.nan
    a[9] = -math.inf
    return a, b


def cases() -> dict[str, Case]:
    """Pairs every backend must get right: all dtypes, NaN/Inf, zero norms, empty, views, wide spreads."""
    out: dict[str, Case] = {}
    for dt in DTYPES:
        out[f"plain-{_name(dt)}"] = (*pair(dt, 9001, seed=1), 1e-5, 1e-3)
        out[f"nonfinite-{_name(dt)}"] = (*with_nonfinite(*pair(dt, 5000, seed=2)), 1e-3, 1e-2)
    for dt in ULP_DTYPES:  # sign flips and large scalings: wide ULP distances, exponents far apart
        a, b = pair(dt, 20_000, seed=3, noise=0.05)
        b[:300] = (-a[:300].double()).to(dt)
        b[300:600] = (a[300:600].double() * 37).to(dt)
        out[f"spread-{_name(dt)}"] = (a, b, 1e-5, 1e-3)
    for dt in (torch.bfloat16, torch.float8_e5m2):  # ULP distances 0, 1 and 2 only
        g = torch.Generator().manual_seed(14)
        a = (torch.rand(9001, generator=g) + 0.5).to(dt)
        step = torch.randint(0, 3, (9001,), generator=g).to(torch.int16 if dt == torch.bfloat16 else torch.int8)
        out[f"close-{_name(dt)}"] = (a, (a.view(step.dtype) + step).view(dt), 1e-5, 1e-3)
    for dt in (torch.float16, torch.bfloat16):  # one value repeated: each float32 sum rounds the same way every step
        a = torch.full((3 * 2048 + 700,), 1.39453125, dtype=dt)
        out[f"repeated-{_name(dt)}"] = (a, (a.double() * 1.01).to(dt), 1e-5, 1e-3)
    a, b = pair(torch.float32, 4000, seed=4)
    b[:80] = -a[:80]
    out["p99-beyond-2**16-float32"] = (a, b, 1e-5, 1e-3)
    x = pair(torch.float32, 513, seed=5)[0]
    z = torch.zeros(513)
    out["zeros"] = (z, z, 1e-5, 1e-3)
    out["a-zero"] = (z, x, 1e-5, 1e-3)
    out["b-zero"] = (x, z, 1e-5, 1e-3)
    out["identical"] = (x, x.clone(), 1e-5, 1e-3)
    out["opposite"] = (x, -x, 1e-5, 1e-3)
    out["all-nan"] = (torch.full((513,), math.nan), torch.full((513,), math.nan), 1e-5, 1e-3)
    a, b = pair(torch.bfloat16, 5000, seed=7)  # NaN/Inf in one lane of several tiles
    a[::5], b[::5], b[1::50], a[2::100], b[2::100] = math.nan, math.nan, math.inf, -math.inf, -math.inf
    out["many-nonfinite-bfloat16"] = (a, b, 1e-5, 1e-3)
    for dt in (torch.float32, torch.float16, torch.float64):  # masked logits: NaN/Inf in every row, a short row last
        a, b = pair(dt, 3 * 2048 + 700, seed=19)
        g = torch.Generator().manual_seed(19)
        masked = torch.rand(a.numel(), generator=g) < 0.3
        a[masked], b[masked] = -math.inf, -math.inf  # the same infinity: passes
        a[1::97], b[2::89], b[5::211] = math.nan, math.inf, math.nan  # NaN in a, +Inf in b, NaN in b
        out[f"masked-rows-{_name(dt)}"] = (a, b, 1e-5, 1e-3)
    out["empty"] = (torch.empty(0, dtype=torch.bfloat16), torch.empty(0, dtype=torch.bfloat16), 1e-5, 1e-3)
    out["scalar"] = (torch.tensor(2.0), torch.tensor(2.5), 1e-5, 1e-3)
    a, b = pair(torch.float64, 700, seed=6)
    out["huge-float64"] = (a * 1e160, b * 1e160, 1e-5, 1e-3)  # squares overflow: inf sums, like the reference
    out["large-float32"] = (a.float() * 1e25, b.float() * 1e25, 1e-5, 1e-3)  # squares past float32
    out["subnormal-float32"] = (a.float() * 1e-41, b.float() * 1e-41, 0.0, 1e-3)
    out["tiny-float32"] = (a.float() * 1e-25, b.float() * 1e-25, 0.0, 1e-3)
    out["mixed-float64-bfloat16"] = (a, b.to(torch.bfloat16), 1e-5, 1e-3)
    out["mixed-bfloat16-float32"] = (a.to(torch.bfloat16), b.float(), 1e-5, 1e-3)
    out["mixed-float8-float16"] = (a.to(torch.float8_e5m2), b.half(), 1e-5, 1e-3)
    v = torch.tensor([1.0, 3.0, 0.1, 7.0, 1e-3], dtype=torch.float64)
    # float32 |b - a| ties at 2**20 (2**10) where the exact differences do not: the exact max_abs needs float64
    for dt, big, tiny in ((torch.bfloat16, 2.0**20, 2.0**-6), (torch.float16, 2.0**10, 2.0**-16)):
        a, b = pair(dt, 4096, seed=8)
        a[7], b[7], a[100], b[100] = big, -tiny, big, -2 * tiny
        out[f"inexact-differences-{_name(dt)}"] = (a, b, 1e-5, 1e-3)
    a, b = pair(torch.float32, 4096, seed=8)  # float32 |b - a| ties at 2**24; exactly 2**24 + 0.25, + 0.5, + 0.375
    a[7], b[7], a[100], b[100], a[2000], b[2000] = 2.0**24, -0.25, 2.0**24, -0.5, -(2.0**24), 0.375
    out["inexact-differences-float32"] = (a, b, 1e-5, 1e-3)
    out["tolerance-boundary"] = (v, v + (1e-5 + 1e-3 * v.abs()), 1e-5, 1e-3)  # |d| == atol + rtol|a| exactly
    # float32 |d| within a few float32 steps of atol + rtol |a|, atol or rtol the larger part: inside the float32
    # band around the tolerances and just outside it, where float32 alone must decide as float64 does
    g = torch.Generator().manual_seed(20)
    n = 9001
    a = 10 ** (torch.rand(n, generator=g, dtype=torch.float64) * 5 - 6) * (torch.rand(n, generator=g) - 0.5).sign()
    a = a.float()
    side = (torch.rand(n, generator=g) - 0.5).sign().double()
    b = (a.double() + side * (1e-5 + 1e-3 * a.double().abs())).float()
    steps = torch.randint(-12, 13, (n,), generator=g, dtype=torch.int32)
    out["tolerance-band-float32"] = (a, (b.view(torch.int32) + steps).view(torch.float32), 1e-5, 1e-3)
    out["zero-tolerances"] = (v, v.clone(), 0.0, 0.0)
    # relu-like, atol 0: half the elements 0 on both sides, some equal, some past rtol (large enough for numba)
    a, b = pair(torch.bfloat16, 20_000, seed=18, noise=2e-3)
    a, b = a.clamp(min=0), torch.where(a > 0, b, 0.0).to(torch.bfloat16)
    b[::7] = a[::7]
    out["relu-zero-atol"] = (a, b, 0.0, 1e-3)
    a, b = pair(torch.bfloat16, 3000, seed=17)
    out["rtol-past-the-band"] = (a, b, 1e-5, 2.0**21)  # the tolerance test counted in float64
    out["atol-past-the-band"] = (a.float(), b.float(), 1e31, 0.0)
    a, b = pair(torch.bfloat16, 6 * 70 * 90, seed=7)
    out["non-contiguous"] = (a.view(6, 70, 90).permute(2, 0, 1), b.view(6, 70, 90)[:, ::1].transpose(0, 2).transpose(1, 2), 1e-5, 1e-3)
    return out


def strided(t: torch.Tensor) -> torch.Tensor:
    """The same values as a 1-D view with stride 2 (not contiguous for more than one element)."""
    raw = t.reshape(-1).view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])
    return torch.stack([raw, raw], 1)[:, 0].view(t.dtype)


def edges(n: int) -> list[int]:
    """Uneven blocks, one of them empty, for the per-block sums; on multiples of 16 elements from 16 Ki
    elements (the spread cases: the Triton pass's whole-vector path)."""
    step = 16 if n >= 1 << 14 else 1
    return [0, n // 7 // step * step, n // 7 // step * step, n // 3 // step * step, n]


def assert_blocks(t: Totals, a: torch.Tensor, b: torch.Tensor, at: list[int]) -> None:
    """Totals.block_d2 / block_a2 and Totals.nonfinite: :func:`assert_block_sums`."""
    assert_block_sums(t.block_d2, t.block_a2, t.nonfinite, a, b, at)


def assert_block_sums(block_d2: Sequence[float], block_a2: Sequence[float], nonfinite: tuple[int, int, int],
                      a: torch.Tensor, b: torch.Tensor, at: list[int]) -> None:  # fmt: skip
    """Each block's d² and a² (blocks at[i] .. at[i+1]) against float64 NumPy over the positions finite in both,
    and the NaN in a, in b and the same infinity in both."""
    x, y = a.double().reshape(-1).numpy(), b.double().reshape(-1).numpy()
    with np.errstate(invalid="ignore"):
        same_inf = int(np.count_nonzero(np.isinf(x) & (x == y)))
    assert tuple(nonfinite) == (int(np.isnan(x).sum()), int(np.isnan(y).sum()), same_inf), nonfinite
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = np.where(ok, x, 0.0), np.where(ok, y, 0.0)
    with np.errstate(over="ignore"):
        d2 = [float(np.sum((y[lo:hi] - x[lo:hi]) ** 2)) for lo, hi in zip(at, at[1:])]
        a2 = [float(np.sum(x[lo:hi] ** 2)) for lo, hi in zip(at, at[1:])]
    rel = 1e-12 if torch.float64 in (a.dtype, b.dtype) else 1e-6
    assert np.allclose(block_d2, d2, rtol=rel, atol=0) and np.allclose(block_a2, a2, rtol=rel, atol=0)


CASES = cases()
Backend = Callable[[torch.Tensor, torch.Tensor, float, float], Totals]
BACKENDS: dict[str, Backend] = {
    "reference": lambda a, b, atol, rtol: reference_totals(a, b, atol, rtol, 1000, edges(a.numel())),
    "cpu": lambda a, b, atol, rtol: cpu_totals(a, b, atol=atol, rtol=rtol, edges=edges(a.numel())),
    # not contiguous: copied in pieces of chunk_elems, each piece its own pass
    "cpu-strided": lambda a, b, atol, rtol: cpu_totals(
        strided(a), strided(b), atol=atol, rtol=rtol, chunk_elems=1000, edges=edges(a.numel())
    ),
    # the NumPy float64 pass (pairs up to small.NUMPY_MAX elements; here every case, whatever its size)
    "cpu-small": lambda a, b, atol, rtol: small_totals(a, b, atol=atol, rtol=rtol, edges=edges(a.numel())),
    "cpu-small-strided": lambda a, b, atol, rtol: small_totals(
        strided(a), strided(b), atol=atol, rtol=rtol, edges=edges(a.numel())
    ),
}


def _metrics(t: Totals, a: torch.Tensor, b: torch.Tensor, atol: float, rtol: float) -> TensorMetrics:
    return metrics_from_totals(t, a.dtype, b.dtype, atol, rtol)


@pytest.mark.parametrize("backend", list(BACKENDS))
@pytest.mark.parametrize("case", list(CASES))
def test_backend_matches_numpy(backend: str, case: str) -> None:
    a, b, atol, rtol = CASES[case]
    t = BACKENDS[backend](a, b, atol, rtol)
    _assert_matches(_metrics(t, a, b, atol, rtol), _np_metrics(a, b, atol, rtol))
    assert_blocks(t, a, b, edges(a.numel()))


@pytest.mark.parametrize("case", ["plain-bfloat16", "nonfinite-float32", "spread-float16", "non-contiguous"])
def test_reference_is_float64_exact(case: str) -> None:
    # the definition itself: every sum to float64 summation order
    a, b, atol, rtol = CASES[case]
    m, ref = _metrics(BACKENDS["reference"](a, b, atol, rtol), a, b, atol, rtol), _np_metrics(a, b, atol, rtol)
    for name in ["norm_a", "norm_b", "rel_l2", "mean_abs"]:
        assert math.isclose(getattr(m, name), ref[name], rel_tol=1e-12), name


def test_routing() -> None:
    a, b = pair(torch.bfloat16, 10)
    assert kernels.backend_for(a, b) == "cpu"
    assert kernels.backend_for(a.double(), b) == "cpu"
    assert kernels.backend_for(a.to(torch.float8_e5m2), b.to(torch.float8_e5m2)) == "cpu"
    assert kernels.backend_for(a.to(torch.int32), b.to(torch.int32)) == "reference"
    m = compare_tensors(a.to(torch.int32), b.to(torch.int32))  # integers: the reference
    assert m.max_ulp is None and m.numel == 10


def test_repeats_and_call_order_give_identical_bits() -> None:
    a, b = with_nonfinite(*pair(torch.bfloat16, 300_001, seed=8))
    first = compare_tensors(a, b).to_dict()
    reference_totals(a, b, 1e-5, 1e-3, 1 << 22)  # another backend in between changes nothing
    assert [compare_tensors(a, b).to_dict() for _ in range(3)] == [first] * 3


def with_threads(n: int, fn: Callable[[], object]) -> object:
    """fn() with torch using n threads."""
    saved = torch.get_num_threads()
    try:
        torch.set_num_threads(n)
        return fn()
    finally:
        torch.set_num_threads(saved)


def with_cpu_threads(n: int, fn: Callable[[], object]) -> object:
    """fn() with the CPU backend's kernels on n threads."""
    saved = cpu.threads()
    try:
        cpu.set_threads(n)
        return fn()
    finally:
        cpu.set_threads(saved)


def large_pairs() -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Pairs spanning many blocks and groups of the CPU pass: every dtype, NaN/Inf, wide ULP spreads."""
    out = []
    for i, dt in enumerate(DTYPES):
        a, b = with_nonfinite(*pair(dt, 1_000_003, seed=20 + i, noise=0.02))
        if dt != torch.float64:
            b[5000:7000] = (a[5000:7000].double() * -3).to(dt)
        out.append((a, b))
    return out


def test_thread_count_does_not_change_results() -> None:
    a, b = pair(torch.float16, 1_000_003, seed=9)
    assert with_threads(1, lambda: compare_tensors(a, b).to_dict()) == with_threads(3, lambda: compare_tensors(a, b).to_dict())


def test_cpu_bitwise_equal_across_thread_counts() -> None:
    for a, b in large_pairs():
        one = with_cpu_threads(1, lambda: compare_tensors(a, b).to_dict())
        for n in (2, 2, 5):  # (5: as many as numba has, NUMBA_NUM_THREADS)
            assert with_cpu_threads(n, lambda: compare_tensors(a, b).to_dict()) == one, (a.dtype, n)


def test_cpu_agrees_with_torch_float64_reference() -> None:
    # the float64 torch reference: sums within the stated accuracy, counts, max_abs and ULP exact
    for a, b in large_pairs():
        got, ref = cpu_totals(a, b, atol=1e-5, rtol=1e-3), reference_totals(a, b, 1e-5, 1e-3, 1 << 20)
        assert (got.counts, got.max_abs, got.max_ulp) == (ref.counts, ref.max_abs, ref.max_ulp), a.dtype
        for x, y in zip(got.sums, ref.sums):
            assert math.isclose(x, y, rel_tol=1e-6, abs_tol=1e-300), (a.dtype, got.sums, ref.sums)
        _assert_matches(_metrics(got, a, b, 1e-5, 1e-3), _np_metrics(a, b, 1e-5, 1e-3))


SHORT = [1, 31, 32, 255, 256, 257, 1000, 2047, 2048, 2049, 5000]  # row lengths around the vector width, SHORT_SPAN and ROW


@pytest.mark.parametrize("dtype", DTYPES, ids=_name)
def test_cpu_blocks_of_every_length_match_numpy(dtype: torch.dtype) -> None:
    # blocks cut short by edges are read in pieces, the last padded with zeros: every length against float64
    # NumPy (sums, counts, max_abs, ULP and per-block sums), and batched the same as alone, bit for bit
    at = [0, *np.cumsum(SHORT).tolist()]
    a, b = with_nonfinite(*pair(dtype, at[-1], seed=31))
    a[at[4] : at[5]] = 0  # a whole block of zeros in a: float64's way, with the others in float32
    for atol, rtol in ((1e-5, 1e-3), (0.0, 0.0), (0.05, 0.0)):
        t = cpu_totals(a, b, atol=atol, rtol=rtol, edges=at)
        _assert_matches(_metrics(t, a, b, atol, rtol), _np_metrics(a, b, atol, rtol))
        assert_blocks(t, a, b, at)
        assert cpu.cpu_totals_many([(a, b, at), (b, a, ())], atol=atol, rtol=rtol)[0] == t


def test_cpu_mixed_pair_in_pieces_is_the_whole_pair() -> None:
    # a contiguous pair of two formats is converted in pieces that start where the whole pair's rows start:
    # any chunk size gives the bits of the pair in one piece
    a, b = with_nonfinite(*pair(torch.float32, 70_001, seed=41))
    b, at = b.to(torch.bfloat16), [0, 20_000, 20_007, 70_001]
    whole = cpu_totals(a, b, atol=1e-5, rtol=1e-3, edges=at)
    for chunk in (999, 2048, 5000):
        assert cpu_totals(a, b, atol=1e-5, rtol=1e-3, edges=at, chunk_elems=chunk) == whole


def test_cpu_pairs_from_several_threads_at_once() -> None:
    from concurrent.futures import ThreadPoolExecutor

    pairs = [pair(torch.bfloat16, 300_000 + i, seed=30 + i) for i in range(6)]
    alone = [compare_tensors(a, b).to_dict() for a, b in pairs]
    with ThreadPoolExecutor(3) as ex:
        assert list(ex.map(lambda p: compare_tensors(*p).to_dict(), pairs)) == alone


@pytest.mark.parametrize("case", list(CASES))
def test_p99_on_request_matches_numpy(case: str) -> None:
    # the opt-in exact p99 (numerics.p99.p99_ulp), in pieces of any size, against NumPy's nearest rank
    a, b, atol, rtol = CASES[case]
    ref = _np_metrics(a, b, atol, rtol)
    for chunk in (1000, 1 << 22):
        m = compare_tensors(a, b, atol=atol, rtol=rtol, chunk_elems=chunk, p99=True)
        assert (m.max_ulp, m.p99_ulp) == (ref["max_ulp"], ref["p99_ulp"]), (chunk, m.p99_ulp, ref["p99_ulp"])


def boundary_pairs() -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Pairs with many elements on, or next to, |b - a| == 1e-5 + 1e-3 |a| after rounding."""
    out = []
    for dt in (torch.float32, torch.bfloat16):
        a = torch.randn(50_000, generator=torch.Generator().manual_seed(10)).to(dt)
        t = 1e-5 + 1e-3 * a.double().abs()
        for b in (a.double() + t, torch.nextafter(a.double() + t, torch.tensor(math.inf, dtype=torch.float64))):
            out.append((a, b.to(dt)))
    return out


def test_tolerance_boundary_passes_like_float64() -> None:
    for a, b in boundary_pairs():
        expected = reference_totals(a, b, 1e-5, 1e-3, 1 << 22).counts
        assert cpu_totals(a, b, atol=1e-5, rtol=1e-3).counts == expected
        # rtol past 2**20: every block counted in float64
        assert cpu_totals(a, b, atol=1e-5, rtol=2.0**21).counts == reference_totals(a, b, 1e-5, 2.0**21, 1 << 22).counts


def test_zero_atol_counts_exact_zeros_like_float64() -> None:
    # atol 0: the float32 band's low atol is below 0, and an exact 0 difference still passes
    a, b, _, _ = CASES["relu-zero-atol"]
    for rtol in (0.0, 1e-3):
        assert cpu_totals(a, b, atol=0.0, rtol=rtol).counts == reference_totals(a, b, 0.0, rtol, 1 << 22).counts


def test_memory_mapped_safetensors_are_read_in_place(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    from validator.runs.tensorfile import SafetensorsFile

    a, b = pair(torch.bfloat16, 50_000, seed=11)
    save_file({"a": a, "b": b}, str(tmp_path / "x.safetensors"))
    f = SafetensorsFile(tmp_path / "x.safetensors")
    _assert_matches(compare_tensors(f.load("a"), f.load("b")), _np_metrics(a, b, 1e-5, 1e-3))


def test_compare_runs_in_parallel_keeps_order(tmp_path: Path) -> None:
    from probes import BundleWriter
    from validator.judging.compare import compare_runs
    from validator.runs.sources import open_path

    g = torch.Generator().manual_seed(0)
    for name, noise in (("a", 0.0), ("b", 0.01)):
        with BundleWriter(tmp_path / name, run_name=name) as w:
            for i in range(40):
                x = torch.randn(300, generator=torch.Generator().manual_seed(i))
                w.add(f"t{i:02d}", (x + noise * torch.randn(300, generator=g)).to(torch.bfloat16), step=0)
    va, vb = open_path(tmp_path / "a"), open_path(tmp_path / "b")
    assert with_threads(4, lambda: compare_runs(va, vb).to_dict()) == with_threads(1, lambda: compare_runs(va, vb).to_dict())


def test_streamed_bytes_equal_tensor_bytes(tmp_path: Path) -> None:
    from probes import BundleWriter
    from probes.core.bundle import tensor_bytes
    from validator.runs.sources import open_path

    with BundleWriter(tmp_path / "r", run_name="r") as w:
        w.add("x", torch.randn(1000).to(torch.bfloat16), step=0)
        w.add("y", torch.randn(7, 3), step=0)
    for ref in open_path(tmp_path / "r").tensors:
        assert ref.location is not None
        streamed = b"".join(bytes(c) for c in ref.byte_chunks())
        assert streamed == bytes(tensor_bytes(ref.load()))


# ---------------------------------------------------------------- the Triton backend


def _interpreter_main(config: str = "default") -> None:
    """Run under Triton's interpreter: the Triton backend on every case, as JSON lines. ``config``:

    - ``"small"``: tiny programs (more blocks than programs, several rows per fix program, a float64 flush after
      every tile) on the SMALL_PROGRAM_CASES, with many uneven blocks (the non-contiguous one in pieces of 3,001
      elements: a launch each);
    - ``"segments"``: the same cases and blocks with up to 64 programs of one tile at least, so that a block
      holds several rows (K > 1), whose last row to finish adds the block's sums, in one piece and in many.
    """
    import warnings

    from validator.numerics.backends import cuda

    warnings.simplefilter("ignore")  # the interpreter's NumPy arithmetic warns on inf - inf
    names, at, chunk = list(CASES), edges, 777
    if config == "small":
        cuda.PROGRAMS, cuda.FIX_ROWS, cuda.FLUSH, cuda.MIN_TILES = 4, 3, 1, 1
    if config == "segments":
        cuda.PROGRAMS, cuda.FIX_ROWS, cuda.MIN_TILES = 64, 3, 1
    if config != "default":
        names, at, chunk = SMALL_PROGRAM_CASES, many_edges, 3001
    for name in names:
        a, b, atol, rtol = CASES[name]
        t = cuda.cuda_totals(a, b, atol=atol, rtol=rtol, chunk_elems=chunk, edges=at(a.numel()))
        print(json.dumps({"case": name, "metrics": _metrics(t, a, b, atol, rtol).to_dict(), "blocks": [t.block_d2, t.block_a2],
                          "nonfinite": t.nonfinite}))  # fmt: skip


SMALL_PROGRAM_CASES = ["plain-bfloat16", "relu-zero-atol", "nonfinite-float16", "many-nonfinite-bfloat16", "spread-float32", "close-bfloat16", "inexact-differences-bfloat16", "non-contiguous"]


def many_edges(n: int) -> list[int]:
    """Eleven uneven blocks, one empty."""
    return sorted({0, n, *(n * i * i // 100 for i in range(1, 10)), n // 2})


def _check_interpreted(config: str, names: list[str], at: Callable[[int], list[int]]) -> None:
    pytest.importorskip("triton")
    rows = {r["case"]: r for r in interpreted(f"from tests.validator.numerics.test_backends import _interpreter_main; _interpreter_main({config!r})")}
    assert set(rows) == set(names)
    for name in names:
        a, b, atol, rtol = CASES[name]
        _assert_matches(TensorMetrics.from_dict(rows[name]["metrics"]), _np_metrics(a, b, atol, rtol))
        d2, a2 = rows[name]["blocks"]
        nonfinite = tuple(rows[name]["nonfinite"])
        assert_blocks(Totals(0, (0.0,) * 5, 0.0, (0,) * 5, None, tuple(d2), tuple(a2), nonfinite), a, b, at(a.numel()))  # type: ignore[arg-type]


def test_triton_kernels_in_interpreter() -> None:
    _check_interpreted("default", list(CASES), edges)


def test_triton_kernels_in_interpreter_with_small_programs() -> None:
    _check_interpreted("small", SMALL_PROGRAM_CASES, many_edges)


def test_triton_kernels_in_interpreter_with_several_rows_a_block() -> None:
    _check_interpreted("segments", SMALL_PROGRAM_CASES, many_edges)


@CUDA
@pytest.mark.parametrize("case", list(CASES))
def test_cuda_matches_numpy(case: str) -> None:
    a, b, atol, rtol = CASES[case]
    assert kernels.backend_for(a.cuda(), b.cuda()) == "cuda"
    expected = _np_metrics(a, b, atol, rtol)
    _assert_matches(compare_tensors(a.cuda(), b.cuda(), atol=atol, rtol=rtol), expected)
    _assert_matches(compare_tensors(a.cuda(), b, atol=atol, rtol=rtol, chunk_elems=999), expected)  # b copied over
    for b_side, chunk in ((b.cuda(), 1 << 22), (b, 999)):
        t = kernels.totals_of(a.cuda(), b_side, atol=atol, rtol=rtol, chunk_elems=chunk, edges=edges(a.numel()))
        assert_blocks(t, a, b, edges(a.numel()))


@CUDA
@pytest.mark.parametrize("dtype", DTYPES, ids=_name)
def test_cuda_large_pairs_repeat_bitwise_and_agree_with_cpu(dtype: torch.dtype) -> None:
    a, b = with_nonfinite(*pair(dtype, 3_000_017, seed=12))
    on_gpu = [compare_tensors(a.cuda(), b.cuda()).to_dict() for _ in range(3)]
    assert on_gpu[1:] == on_gpu[:1] * 2
    _assert_matches(TensorMetrics.from_dict(on_gpu[0]), _np_metrics(a, b, 1e-5, 1e-3))
    _assert_matches(compare_tensors(a, b), _np_metrics(a, b, 1e-5, 1e-3))


@CUDA
def test_cuda_tolerance_boundary_passes_like_float64() -> None:
    for a, b in boundary_pairs():
        got = kernels.totals_of(a.cuda(), b.cuda(), atol=1e-5, rtol=1e-3, chunk_elems=1 << 22)
        assert got.counts == reference_totals(a, b, 1e-5, 1e-3, 1 << 22).counts


@CUDA
def test_cuda_zero_atol_counts_exact_zeros_like_float64() -> None:
    a, b, _, _ = CASES["relu-zero-atol"]
    for rtol in (0.0, 1e-3):
        got = kernels.totals_of(a.cuda(), b.cuda(), atol=0.0, rtol=rtol, chunk_elems=1 << 22)
        assert got.counts == reference_totals(a, b, 0.0, rtol, 1 << 22).counts


@CUDA
def test_cuda_large_close_pair() -> None:
    a, b, atol, rtol = CASES["close-bfloat16"]
    a, b = a.repeat(400), b.repeat(400)
    _assert_matches(compare_tensors(a.cuda(), b.cuda(), p99=True), _np_metrics(a, b, 1e-5, 1e-3))


@CUDA
@pytest.mark.parametrize("case", ["spread-bfloat16", "spread-float32", "nonfinite-float8_e4m3fn", "p99-beyond-2**16-float32"])
def test_cuda_p99_on_request(case: str) -> None:
    a, b, atol, rtol = CASES[case]
    m = compare_tensors(a.cuda(), b.cuda(), atol=atol, rtol=rtol, p99=True)
    assert m.p99_ulp == _np_metrics(a, b, atol, rtol)["p99_ulp"]


@CUDA
@pytest.mark.parametrize("aligned", [True, False], ids=["aligned", "unaligned"])
def test_cuda_many_blocks_and_pieces(aligned: bool) -> None:
    # 97 uneven blocks over thousands of programs; the same pair in pieces (b copied over): one sum order
    a, b = with_nonfinite(*pair(torch.bfloat16, 4_000_000 + (0 if aligned else 3), seed=15))
    n, step = a.numel(), 16 if aligned else 1
    at = sorted({0, n, *((n * i // 97) // step * step for i in range(1, 97))})
    got = [kernels.totals_of(a.cuda(), b.cuda(), atol=1e-5, rtol=1e-3, chunk_elems=1 << 22, edges=at) for _ in range(10)]
    assert all(t == got[0] for t in got)
    assert_blocks(got[0], a, b, at)
    _assert_matches(_metrics(got[0], a, b, 1e-5, 1e-3), _np_metrics(a, b, 1e-5, 1e-3))
    pieces = kernels.totals_of(a.cuda(), b, atol=1e-5, rtol=1e-3, chunk_elems=999_999, edges=at)
    assert_blocks(pieces, a, b, at)
    assert (pieces.counts, pieces.max_abs, pieces.max_ulp) == (got[0].counts, got[0].max_abs, got[0].max_ulp)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.float8_e5m2], ids=_name)
def test_exact_ulp_bounds_the_float32_difference(dtype: torch.dtype) -> None:
    """Within ``common.exact_ulp`` ULPs, float32's b - a is the exact difference: every finite pair for the
    float8 types; for the 16-bit types every finite b against 64 values of a spread over the exponents, and a
    million random pairs near the bound."""
    from validator.numerics.backends.common import ULP_DTYPES, exact_ulp
    from validator.numerics.p99 import ulp_distance

    int_dtype = ULP_DTYPES[dtype][0]
    every = torch.arange(1 << (8 * dtype.itemsize), dtype=torch.int32).to(int_dtype).view(dtype)
    every = every[torch.isfinite(every.float())]
    if dtype.itemsize == 1:
        a, b = every.repeat_interleave(every.numel()), every.repeat(every.numel())
    else:
        g = torch.Generator().manual_seed(16)
        picks = every[torch.randint(0, every.numel(), (64,), generator=g)]
        a, b = picks.repeat_interleave(every.numel()), every.repeat(64)
        # pairs a little inside the bound: a random, b that many ULPs away
        x = every[torch.randint(0, every.numel(), (1 << 20,), generator=g)]
        step = exact_ulp(dtype) - torch.randint(0, 64, (1 << 20,), generator=g)
        y = (x.view(int_dtype).to(torch.int32) + step).clamp(-(1 << 15), (1 << 15) - 1).to(int_dtype).view(dtype)
        keep = torch.isfinite(y.float())
        a, b = torch.cat([a, x[keep]]), torch.cat([b, y[keep]])
    near = ulp_distance(a, b, ULP_DTYPES[dtype]) <= exact_ulp(dtype)
    assert near.sum() > 0
    d32 = (b.float() - a.float()).double()
    d64 = b.double() - a.double()
    assert torch.equal(d32[near], d64[near])
