"""The CUDA path's sampled p99 window (validator/kernels/cuda.py, docs/performance.md "The exact p99"):
results identical to the streamed float64 reference whether the window holds the p99 or misses it.

The CUDA tests run on a GPU (they ran on the H200). The interpreter test
runs the same kernels on the CPU through Triton's interpreter; it is opt-in
(``VALIDATOR_TEST_TRITON_INTERPRET=1 TRITON_INTERPRET=1``, Triton 3.6 needs NumPy < 2.3 there) because
the interpreter takes seconds per case.
"""

from __future__ import annotations

import os
import threading
import warnings
from collections.abc import Iterator

import pytest
import torch

from tests.validator.test_fastmetrics import CUDA, _name, assert_same, pair, reference  # noqa: F401
from validator import kernels
from validator import metrics as kernels_metrics
from validator.kernels import _finish
from validator.metrics import MetricInputError

WINDOW_DTYPES = [torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn, torch.float8_e5m2]


@pytest.fixture
def kc() -> Iterator[object]:
    from validator.kernels import cuda

    saved = dict(cuda.CONFIG)
    yield cuda
    cuda.CONFIG.clear()
    cuda.CONFIG.update(saved)


def _counts(kc: object) -> dict[str, int]:
    return dict(kc.WINDOW_STATS)  # type: ignore[attr-defined]


def _delta(kc: object, before: dict[str, int]) -> dict[str, int]:
    return {k: v - before[k] for k, v in kc.WINDOW_STATS.items()}  # type: ignore[attr-defined]


def _sampled_tiles_equal(a: torch.Tensor, b: torch.Tensor, block: int, stride: int, engine: int = 0) -> torch.Tensor:
    """b with every tile the sample reads set equal to a: the sample sees distance 0 everywhere, the
    rest of the pair does not, so the window misses the p99. The Triton sample reads every
    ``stride``-th tile; the CUDA C sample (``engine`` 1) one tile per stretch at a hashed offset."""
    from validator.kernels import cuda

    b = b.clone()
    n_full = a.numel() // block
    for t in cuda.sample_tiles(n_full, stride) if engine else range(0, n_full, stride):
        b[t * block : (t + 1) * block] = a[t * block : (t + 1) * block]
    return b


@CUDA
@pytest.mark.parametrize("dtype", WINDOW_DTYPES, ids=_name)
def test_cuda_window_matches_reference(reference, kc, dtype: torch.dtype) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    a, b = pair(dtype, (1 << 21) + 37, seed=21)
    for engine in (1, 0):  # the CUDA C kernels, then the Triton ones
        kc.CONFIG["ENGINE"] = engine
        assert kernels.backend_for(a.cuda(), b.cuda()) == ("cuda-c" if engine else "cuda-triton")
        before = _counts(kc)
        assert_same(torch_compare(a.cuda(), b.cuda()), reference(a, b))
        assert _delta(kc, before)["window"] == 1
        assert _delta(kc, before)["cuda_c"] == engine, kc._CU_ERRORS
        if engine and dtype != torch.float32:  # close pairs: the window holds the p99 (see vk_main's borrow)
            assert _delta(kc, before)["fallback"] == 0


@CUDA
def test_cuda_window_miss_falls_back_exactly(reference, kc) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    a, b0 = pair(torch.bfloat16, 1 << 21, seed=22)
    for engine in (1, 0):
        kc.CONFIG["ENGINE"] = engine
        tile = kc._CU_THREADS * 8 if engine else kc.CONFIG["BLOCK"]  # the sample's tile of each engine
        b = _sampled_tiles_equal(a, b0, tile, _finish.SAMPLE_STRIDE, engine)
        before = _counts(kc)
        assert_same(torch_compare(a.cuda(), b.cuda()), reference(a, b))
        assert _delta(kc, before) == {"window": 1, "fallback": 1, "cuda_c": engine}


@CUDA
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn], ids=_name)
def test_cuda_window_unaligned_views_and_sizes(reference, kc, dtype: torch.dtype) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    a, b = pair(dtype, (1 << 21) + 5, seed=25)
    ga, gb = a.cuda(), b.cuda()
    assert_same(torch_compare(ga[1:], gb[1:]), reference(a[1:], b[1:]))  # not 16-byte aligned: Triton
    for n in ((1 << 20) + 1, (1 << 21) + 15, 3 << 20):  # tails of every length below one vector
        assert_same(torch_compare(ga[:n], gb[:n]), reference(a[:n], b[:n]))


@CUDA
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=_name)
def test_cuda_window_nonfinite_and_identical(reference, kc, dtype: torch.dtype) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    a, b = pair(dtype, 1 << 21, seed=23)
    b[::1000] = float("nan")
    a[5::7777] = float("inf")
    b[5::7777] = float("inf")
    a[9::9999] = float("-inf")
    assert_same(torch_compare(a.cuda(), b.cuda()), reference(a, b))
    assert_same(torch_compare(a.cuda(), a.cuda()), reference(a, a))  # lo == 0: every distance 0
    c = a.clone()
    c[:4096] = (-a[:4096].double()).to(dtype)  # a wide tail above the p99
    assert_same(torch_compare(a.cuda(), c.cuda()), reference(a, c))


def torch_compare(a: torch.Tensor, b: torch.Tensor) -> object:
    from validator.metrics import compare_tensors

    return compare_tensors(a, b)


@pytest.mark.skipif(
    os.environ.get("VALIDATOR_TEST_TRITON_INTERPRET") != "1", reason="set VALIDATOR_TEST_TRITON_INTERPRET=1"
)
@pytest.mark.parametrize("dtype", WINDOW_DTYPES, ids=_name)
def test_window_kernels_in_interpreter(reference, kc, monkeypatch, dtype: torch.dtype) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    # small tiles and a denser sample, so that a pair of a few 10,000 elements takes the window path
    monkeypatch.setattr(_finish, "WINDOW_MIN_SAMPLE", 256)
    monkeypatch.setattr(kc, "SAMPLE_STRIDE", 4)
    kc.CONFIG.update(BLOCK=64, NCOPY=2, SCOPY=2, SNSMALL=8, NSMALL=8, window_min=1000, NHEAD=16)
    a, b = pair(dtype, 20037, seed=24)
    cases = [(a, b, 0), (a, _sampled_tiles_equal(a, b, 64, 4), 1)]
    for x, y, fallbacks in cases:
        before = _counts(kc)
        for masked in (False, True):
            with warnings.catch_warnings():  # the interpreter's NumPy arithmetic warns on inf - inf
                warnings.simplefilter("ignore", RuntimeWarning)
                fast = kc._compare_on(
                    x, y, torch.device("cpu"), atol=1e-5, rtol=1e-3, chunk_elems=1 << 22, force_masked=masked
                )
            assert_same(fast, reference(x, y))
        assert _delta(kc, before)["window"] == 2
        if dtype != torch.float32:  # float32's window may be too wide and miss either way
            assert _delta(kc, before)["fallback"] == 2 * fallbacks


@CUDA
def test_cuda_concurrent_calls_do_not_share_results(reference, kc) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    # the engines keep one cached workspace per layout: concurrent calls must not see each other's
    pairs = [pair(torch.bfloat16, 1 << 21, seed=30 + i, noise=0.001 * (i + 1)) for i in range(4)]
    expected = [reference(a, b) for a, b in pairs]
    got: list[object] = [None] * len(pairs)

    def work(i: int) -> None:
        a, b = pairs[i]
        for _ in range(5):
            got[i] = torch_compare(a.cuda(), b.cuda())

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(pairs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for g, e in zip(got, expected, strict=True):
        assert_same(g, e)  # type: ignore[arg-type]


@CUDA
@pytest.mark.parametrize("dtype", WINDOW_DTYPES, ids=_name)
def test_cuda_window_far_pairs_and_signed_zeros(reference, kc, dtype: torch.dtype) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    # the lean step measures distances on a shifted scale and clips the window at the format's top
    # distance: pairs whose p99 lies near that top, opposite signs everywhere, and -0.0 against +0.0
    n = (1 << 21) + 3
    g = torch.Generator().manual_seed(26)
    bits = {1: torch.int8, 2: torch.int16, 4: torch.int32}[torch.empty((), dtype=dtype).element_size()]
    info = torch.iinfo(bits)
    raw = [torch.randint(info.min, info.max, (n,), generator=g, dtype=bits).view(dtype) for _ in range(2)]
    a, b = (torch.where(torch.isfinite(x.double()), x, torch.zeros((), dtype=dtype)) for x in raw)
    sign = torch.tensor(info.min, dtype=bits)  # the sign bit (float8 has no negation on the CPU)
    zeros = torch.zeros(n, dtype=dtype)
    for x, y in ((a, b), (a, _flip(a, sign)), (zeros, _flip(zeros, sign))):
        assert_same(torch_compare(x.cuda(), y.cuda()), reference(x, y))


def _flip(x: torch.Tensor, sign: torch.Tensor) -> torch.Tensor:
    return (x.view(sign.dtype) ^ sign).view(x.dtype)


@CUDA
def test_cuda_first_call_in_a_fresh_thread(reference, kc) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    # the CUDA C engine launches through the driver, which needs a current context: a thread whose
    # first CUDA work is a comparison of tensors made elsewhere must still get the right answer, and
    # the workspace it leaves must serve the next call
    a, b = pair(torch.bfloat16, 1 << 21, seed=31)
    ga, gb = a.cuda(), b.cuda()
    torch.cuda.synchronize()
    got: list[object] = []
    t = threading.Thread(target=lambda: got.extend(torch_compare(ga, gb) for _ in range(2)))
    t.start()
    t.join()
    expected = reference(a, b)
    assert len(got) == 2
    for g in got:
        assert_same(g, expected)  # type: ignore[arg-type]


@CUDA
def test_cuda_repeated_calls_take_the_lane_and_stay_exact(reference, kc) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    # a second call with the same dtypes, size, devices and tolerances goes straight to the CUDA C
    # kernels (lane_compare); pairs that do not fit the lane, and NaN/Inf or window misses met on it,
    # still get the reference's answer
    n = (1 << 21) + 16
    a, b = pair(torch.bfloat16, n, seed=32)
    ga, gb = a.cuda(), b.cuda()
    assert_same(torch_compare(ga, gb), reference(a, b))
    pending = kc.lane_start(ga, gb, 1e-5, 1e-3)  # type: ignore[attr-defined]
    assert pending is not None, kc._CU_ERRORS  # type: ignore[attr-defined]
    assert_same(pending.finish(1 << 22), reference(a, b))
    assert kc.lane_start(ga, gb, 1e-4, 1e-3) is None  # type: ignore[attr-defined]  # other tolerances
    big = torch.cat([ga[:8], ga])
    misaligned, strided = big[1 : n + 1], ga.view(2, -1).t()
    for x in (misaligned, strided):  # same size, but not a pair the kernels take as it is
        assert kc.lane_start(x, gb.view(x.shape), 1e-5, 1e-3) is None  # type: ignore[attr-defined]
        assert_same(torch_compare(x, gb.view(x.shape)), reference(x.cpu(), b.view(x.shape)))
    assert kc.lane_start(ga, gb.view(2, -1), 1e-5, 1e-3) is None  # type: ignore[attr-defined]  # shapes differ
    with pytest.raises(MetricInputError, match="chunk_elems"):  # launched, then refused: the lock is free again
        kernels_metrics.compare_tensors(ga, gb, chunk_elems=0)
    assert_same(torch_compare(ga, gb), reference(a, b))
    c = b.clone()
    c[::1000] = float("nan")
    before = _counts(kc)
    assert_same(torch_compare(ga, c.cuda()), reference(a, c))  # on the lane: rerun masked
    assert _delta(kc, before)["cuda_c"] == 2
    d = _sampled_tiles_equal(a, b, kc._CU_THREADS * 8, _finish.SAMPLE_STRIDE, 1)  # type: ignore[attr-defined]
    before = _counts(kc)
    assert_same(torch_compare(ga, d.cuda()), reference(a, d))  # on the lane: a window miss
    assert _delta(kc, before) == {"window": 1, "fallback": 1, "cuda_c": 1}


def test_sample_tiles_one_per_stretch() -> None:
    # the CUDA C sample's tiles (the kernel's sample_tile, mirrored on the host): one whole tile in each
    # stretch of SAMPLE_STRIDE, the short last stretch included, not all at the same offset
    from validator.kernels import cuda

    for n_full in (1, 63, 64, 65, 1000, 4096 + 7):
        tiles = cuda.sample_tiles(n_full, 64)
        assert len(tiles) == -(-n_full // 64)
        assert all(g * 64 <= t < min((g + 1) * 64, n_full) for g, t in enumerate(tiles))
    assert len({t % 64 for t in cuda.sample_tiles(4096, 64)}) > 32


def test_config_changes_drop_the_lanes() -> None:
    # a lane holds kernels and plans built for the CONFIG in force: any change must drop them
    from validator.kernels import cuda

    saved = dict(cuda.CONFIG)
    try:
        for change in (
            lambda c: c.__setitem__("cu_blocks_per_sm", 8),
            lambda c: c.update(NHEAD=512),
            lambda c: c.pop("CUDIAG"),
            lambda c: c.setdefault("CUDIAG", 0),
            lambda c: c.clear(),
        ):
            cuda._LANES[("key",)] = object()  # type: ignore[assignment]
            change(cuda.CONFIG)
            assert not cuda._LANES
    finally:
        cuda.CONFIG.clear()
        cuda.CONFIG.update(saved)


@CUDA
def test_cuda_torch_launcher_path_is_exact(reference, kc) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    # where the driver launch does not apply, the CUDA C kernels go through torch's own launcher with
    # the result row on the device (LAUNCH 0 forces that path)
    kc.CONFIG["LAUNCH"] = 0
    a, b = pair(torch.bfloat16, (1 << 21) + 8, seed=33)
    for _ in range(2):  # the workspace is reused
        before = _counts(kc)
        assert_same(torch_compare(a.cuda(), b.cuda()), reference(a, b))
        assert _delta(kc, before)["cuda_c"] == 1, kc._CU_ERRORS


def test_grid_shape_per_format() -> None:
    # 16- and 32-bit pairs: registers capped at 51 (5 resident blocks), one wave under cu_small_n
    # elements and three above; float8 keeps 64 registers (its loop spills at 51): 4 and 12
    from validator.kernels import cuda

    small, large = cuda.CONFIG["cu_small_n"] - 1, cuda.CONFIG["cu_small_n"]
    assert [cuda._cu_bps(n, 3) for n in (small, large)] == [5, 15]
    assert [cuda._cu_bps(n, 4) for n in (small, large)] == [4, 12]
    assert dict(cuda._cu_macros(1))["MINB"] == 5
    assert dict(cuda._cu_macros(5))["MINB"] == 4
