"""validator.kernels: the one-pass kernels print exactly what the streamed torch reference prints.

"Exactly" is the report's precision (4 significant digits, cosine with 6 decimals); counts, max_abs
and the ULP metrics are compared for equality, and the float sums to 1e-12 relative.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from validator import kernels
from validator.kernels import cpu as kcpu
from validator.metrics import TensorMetrics, compare_tensors

DTYPES = [torch.bfloat16, torch.float16, torch.float32, torch.float64, torch.float8_e4m3fn, torch.float8_e5m2]
FLOATS = ["norm_a", "norm_b", "rel_l2", "cosine", "max_abs", "mean_abs", "sqnr_db", "rel_diff", "pass_ratio"]
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

NATIVE = pytest.mark.skipif(
    kernels.backend_for(torch.zeros(1), torch.zeros(1)) != "cpu-native", reason="no C compiler: no CPU kernel here"
)


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def printed(m: TensorMetrics) -> dict[str, str]:
    """The report's formatting (validator.report.fmt_num: 4 significant digits; cosine: 6 decimals)."""
    from validator.report import fmt_num

    return {
        k: (f"{v:.6f}" if k == "cosine" and isinstance(v, float) and math.isfinite(v) else fmt_num(v))
        for k, v in m.to_dict().items()
    }


@pytest.fixture
def reference(monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    """compare_tensors as it was before the kernels: the streamed torch float64 reference."""

    def ref(a: torch.Tensor, b: torch.Tensor, **kw: object) -> TensorMetrics:
        with monkeypatch.context() as m:
            m.setenv("VALIDATOR_KERNELS", "0")
            return compare_tensors(a, b, **kw)  # type: ignore[arg-type]

    yield ref


def assert_same(fast: TensorMetrics, ref: TensorMetrics) -> None:
    assert printed(fast) == printed(ref)
    for f in (
        "numel",
        "nonfinite_a",
        "nonfinite_b",
        "nonfinite_mismatch",
        "max_ulp",
        "p99_ulp",
        "pass_ratio",
        "max_abs",
    ):
        assert getattr(fast, f) == getattr(ref, f), f
    for f in FLOATS:
        x, y = getattr(fast, f), getattr(ref, f)
        assert (math.isnan(x) and math.isnan(y)) or x == y or math.isclose(x, y, rel_tol=1e-12), (f, x, y)


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
    a[3], b[3] = math.nan, math.nan  # same kind: passes, not counted
    a[5], b[5] = math.inf, math.inf
    a[6], b[6] = -math.inf, math.inf  # mismatch
    b[8] = math.nan
    a[9] = -math.inf
    return a, b


# ---------------------------------------------------------------- CPU kernel against the reference


@NATIVE
def test_cpu_backend_is_used() -> None:
    a, b = pair(torch.bfloat16, 10)
    assert kernels.backend_for(a, b) == "cpu-native"
    assert kernels.backend_for(a.to(torch.int32), b.to(torch.int32)) == "reference"


@NATIVE
@pytest.mark.parametrize("dtype", DTYPES, ids=_name)
@pytest.mark.parametrize("n", [1, 7, 2048, 2049, 300_001])  # 300_001: several chunks on several threads
@NATIVE
def test_dtypes_match_reference(reference, dtype: torch.dtype, n: int) -> None:  # type: ignore[no-untyped-def]
    a, b = pair(dtype, n, seed=n)
    assert_same(compare_tensors(a, b), reference(a, b))


@NATIVE
@pytest.mark.parametrize("dtype", DTYPES, ids=_name)
@NATIVE
def test_nonfinite_match_reference(reference, dtype: torch.dtype) -> None:  # type: ignore[no-untyped-def]
    a, b = with_nonfinite(*pair(dtype, 5000, seed=3))
    fast = compare_tensors(a, b)
    assert fast.nonfinite_a > 0 and fast.nonfinite_mismatch > 0
    assert_same(fast, reference(a, b))


@NATIVE
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float8_e5m2], ids=_name)
@NATIVE
def test_forced_masked_path_equals_fast_path(dtype: torch.dtype) -> None:
    a, b = pair(dtype, 10_000, seed=4)
    kw = {"atol": 1e-5, "rtol": 1e-3, "chunk_elems": 1 << 22}
    fast = kcpu.compare_cpu(a, b, **kw)
    masked = kcpu.compare_cpu(a, b, force_masked=True, **kw)
    assert fast is not None and masked is not None
    assert_same(fast, masked)


@NATIVE
@pytest.mark.parametrize(
    ("da", "db"),
    [(torch.float64, torch.bfloat16), (torch.bfloat16, torch.float32), (torch.float16, torch.float8_e4m3fn),
     (torch.float8_e5m2, torch.float64)],
    ids=lambda d: _name(d),
)  # fmt: skip
@NATIVE
def test_mixed_dtypes_match_reference(reference, da: torch.dtype, db: torch.dtype) -> None:  # type: ignore[no-untyped-def]
    a, b = pair(torch.float64, 3001, seed=5)
    a, b = a.to(da), b.to(db)
    fast = compare_tensors(a, b)
    assert fast.max_ulp is None
    assert_same(fast, reference(a, b))


@NATIVE
def test_tolerance_boundary_rounds_like_the_reference(reference) -> None:  # type: ignore[no-untyped-def]
    # |b - a| == atol + rtol*|a| exactly for some elements: a fused multiply-add would decide differently
    a = torch.tensor([1.0, 3.0, 0.1, 7.0, 1e-3], dtype=torch.float64)
    atol, rtol = 1e-5, 1e-3
    b = a + (atol + rtol * a.abs())
    fast, ref = compare_tensors(a, b, atol=atol, rtol=rtol), reference(a, b, atol=atol, rtol=rtol)
    assert fast.pass_ratio == ref.pass_ratio
    b2 = torch.nextafter(b, torch.full_like(b, math.inf))
    assert compare_tensors(a, b2, atol=atol, rtol=rtol).pass_ratio == reference(a, b2, atol=atol, rtol=rtol).pass_ratio


@NATIVE
@pytest.mark.parametrize(
    "case",
    ["zeros", "identical", "opposite", "a_zero", "b_zero", "all_nan", "huge_f64", "subnormal_f32"],
)
@NATIVE
def test_edge_cases_match_reference(reference, case: str) -> None:  # type: ignore[no-untyped-def]
    a, b = pair(torch.float32, 513, seed=6)
    if case == "zeros":
        a, b = torch.zeros(513), torch.zeros(513)
    elif case == "identical":
        b = a.clone()
    elif case == "opposite":
        b = -a
    elif case == "a_zero":
        a = torch.zeros_like(a)
    elif case == "b_zero":
        b = torch.zeros_like(b)
    elif case == "all_nan":
        a, b = torch.full((513,), math.nan), torch.full((513,), math.nan)
    elif case == "huge_f64":  # squares overflow float64: the reference gives inf sums, so must we
        a, b = a.double() * 1e160, b.double() * 1e160
    elif case == "subnormal_f32":
        a, b = a * 1e-41, b * 1e-41
    assert_same(compare_tensors(a, b), reference(a, b))


@NATIVE
@pytest.mark.parametrize("shape", [(0,), (3, 0), ()])
@NATIVE
def test_empty_and_scalar(reference, shape: tuple[int, ...]) -> None:  # type: ignore[no-untyped-def]
    a, b = torch.ones(shape, dtype=torch.bfloat16), torch.full(shape, 2.0, dtype=torch.bfloat16)
    assert_same(compare_tensors(a, b), reference(a, b))


@NATIVE
@pytest.mark.parametrize("chunk", [1, 13, 1 << 22])
@NATIVE
def test_non_contiguous(reference, chunk: int) -> None:  # type: ignore[no-untyped-def]
    a, b = pair(torch.bfloat16, 6 * 7 * 9, seed=7)
    at, bt = a.view(6, 7, 9).permute(2, 0, 1), b.view(6, 7, 9)[:, ::2].contiguous()
    assert not at.is_contiguous()
    assert_same(compare_tensors(at, b.view(6, 7, 9).permute(2, 0, 1), chunk_elems=chunk),
                reference(at.contiguous(), b.view(6, 7, 9).permute(2, 0, 1).contiguous()))  # fmt: skip
    assert_same(compare_tensors(a.view(6, 7, 9)[:, ::2], bt, chunk_elems=chunk),
                reference(a.view(6, 7, 9)[:, ::2].contiguous(), bt))  # fmt: skip


@NATIVE
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn], ids=_name)
@NATIVE
def test_wide_ulp_spread_exact(reference, dtype: torch.dtype) -> None:  # type: ignore[no-untyped-def]
    # sign flips and large scalings push the p99 into the tail bins (and, for float32, past 2**16)
    a, b = pair(dtype, 20_000, seed=8, noise=0.05)
    b[:300] = (-a[:300].double()).to(dtype)
    b[300:600] = (a[300:600].double() * 37).to(dtype)
    fast, ref = compare_tensors(a, b), reference(a, b)
    assert (fast.max_ulp, fast.p99_ulp) == (ref.max_ulp, ref.p99_ulp)
    assert_same(fast, ref)


@NATIVE
def test_float32_p99_beyond_fine_histogram_uses_second_pass(reference) -> None:  # type: ignore[no-untyped-def]
    a, b = pair(torch.float32, 400_000, seed=9)
    b[:8000] = -a[:8000]
    fast, ref = compare_tensors(a, b), reference(a, b)
    assert ref.p99_ulp is not None and ref.p99_ulp >= 1 << 16
    assert (fast.max_ulp, fast.p99_ulp) == (ref.max_ulp, ref.p99_ulp)


@NATIVE
def test_thread_count_does_not_change_results() -> None:
    a, b = pair(torch.bfloat16, 3_000_000, seed=10)
    try:
        kcpu.set_threads(1)
        one = compare_tensors(a, b)
        kcpu.set_threads(3)
        three = compare_tensors(a, b)
    finally:
        kcpu.set_threads(None)
    assert_same(three, one)


@NATIVE
def test_memory_mapped_safetensors_are_read_in_place(tmp_path: Path, reference) -> None:  # type: ignore[no-untyped-def]
    from safetensors.torch import save_file

    from validator.tensorfile import SafetensorsFile

    a, b = pair(torch.bfloat16, 50_000, seed=11)
    save_file({"a": a, "b": b}, str(tmp_path / "x.safetensors"))
    f = SafetensorsFile(tmp_path / "x.safetensors")
    ta, tb = f.load("a"), f.load("b")
    assert_same(compare_tensors(ta, tb), reference(a, b))


def test_disabled_by_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VALIDATOR_KERNELS", "0")
    assert kernels.backend_for(torch.zeros(2), torch.zeros(2)) == "reference"
    assert kernels.compare_fast(torch.zeros(2), torch.zeros(2), atol=0, rtol=0, chunk_elems=4) is None


# ---------------------------------------------------------------- parallel pairs, streaming ingest


@NATIVE
def test_compare_runs_parallel_keeps_order(tmp_path: Path) -> None:
    from probes import BundleWriter
    from validator.compare import compare_runs
    from validator.sources import open_path

    g = torch.Generator().manual_seed(0)
    for name, noise in (("a", 0.0), ("b", 0.01)):
        with BundleWriter(tmp_path / name, run_name=name) as w:
            for i in range(40):
                x = torch.randn(300, generator=torch.Generator().manual_seed(i))
                w.add(f"t{i:02d}", (x + noise * torch.randn(300, generator=g)).to(torch.bfloat16), step=0)
    va, vb = open_path(tmp_path / "a"), open_path(tmp_path / "b")
    try:
        kcpu.set_threads(1)
        serial = compare_runs(va, vb).to_dict()
        kcpu.set_threads(4)
        parallel = compare_runs(va, vb).to_dict()
    finally:
        kcpu.set_threads(None)
    assert parallel == serial
    assert [p["name"] for p in parallel["pairs"]] == [p["name"] for p in serial["pairs"]]


def test_streamed_bytes_equal_tensor_bytes(tmp_path: Path) -> None:
    from probes import BundleWriter
    from probes.bundle import tensor_bytes
    from validator.sources import open_path

    with BundleWriter(tmp_path / "r", run_name="r") as w:
        w.add("x", torch.randn(1000).to(torch.bfloat16), step=0)
        w.add("y", torch.randn(7, 3), step=0)
    for ref in open_path(tmp_path / "r").tensors:
        assert ref.location is not None
        streamed = b"".join(bytes(c) for c in ref.byte_chunks())
        assert streamed == bytes(tensor_bytes(ref.load()))


# ---------------------------------------------------------------- CUDA (on a GPU machine)


@CUDA
@pytest.mark.parametrize("dtype", DTYPES, ids=_name)
@pytest.mark.parametrize("n", [1, 2049, 1_000_003])
def test_cuda_matches_reference(reference, dtype: torch.dtype, n: int) -> None:  # type: ignore[no-untyped-def]
    a, b = pair(dtype, n, seed=n)
    if n > 100:
        a, b = with_nonfinite(a, b) if n == 2049 else (a, b)
    assert kernels.backend_for(a.cuda(), b.cuda()) == "cuda-triton"
    ref = reference(a, b)
    assert_same(compare_tensors(a.cuda(), b.cuda()), ref)
    assert_same(compare_tensors(a.cuda(), b), ref)  # b's pieces are copied over


@CUDA
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=_name)
def test_cuda_wide_spread_and_mixed(reference, dtype: torch.dtype) -> None:  # type: ignore[no-untyped-def]
    a, b = pair(dtype, 300_000, seed=12, noise=0.05)
    b[:6000] = (-a[:6000].double()).to(dtype)
    assert_same(compare_tensors(a.cuda(), b.cuda()), reference(a, b))
    assert_same(compare_tensors(a.cuda(), b.cuda().double()), reference(a, b.double()))
    at = a.cuda().view(600, 500).t()
    assert_same(compare_tensors(at, b.cuda().view(600, 500).t(), chunk_elems=777),
                reference(a.view(600, 500).t().contiguous(), b.view(600, 500).t().contiguous()))  # fmt: skip


@pytest.mark.skipif(
    os.environ.get("VALIDATOR_TEST_TRITON_INTERPRET") != "1", reason="set VALIDATOR_TEST_TRITON_INTERPRET=1"
)
@pytest.mark.parametrize("dtype", DTYPES, ids=_name)
def test_triton_kernel_in_interpreter(reference, dtype: torch.dtype) -> None:  # type: ignore[no-untyped-def]
    # TRITON_INTERPRET=1 must be set before triton is imported: run this test in its own process
    from validator.kernels import cuda as kc

    saved = dict(kc.CONFIG)
    kc.CONFIG.update(BLOCK=64, NSMALL=8, NCOPY=2)
    try:
        cases = [pair(dtype, 1000, seed=13)]
        if dtype != torch.float8_e4m3fn:  # the interpreter decodes its NaN as 480 (the GPU does not)
            cases.append(with_nonfinite(*pair(dtype, 1000, seed=14)))
        for a, b in cases:
            b[20:60] = (-a[20:60].double()).to(dtype)
            with warnings.catch_warnings():  # the interpreter's NumPy arithmetic warns on inf - inf
                warnings.simplefilter("ignore", RuntimeWarning)
                fast = kc._compare_on(a, b, torch.device("cpu"), atol=1e-5, rtol=1e-3, chunk_elems=1 << 22)
            assert_same(fast, reference(a, b))
    finally:
        kc.CONFIG.clear()
        kc.CONFIG.update(saved)


def test_tolerances_come_back_as_floats(reference) -> None:  # type: ignore[no-untyped-def]
    # integer tolerances are accepted; the result carries them as floats on every path
    a, b = pair(torch.bfloat16, 3000, seed=31)
    fast = compare_tensors(a, b, atol=0, rtol=1)
    ref = reference(a, b, atol=0, rtol=1)
    assert (fast.atol, fast.rtol) == (ref.atol, ref.rtol) == (0.0, 1.0)
    assert all(isinstance(x, float) for x in (fast.atol, fast.rtol, ref.atol, ref.rtol))
