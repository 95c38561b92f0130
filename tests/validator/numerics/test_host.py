"""HostArray (a small float tensor read as NumPy, bfloat16 and float8 as their bits) is measured bit for bit as
the same tensor in torch: on every float dtype, with NaN, infinities, signed zeros and subnormals, in every
shape, alone, many at once, beside a torch tensor, and in the rounding floor."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from validator.numerics.backends import totals_of_many
from validator.numerics.backends.small import NUMPY_MAX, stored, values
from validator.numerics.floors import measure_blocks_many, rounding_sums
from validator.numerics.host import STORAGE, HostArray, from_torch, rounded
from validator.numerics.metrics import MetricInputError, measure

FLOATS = ["float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2"]
SHAPES = [(0,), (1,), (7,), (64, 64), (3, 5, 7), (2, NUMPY_MAX // 2)]


def _pair(dtype_a: str, dtype_b: str, shape: tuple[int, ...], seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A reference and a drifting candidate (1e-2 relative), a few NaN, infinities, zeros and tiny values."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(shape, generator=g, dtype=torch.float64)
    b = a * (1 + 1e-2 * torch.randn(shape, generator=g, dtype=torch.float64))
    flat_a, flat_b = a.view(-1), b.view(-1)
    specials = [math.nan, math.inf, -math.inf, -0.0, 1e-42, -3e-39]
    for i, v in enumerate(specials):
        if 3 * i + 2 < flat_a.numel():
            flat_a[3 * i] = v
            flat_b[3 * i + 1] = v
            flat_a[3 * i + 2] = flat_b[3 * i + 2] = v
    return a.to(getattr(torch, dtype_a)), b.to(getattr(torch, dtype_b))


def _bits(got: object) -> object:
    """A measurement's fields, floats by their bits (NaN == NaN, -0.0 != 0.0)."""
    if isinstance(got, float):
        return got.hex()
    if isinstance(got, np.ndarray):
        return got.tobytes()
    if isinstance(got, (list, tuple)):
        return [_bits(x) for x in got]
    if isinstance(got, dict):
        return {k: _bits(v) for k, v in got.items()}
    if hasattr(got, "__dataclass_fields__"):
        return {k: _bits(getattr(got, k)) for k in got.__dataclass_fields__}
    return got


def test_storage_round_trip_is_exact() -> None:
    for dtype in FLOATS:
        t = _pair(dtype, dtype, (5, 9), 0)[0]
        h = from_torch(t)
        assert h.bits.dtype == STORAGE[dtype] and h.shape == (5, 9) and h.numel() == 45 and h.is_floating_point()
        back = h.to_torch()
        assert back.dtype == t.dtype and torch.equal(back.view(torch.uint8), t.contiguous().view(torch.uint8))
        assert stored(h)[0].tobytes() == stored(t)[0].tobytes()


def test_a_hostarray_must_hold_its_dtypes_storage() -> None:
    with pytest.raises(ValueError, match="stored as"):
        HostArray(np.zeros(3, np.float32), "bfloat16")
    with pytest.raises(ValueError, match="stored as"):
        HostArray(np.zeros(3, np.int32), "int32")


@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "float8_e5m2", "bfloat16", "float16"])
def test_every_bit_pattern_reads_as_torch_reads_it(dtype: str) -> None:
    width = 8 if dtype.startswith("float8") else 16
    raw = torch.arange(1 << width, dtype=torch.int32).to(torch.uint8 if width == 8 else torch.int16)
    t = raw.view(getattr(torch, dtype))
    want = t.to(torch.float64).numpy()
    got = values(*stored(from_torch(t)))
    assert np.array_equal(np.isnan(got), np.isnan(want))
    assert got[~np.isnan(got)].tobytes() == want[~np.isnan(want)].tobytes()


@pytest.mark.parametrize(
    "dtype_a,dtype_b",
    [(d, d) for d in FLOATS] + [("float32", "bfloat16"), ("float64", "float16"), ("bfloat16", "float8_e4m3fn")],
)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_a_host_pair_measures_as_the_torch_pair(dtype_a: str, dtype_b: str, shape: tuple[int, ...]) -> None:
    ta, tb = _pair(dtype_a, dtype_b, shape, seed=len(shape))
    ha, hb = from_torch(ta), from_torch(tb)
    assert _bits(measure_blocks_many([(ha, hb)])) == _bits(measure_blocks_many([(ta, tb)]))
    mixed = measure_blocks_many([(ha, tb), (ta, hb)])  # a HostArray beside a tensor
    assert _bits(mixed) == _bits(measure_blocks_many([(ta, tb), (ta, tb)]))


def test_many_host_pairs_measure_as_each_alone() -> None:
    pairs = [_pair(d, d, s, seed=i) for i, (d, s) in enumerate((d, s) for d in FLOATS for s in SHAPES)]
    host = [(from_torch(a), from_torch(b), ()) for a, b in pairs]
    together = totals_of_many(host, atol=1e-5, rtol=1e-3, chunk_elems=1 << 22)
    alone = [totals_of_many([(a, b, ())], atol=1e-5, rtol=1e-3, chunk_elems=1 << 22)[0] for a, b in pairs]
    assert _bits(together) == _bits(alone)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float8_e5m2"])
def test_p99_of_a_host_pair_is_the_torch_pairs(dtype: str) -> None:
    ta, tb = _pair(dtype, dtype, (33, 17), 3)
    got, _ = measure(from_torch(ta), from_torch(tb), p99=True)
    want, _ = measure(ta, tb, p99=True)
    assert got.p99_ulp is not None and _bits(got) == _bits(want)


def test_a_host_array_beside_an_integer_tensor_goes_to_the_reference() -> None:
    a = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    b = torch.arange(24, dtype=torch.int32).reshape(4, 6) + 1
    assert _bits(measure_blocks_many([(from_torch(a), b)])) == _bits(measure_blocks_many([(a, b)]))
    got = measure_blocks_many([(from_torch(a), from_torch(a[:2]))])[0]
    assert isinstance(got, MetricInputError) and "shape mismatch" in str(got)


def _random_values(dtype: str, n: int, seed: int) -> np.ndarray:
    """Every kind of value of ``dtype``: random bit patterns (NaN, infinities, subnormals) and, in float64,
    normal values over float32's range and past it, and ties of float32 and bfloat16."""
    rng = np.random.default_rng(seed)
    if dtype in ("float16", "bfloat16"):
        return np.arange(1 << 16, dtype=np.uint16).view(STORAGE[dtype])
    if dtype == "float32":
        u = rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32)
        u[: n // 4] = (u[: n // 4] & 0xFFFF0000) | 0x8000  # ties to bfloat16
        u[n // 4 : n // 2] = (u[n // 4 : n // 2] & 0xFFFFE000) | 0x1000  # ties to float16
        return u.view(np.float32)
    x = rng.standard_normal(n) * np.exp(rng.uniform(-120, 120, n))
    half = np.float64(np.float32(1.0) + np.float32(2.0**-23)) - 2.0**-24  # ties of float32, and nearly so
    return np.concatenate(
        [x, rng.integers(0, 1 << 63, n, dtype=np.uint64).view(np.float64), [half, half + 2**-60, 1 + 2**-11 + 2**-40]]
    )


@pytest.mark.parametrize("src,dst", [("float64", "float32"), ("float64", "float16"), ("float64", "bfloat16"),
                                     ("float32", "float16"), ("float32", "bfloat16"), ("float16", "bfloat16")])  # fmt: skip
def test_rounded_as_torch_rounds(src: str, dst: str) -> None:
    h = HostArray(_random_values(src, 50_000, seed=len(src + dst)), src)
    want = values(*stored(h.to_torch().to(getattr(torch, dst))))
    got = rounded(h, dst)
    assert got is not None and got.dtype == dst
    have = values(*stored(got))
    assert np.array_equal(np.isnan(have), np.isnan(want))
    assert have[~np.isnan(have)].tobytes() == want[~np.isnan(want)].tobytes()


def test_the_rounding_floor_of_a_host_array_is_the_tensors() -> None:
    for src, dst in [
        ("float32", "bfloat16"),
        ("float64", "float16"),
        ("float32", "float8_e4m3fn"),
        ("bfloat16", "float8_e5m2"),
    ]:
        t = _pair(src, src, (70, 33), 5)[0]
        assert _bits(rounding_sums(from_torch(t), dst)) == _bits(rounding_sums(t, dst)), (src, dst)
    assert rounded(from_torch(torch.zeros(3, dtype=torch.float32)), "float8_e4m3fn") is None
