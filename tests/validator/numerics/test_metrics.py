"""validator.numerics.metrics against independent NumPy float64 computations."""

from __future__ import annotations

import functools
import json
import math
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from validator.numerics.metrics import MetricInputError, TensorMetrics, compare_tensors, measure_many

DTYPES = [torch.bfloat16, torch.float16, torch.float32, torch.float64, torch.float8_e4m3fn, torch.float8_e5m2]
ULP_DTYPES = [torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn, torch.float8_e5m2]
# NumPy twins used to enumerate every representable value of the narrow types.
NP_TWIN: dict[torch.dtype, Any] = {
    torch.bfloat16: ml_dtypes.bfloat16,
    torch.float16: np.float16,
    torch.float8_e4m3fn: ml_dtypes.float8_e4m3fn,
    torch.float8_e5m2: ml_dtypes.float8_e5m2,
}
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

# ---------------------------------------------------------------- independent NumPy reference


def _f64(t: torch.Tensor) -> np.ndarray:
    return t.detach().to(torch.float64).cpu().numpy().reshape(-1)


@functools.cache
def _value_table(np_dtype: Any) -> np.ndarray:
    """All finite values of an 8/16-bit float type, sorted, with -0 and +0 merged."""
    width = np.dtype(np_dtype).itemsize
    patterns = np.arange(1 << (8 * width), dtype=np.uint8 if width == 1 else np.uint16)
    with np.errstate(invalid="ignore"):  # NaN patterns
        values = patterns.view(np_dtype).astype(np.float64)
    table: np.ndarray = np.unique(values[np.isfinite(values)])
    return table


def _np_ulp(a: torch.Tensor, b: torch.Tensor) -> np.ndarray:
    """ULP distance, computed without the module's ordinal mapping.

    8/16-bit types: the number of representable finite values stepped over (looked up in a table
    of every value). float32: sign-magnitude bit arithmetic.
    """
    x, y = _f64(a), _f64(b)
    if a.dtype == torch.float32:  # sign-magnitude: same sign -> |mx-my|, else mx+my
        bx = x.astype(np.float32).view(np.uint32).astype(np.int64)
        by = y.astype(np.float32).view(np.uint32).astype(np.int64)
        mx, my = bx & 0x7FFFFFFF, by & 0x7FFFFFFF
        same_sign = ((bx >> 31) == (by >> 31)) | (mx == 0) | (my == 0)
        return np.where(same_sign, np.abs(mx - my), mx + my)
    table = _value_table(NP_TWIN[a.dtype])
    steps: np.ndarray = np.abs(np.searchsorted(table, x) - np.searchsorted(table, y))
    return steps


def _np_metrics(a: torch.Tensor, b: torch.Tensor, atol: float, rtol: float) -> dict[str, Any]:
    with np.errstate(over="ignore", invalid="ignore"):  # squares past float64's range: inf, like the engine
        return _np_metrics_f64(a, b, atol, rtol)


def _np_metrics_f64(a: torch.Tensor, b: torch.Tensor, atol: float, rtol: float) -> dict[str, Any]:
    x_all, y_all = _f64(a), _f64(b)
    fin = np.isfinite(x_all) & np.isfinite(y_all)
    x, y = x_all[fin], y_all[fin]
    na, nb = float(np.sqrt(np.sum(x * x))), float(np.sqrt(np.sum(y * y)))
    nd = float(np.sqrt(np.sum((y - x) ** 2)))
    dot = float(np.sum(x * y))
    rel_l2 = nd / na if na else (0.0 if nd == 0 else math.inf)
    with np.errstate(divide="ignore"):
        sqnr = float(-20 * np.log10(np.float64(rel_l2))) if rel_l2 else math.inf

    def kind(v: np.ndarray) -> np.ndarray:
        return np.select([np.isnan(v), v == np.inf, v == -np.inf], [1, 2, 3], 0)

    out: dict[str, Any] = {
        "numel": x_all.size,
        "norm_a": na,
        "norm_b": nb,
        "rel_l2": rel_l2,
        "cosine": 1.0 if na == nb == 0 else (math.nan if na * nb == 0 else _clamped(dot / (na * nb))),
        "max_abs": float(np.max(np.abs(y - x))) if x.size else 0.0,
        "mean_abs": float(np.mean(np.abs(y - x))) if x.size else 0.0,
        "sqnr_db": sqnr,
        "rel_diff": 1 - 2 * dot / (na**2 + nb**2) if na or nb else 0.0,  # SGLang's formula, literally
        "pass_ratio": float(np.mean(np.isclose(y_all, x_all, rtol=rtol, atol=atol, equal_nan=True)))
        if x_all.size
        else 1.0,
        "nonfinite_a": int(np.count_nonzero(~np.isfinite(x_all))),
        "nonfinite_b": int(np.count_nonzero(~np.isfinite(y_all))),
        "nonfinite_mismatch": int(np.count_nonzero(kind(x_all) != kind(y_all))),
        "max_ulp": None,
        "p99_ulp": None,
    }
    if a.dtype == b.dtype and a.dtype in ULP_DTYPES:
        d = _np_ulp(a, b)[fin]
        out["max_ulp"] = int(d.max()) if d.size else 0
        out["p99_ulp"] = int(np.percentile(d, 99, method="inverted_cdf")) if d.size else 0  # nearest rank
    return out


def _clamped(cosine: float) -> float:
    """A cosine clamped to [-1, 1] as the engine's is (NaN kept): dot / (na * nb) can round past 1."""
    return cosine if math.isnan(cosine) else min(1.0, max(-1.0, cosine))


def _same(x: float, y: float, rel: float = 1e-9, abs_: float = 0.0) -> bool:
    if math.isnan(x) or math.isnan(y):
        return math.isnan(x) and math.isnan(y)
    return x == y or math.isclose(x, y, rel_tol=rel, abs_tol=abs_)


def _assert_matches(m: TensorMetrics, ref: dict[str, Any]) -> None:
    """The engine's stated accuracy (docs/performance.md) against float64 NumPy: norms, rel_l2 and
    mean_abs within 1e-6 relative; 1 - cosine within 1e-3 relative where rel_l2 >= 1e-5; max_abs,
    the pass ratio, the counts and the ULP metrics exact (the p99 where it was asked for)."""
    for name in ["norm_a", "norm_b", "rel_l2", "mean_abs"]:
        assert _same(getattr(m, name), ref[name], rel=1e-6), (name, getattr(m, name), ref[name])
    # sqnr_db = -20 log10(rel_l2) passes through 0 at rel_l2 = 1: relative error is meaningless there
    assert _same(m.sqnr_db, ref["sqnr_db"], rel=1e-6, abs_=1e-5), (m.sqnr_db, ref["sqnr_db"])
    # the literal SGLang formula cancels catastrophically near 0; ours is exact algebra of it
    assert _same(m.rel_diff, ref["rel_diff"], rel=3e-6, abs_=1e-12), (m.rel_diff, ref["rel_diff"])
    if math.isnan(ref["cosine"]) or ref["rel_l2"] < 1e-5:
        assert _same(m.cosine, ref["cosine"], abs_=1e-9), (m.cosine, ref["cosine"])
    else:  # plus float32 rounding of |d|² / (|a||b|), which only shows where d is parallel to a
        floor = 1e-6 * ref["rel_l2"] ** 2 * ref["norm_a"] / ref["norm_b"]
        assert _same(1 - m.cosine, 1 - ref["cosine"], rel=1e-3, abs_=floor), (m.cosine, ref["cosine"])
    for name in ["numel", "max_abs", "pass_ratio", "nonfinite_a", "nonfinite_b", "nonfinite_mismatch", "max_ulp"]:
        assert getattr(m, name) == ref[name], (name, getattr(m, name), ref[name])
    assert m.p99_ulp is None or m.p99_ulp == ref["p99_ulp"], (m.p99_ulp, ref["p99_ulp"])


def _pair(dtype: torch.dtype, n: int = 4099, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(n, generator=g, dtype=torch.float64) * 3
    b = a * (1 + 0.01 * torch.randn(n, generator=g, dtype=torch.float64)) + 1e-3 * torch.randn(
        n, generator=g, dtype=torch.float64
    )
    return a.to(dtype), b.to(dtype)


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


# ---------------------------------------------------------------- every metric vs NumPy


@pytest.mark.parametrize("dtype", DTYPES, ids=_name)
def test_all_metrics_match_numpy(dtype: torch.dtype) -> None:
    a, b = _pair(dtype)
    m = compare_tensors(a, b, atol=1e-3, rtol=1e-2, chunk_elems=1000)
    _assert_matches(m, _np_metrics(a, b, 1e-3, 1e-2))
    assert (m.dtype_a, m.dtype_b, m.atol, m.rtol) == (_name(dtype), _name(dtype), 1e-3, 1e-2)
    assert 0.0 < m.pass_ratio < 1.0 or dtype in (torch.float8_e4m3fn, torch.float8_e5m2)
    assert (m.max_ulp is None) == (dtype == torch.float64)


@pytest.mark.parametrize("dtype", DTYPES, ids=_name)
def test_identical_inputs(dtype: torch.dtype) -> None:
    a, _ = _pair(dtype, n=300)
    m = compare_tensors(a, a.clone())
    assert (m.rel_l2, m.max_abs, m.mean_abs, m.rel_diff, m.pass_ratio) == (0.0, 0.0, 0.0, 0.0, 1.0)
    assert m.sqnr_db == math.inf and _same(m.cosine, 1.0, rel=1e-15)
    assert m.max_ulp in (None, 0) and m.p99_ulp in (None, 0)


def test_mixed_dtypes_bf16_vs_fp64_reference() -> None:
    ref, cand = _pair(torch.float64)
    cand16 = cand.to(torch.bfloat16)
    m = compare_tensors(ref, cand16, chunk_elems=512)
    _assert_matches(m, _np_metrics(ref, cand16, 1e-5, 1e-3))
    assert (m.dtype_a, m.dtype_b) == ("float64", "bfloat16")
    assert m.max_ulp is None and m.p99_ulp is None


def test_integer_and_bool_inputs_are_upcast() -> None:
    a = torch.arange(-5, 5, dtype=torch.int32)
    b = a.to(torch.float32) + 0.5
    _assert_matches(compare_tensors(a, b), _np_metrics(a, b, 1e-5, 1e-3))
    flags = torch.tensor([True, False, True])
    m = compare_tensors(flags, flags.to(torch.float16))
    assert m.rel_l2 == 0.0 and m.dtype_a == "bool" and m.max_ulp is None


def test_sums_are_float64_not_input_precision() -> None:
    # |a|^2 = 2**48 + 1, which float32 cannot hold (it rounds to 2**48)
    a = torch.tensor([2.0**24, 1.0], dtype=torch.float32)
    m = compare_tensors(a, torch.zeros_like(a))
    assert m.norm_a == math.sqrt(2.0**48 + 1) != 2.0**24
    assert m.mean_abs == (2.0**24 + 1) / 2


# ---------------------------------------------------------------- edges


def test_zero_norm_reference_and_candidate() -> None:
    z = torch.zeros(5)
    m = compare_tensors(z, z)
    assert (m.rel_l2, m.cosine, m.rel_diff, m.sqnr_db, m.pass_ratio) == (0.0, 1.0, 0.0, math.inf, 1.0)


def test_zero_norm_reference_only() -> None:
    z, x = torch.zeros(4), torch.tensor([1.0, -2.0, 0.0, 3.0])
    m = compare_tensors(z, x)
    assert m.rel_l2 == math.inf and m.sqnr_db == -math.inf and math.isnan(m.cosine)
    assert m.rel_diff == 1.0 and m.max_abs == 3.0 and m.pass_ratio == 0.25
    _assert_matches(m, _np_metrics(z, x, 1e-5, 1e-3))


def test_zero_norm_candidate_only() -> None:
    x, z = torch.tensor([1.0, -2.0]), torch.zeros(2)
    m = compare_tensors(x, z)
    assert m.rel_l2 == 1.0 and m.sqnr_db == 0.0 and math.isnan(m.cosine) and m.rel_diff == 1.0


def test_opposite_vectors() -> None:
    x = torch.tensor([1.0, -2.0, 3.0], dtype=torch.float64)
    m = compare_tensors(x, -x)
    assert _same(m.cosine, -1.0, rel=1e-15) and _same(m.rel_l2, 2.0, rel=1e-15) and m.rel_diff == 2.0


NAN, INF = math.nan, math.inf
NONFINITE_CASES = {
    "nan_in_a": ([NAN, 1.0, 2.0, 3.0], [1.0, 1.0, 2.0, 3.5]),
    "inf_in_b": ([1.0, 1.0, 2.0, 3.0], [1.0, INF, 2.0, 3.5]),
    "nan_both_same_pos": ([1.0, NAN, 2.0, 3.0], [1.5, NAN, 2.0, 3.0]),
    "inf_both_same_pos": ([1.0, -INF, 2.0, 3.0], [1.5, -INF, 2.0, 3.0]),
    "nan_both_diff_pos": ([NAN, 1.0, 2.0, 3.0], [1.0, 1.0, NAN, 3.0]),
    "nan_vs_inf": ([1.0, NAN, 2.0, 3.0], [1.0, INF, 2.0, 3.0]),
    "pinf_vs_ninf": ([1.0, INF, 2.0, 3.0], [1.0, -INF, 2.0, 3.0]),
    "all_nan": ([NAN, NAN], [NAN, NAN]),
    "mixed": ([NAN, INF, -INF, 4.0, NAN, 1.0], [NAN, INF, INF, NAN, 0.0, 1.25]),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=_name)
@pytest.mark.parametrize("case", list(NONFINITE_CASES))
def test_nonfinite_handling_matches_numpy(case: str, dtype: torch.dtype) -> None:
    xa, xb = NONFINITE_CASES[case]
    a = torch.tensor(xa, dtype=torch.float64).to(dtype)  # e4m3fn saturates Inf: ref sees the cast values
    b = torch.tensor(xb, dtype=torch.float64).to(dtype)
    m = compare_tensors(a, b, atol=0.1, rtol=0.0, chunk_elems=3)
    _assert_matches(m, _np_metrics(a, b, 0.1, 0.0))
    assert math.isfinite(m.max_abs) and math.isfinite(m.norm_a) and math.isfinite(m.mean_abs)


def test_nonfinite_counts_spelled_out() -> None:
    a, b = (torch.tensor(NONFINITE_CASES["mixed"][i]) for i in (0, 1))
    m = compare_tensors(a, b, atol=0.5, rtol=0.0)
    # a: NaN Inf -Inf NaN;  b: NaN Inf Inf NaN.  Mismatches: -Inf/Inf, 4/NaN, NaN/0.
    assert (m.nonfinite_a, m.nonfinite_b, m.nonfinite_mismatch) == (4, 4, 3)
    assert m.pass_ratio == 3 / 6  # NaN/NaN, Inf/Inf, 1/1.25
    assert m.max_abs == 0.25 and m.mean_abs == 0.25


@pytest.mark.parametrize("shape", [(0,), (3, 0), (0, 4, 2)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64], ids=_name)
def test_empty_tensors(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    m = compare_tensors(torch.empty(shape, dtype=dtype), torch.empty(shape, dtype=dtype))
    assert m.numel == 0
    assert (m.norm_a, m.norm_b, m.rel_l2, m.cosine, m.max_abs, m.mean_abs) == (0.0, 0.0, 0.0, 1.0, 0.0, 0.0)
    assert (m.rel_diff, m.pass_ratio, m.sqnr_db) == (0.0, 1.0, math.inf)
    assert (m.nonfinite_a, m.nonfinite_b, m.nonfinite_mismatch) == (0, 0, 0)
    assert (m.max_ulp, m.p99_ulp) == ((0, None) if dtype == torch.bfloat16 else (None, None))
    assert compare_tensors(torch.empty(shape, dtype=dtype), torch.empty(shape, dtype=dtype), p99=True).p99_ulp == (
        0 if dtype == torch.bfloat16 else None
    )


def test_zero_dim_tensors() -> None:
    m = compare_tensors(torch.tensor(2.0), torch.tensor(2.5))
    assert m.numel == 1 and m.max_abs == 0.5 and m.rel_l2 == 0.25


def test_shape_mismatch_raises() -> None:
    with pytest.raises(MetricInputError, match=r"shape mismatch: \(3, 4\) vs \(3, 5\)"):
        compare_tensors(torch.zeros(3, 4), torch.zeros(3, 5))
    assert issubclass(MetricInputError, ValueError)


@pytest.mark.parametrize(
    ("a", "b", "kwargs", "match"),
    [
        ([1.0], torch.zeros(1), {}, "must be a torch.Tensor"),
        (torch.zeros(2, dtype=torch.complex64), torch.zeros(2, dtype=torch.complex64), {}, "unsupported"),
        (torch.zeros(2), torch.zeros(2), {"atol": -1.0}, "atol"),
        (torch.zeros(2), torch.zeros(2), {"rtol": math.nan}, "rtol"),
        (torch.zeros(2), torch.zeros(2), {"chunk_elems": 0}, "chunk_elems"),
    ],
)
def test_bad_inputs_raise(a: Any, b: Any, kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(MetricInputError, match=match):
        compare_tensors(a, b, **kwargs)


def test_requires_grad_inputs() -> None:
    a = torch.randn(10, requires_grad=True)
    m = compare_tensors(a, a * 1.001)
    assert math.isclose(m.rel_l2, 1e-3, rel_tol=1e-4)
    [got] = measure_many([(a, a * 1.001, ())])
    assert not isinstance(got, MetricInputError) and got[0] == m


# ---------------------------------------------------------------- streaming


def _assert_equivalent(m1: TensorMetrics, m2: TensorMetrics, rel: float = 1e-6) -> None:
    """Exact fields equal, float fields within the engine's accuracy (layouts and devices may sum in
    another order)."""
    d1, d2 = m1.to_dict(), m2.to_dict()
    for key, v1 in d1.items():
        v2 = d2[key]
        if isinstance(v1, float) and isinstance(v2, float) and key not in ("max_abs", "pass_ratio"):
            assert _same(v1, v2, rel=rel, abs_=1e-9), (key, v1, v2)
        else:
            assert v1 == v2, (key, v1, v2)


@pytest.mark.parametrize("dtype", DTYPES, ids=_name)
@pytest.mark.parametrize("chunk", [1, 7, 64])
def test_chunking_invariance(dtype: torch.dtype, chunk: int) -> None:
    a, b = _pair(dtype, n=2 * 64 + 5, seed=1)
    a[3], b[10] = math.nan, math.inf
    _assert_equivalent(compare_tensors(a, b, chunk_elems=chunk), compare_tensors(a, b))


@pytest.mark.parametrize("chunk", [1, 5, 12, 13, 1 << 22])
def test_non_contiguous_inputs(chunk: int) -> None:
    a, b = _pair(torch.bfloat16, n=4 * 6 * 5, seed=2)
    a3, b3 = a.view(4, 6, 5), b.view(4, 6, 5)
    at, bt = a3.permute(2, 0, 1), b3.transpose(0, 2).transpose(1, 2)  # same logical tensor, other strides
    assert not at.is_contiguous()
    expected = compare_tensors(at.contiguous(), bt.contiguous())
    _assert_equivalent(compare_tensors(at, bt, chunk_elems=chunk), expected)
    _assert_equivalent(compare_tensors(at, bt.contiguous(), chunk_elems=chunk), expected)
    _assert_equivalent(
        compare_tensors(a3[:, ::2], b3[:, ::2], chunk_elems=chunk),
        compare_tensors(a3[:, ::2].contiguous(), b3[:, ::2].contiguous()),
    )


# ---------------------------------------------------------------- ULP


def _bf16(bits: list[int]) -> torch.Tensor:
    return torch.tensor(bits, dtype=torch.int16).view(torch.bfloat16)


def test_ulp_known_cases() -> None:
    one = torch.tensor([1.0], dtype=torch.bfloat16)
    next_up = torch.tensor([1.0 + 2.0**-7], dtype=torch.bfloat16)  # bf16 has 7 fraction bits
    assert compare_tensors(one, next_up).max_ulp == 1
    pz, nz = torch.tensor([0.0], dtype=torch.bfloat16), torch.tensor([-0.0], dtype=torch.bfloat16)
    assert compare_tensors(pz, nz).max_ulp == 0
    tiny_pos, tiny_neg = _bf16([0x0001]), _bf16([-0x7FFF])  # +/- smallest subnormal
    assert compare_tensors(tiny_pos, tiny_neg).max_ulp == 2  # crossing zero: -tiny -> 0 -> +tiny
    assert compare_tensors(nz, tiny_pos).max_ulp == 1
    assert compare_tensors(-one, one).max_ulp == 2 * 0x3F80
    h = torch.tensor([1.0], dtype=torch.float16)
    assert compare_tensors(h, torch.tensor([1.0 + 2.0**-10], dtype=torch.float16)).max_ulp == 1
    f = np.float32(1.0)
    up = torch.tensor([np.nextafter(f, np.float32(2)), -np.nextafter(np.float32(0), f)], dtype=torch.float32)
    assert compare_tensors(torch.tensor([1.0, 0.0]), up).max_ulp == 1
    e4 = torch.tensor([448.0], dtype=torch.float8_e4m3fn)  # largest finite and its neighbour
    assert compare_tensors(e4, torch.tensor([416.0], dtype=torch.float8_e4m3fn)).max_ulp == 1


def test_ulp_skips_nonfinite_and_mixed_dtypes() -> None:
    a = torch.tensor([1.0, math.inf, math.nan], dtype=torch.bfloat16)
    b = torch.tensor([1.0, 1.0, 1.0], dtype=torch.bfloat16)
    assert (compare_tensors(a, b, p99=True).max_ulp, compare_tensors(a, b, p99=True).p99_ulp) == (0, 0)
    assert compare_tensors(a, b).p99_ulp is None  # asked for only
    assert compare_tensors(a, b.to(torch.float16)).max_ulp is None


@pytest.mark.parametrize(("n", "expected"), [(1, 0), (100, 98), (101, 99), (200, 197), (1000, 989)])
def test_p99_is_nearest_rank(n: int, expected: int) -> None:
    # distances 0..n-1 exactly: nearest rank ceil(0.99 n) -> value ceil(0.99 n) - 1
    a = torch.full((n,), 1.0, dtype=torch.bfloat16)
    b = (a.view(torch.int16) + torch.arange(n, dtype=torch.int16)).view(torch.bfloat16)
    m = compare_tensors(a, b, chunk_elems=37, p99=True)
    assert m.p99_ulp == expected == math.ceil(0.99 * n - 1e-9) - 1
    assert m.max_ulp == n - 1


@pytest.mark.parametrize("dtype", ULP_DTYPES, ids=_name)
def test_p99_against_numpy_wide_spread(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(3)
    a = (torch.randn(3001, generator=g) * 10).to(dtype)
    b = (torch.randn(3001, generator=g) * 10).to(dtype)  # unrelated: distances span the whole range
    m = compare_tensors(a, b, chunk_elems=256, p99=True)
    ref = _np_metrics(a, b, 1e-5, 1e-3)
    assert (m.max_ulp, m.p99_ulp) == (ref["max_ulp"], ref["p99_ulp"])


@pytest.mark.parametrize("chunk", [3, 1 << 22])
def test_p99_float32_beyond_fine_histogram(chunk: int) -> None:
    # p99 far above 2**16 ULPs exercises the exact two-level path
    g = torch.Generator().manual_seed(4)
    a = torch.randn(1000, generator=g)
    b = a * (1 + torch.rand(1000, generator=g) * 1e-2)
    b[:5] = -a[:5]
    m = compare_tensors(a, b, chunk_elems=chunk, p99=True)
    ref = _np_metrics(a, b, 1e-5, 1e-3)
    assert ref["p99_ulp"] > 1 << 16
    assert (m.max_ulp, m.p99_ulp) == (ref["max_ulp"], ref["p99_ulp"])


# ---------------------------------------------------------------- serialisation


def test_to_dict_is_json_safe_and_round_trips() -> None:
    m = compare_tensors(torch.zeros(3), torch.tensor([1.0, 0.0, 0.0]))
    d = m.to_dict()
    assert (d["rel_l2"], d["sqnr_db"], d["cosine"]) == ("inf", "-inf", "nan")
    text = json.dumps(d, allow_nan=False)
    back = TensorMetrics.from_dict(json.loads(text))
    assert back.to_dict() == d and back.rel_l2 == math.inf and math.isnan(back.cosine)
    fine = compare_tensors(*_pair(torch.bfloat16, n=50))
    assert TensorMetrics.from_dict(json.loads(json.dumps(fine.to_dict()))) == fine


# ---------------------------------------------------------------- property test and devices


@settings(max_examples=40, deadline=None)
@given(
    data=hnp.arrays(
        np.float32,
        st.tuples(st.just(3), st.integers(0, 40)),
        elements=st.floats(width=32, allow_nan=True, allow_infinity=True),
    ),
    noise=st.floats(-1e3, 1e3, width=32),
    chunk=st.integers(1, 50),
)
def test_property_float32_matches_numpy(data: np.ndarray, noise: float, chunk: int) -> None:
    a = torch.from_numpy(data[0])
    with np.errstate(all="ignore"):  # overflow to Inf is part of the input space
        b = torch.from_numpy((data[1] + np.float32(noise) * data[2]).astype(np.float32))
    _assert_matches(compare_tensors(a, b, chunk_elems=chunk, p99=True), _np_metrics(a, b, 1e-5, 1e-3))


@CUDA
@pytest.mark.parametrize("dtype", DTYPES, ids=_name)
def test_cuda_matches_cpu(dtype: torch.dtype) -> None:
    a, b = _pair(dtype, n=10_007, seed=5)
    a[0] = math.nan
    expected = compare_tensors(a, b, chunk_elems=999)
    _assert_equivalent(compare_tensors(a.cuda(), b.cuda(), chunk_elems=999), expected)
    _assert_equivalent(compare_tensors(a, b.cuda(), chunk_elems=999), expected)


@CUDA
def test_cuda_float32_p99_two_rounds() -> None:
    a = torch.randn(5000)
    b = -a
    cpu = compare_tensors(a, b, p99=True)
    _assert_equivalent(compare_tensors(a.cuda(), b.cuda(), chunk_elems=777, p99=True), cpu)
    assert cpu.p99_ulp is not None and cpu.p99_ulp > 1 << 16
