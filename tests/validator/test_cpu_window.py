"""The CPU kernel's speculative p99 window (validator.kernels.cpu, docs/performance.md "CPU kernel").

Pairs of at least ``cpu.WINDOW_FROM`` elements find their exact p99 from a sample's window instead of
full histograms. Every result must still equal the reference's (``VALIDATOR_KERNELS=0``) and an
independent NumPy computation (sort the distances, take rank ``ceil(0.99 n)``), whichever route the
pair took; ``cpu.stats`` says which route that was.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch

from validator import kernels
from validator.kernels import cpu
from validator.metrics import TensorMetrics, compare_tensors

from .test_fastmetrics import assert_same

pytestmark = pytest.mark.skipif(
    kernels.backend_for(torch.zeros(1), torch.zeros(1)) != "cpu-native", reason="no C compiler: no CPU kernel here"
)

N = cpu.WINDOW_FROM + (1 << 18) + 777  # two chunks, a ragged last chunk and a ragged last sample run
KW = {"atol": 1e-5, "rtol": 1e-3, "chunk_elems": 1 << 22}
ULP_INT = {
    torch.bfloat16: (torch.int16, 0x7FFF),
    torch.float16: (torch.int16, 0x7FFF),
    torch.float32: (torch.int32, 0x7FFFFFFF),
    torch.float8_e4m3fn: (torch.int8, 0x7F),
    torch.float8_e5m2: (torch.int8, 0x7F),
}

Ref = Callable[[torch.Tensor, torch.Tensor], TensorMetrics]


@pytest.fixture
def reference(monkeypatch: pytest.MonkeyPatch) -> Iterator[Ref]:
    def ref(a: torch.Tensor, b: torch.Tensor) -> TensorMetrics:
        with monkeypatch.context() as m:
            m.setenv("VALIDATOR_KERNELS", "0")
            return compare_tensors(a, b)

    yield ref


@pytest.fixture(autouse=True)
def _default_threads() -> Iterator[None]:
    yield
    cpu.set_threads(None)


def numpy_distances(a: torch.Tensor, b: torch.Tensor) -> np.ndarray:
    """The ULP distances at the positions finite in both (int64), independently of the kernels."""
    idt, mag = ULP_INT[a.dtype]
    ia = a.view(idt).numpy().astype(np.int64)
    ib = b.view(idt).numpy().astype(np.int64)
    oa = np.where(ia < 0, -(ia & mag), ia)
    ob = np.where(ib < 0, -(ib & mag), ib)
    fin = np.isfinite(a.double().numpy()) & np.isfinite(b.double().numpy())
    return np.abs(oa - ob)[fin]


def numpy_ulp(a: torch.Tensor, b: torch.Tensor) -> tuple[int, int]:
    """(max, p99) of the ULP distances over the positions finite in both, independently of the kernels."""
    d = numpy_distances(a, b)
    if d.size == 0:
        return 0, 0
    k = (99 * d.size + 99) // 100
    return int(d.max()), int(np.partition(d, k - 1)[k - 1])


def routed(a: torch.Tensor, b: torch.Tensor, **kw: object) -> tuple[TensorMetrics, dict[str, int]]:
    """compare_tensors plus the change it made to cpu.stats."""
    before = dict(cpu.stats)
    m = compare_tensors(a, b, **kw)  # type: ignore[arg-type]
    return m, {k: v - before[k] for k, v in cpu.stats.items()}


def check(a: torch.Tensor, b: torch.Tensor, reference: Ref) -> tuple[TensorMetrics, dict[str, int]]:
    fast, route = routed(a, b)
    ref = reference(a, b)
    assert (fast.max_ulp, fast.p99_ulp) == (ref.max_ulp, ref.p99_ulp) == numpy_ulp(a, b)
    assert_same(fast, ref)
    return fast, route


def noisy(dtype: torch.dtype, n: int = N, seed: int = 0, rel: float = 0.01) -> tuple[torch.Tensor, torch.Tensor]:
    """The benchmark's kind of pair: the candidate is the reference plus noise of ``rel`` of mean |a|."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(n, generator=g, dtype=torch.float32)
    b = a + rel * a.abs().mean() * torch.randn(n, generator=g, dtype=torch.float32)
    return a.to(dtype), b.to(dtype)


def with_ulps(a: torch.Tensor, dist: torch.Tensor) -> torch.Tensor:
    """A copy of ``a`` (positive values) moved up by ``dist`` ULPs, element by element."""
    idt, _ = ULP_INT[a.dtype]
    return (a.view(idt).to(torch.int64) + dist).to(idt).view(a.dtype)


def positive(dtype: torch.dtype, n: int = N, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(n, generator=g) + 0.5).to(dtype)


# ---------------------------------------------------------------- the window route


@pytest.mark.parametrize(
    "dtype",
    [torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn, torch.float8_e5m2],
    ids=lambda d: str(d).removeprefix("torch."),
)
def test_window_matches_reference_and_numpy(reference: Ref, dtype: torch.dtype) -> None:
    # float32 with 1e-6 noise: p99 of a few dozen ULPs, a plain window
    a, b = noisy(dtype, rel=1e-6 if dtype == torch.float32 else 0.01)
    _, route = check(a, b, reference)
    assert route["window"] == 1 and route["fallback"] == 0 and route["full"] == 0 and route["coarse"] == 0


def test_float32_wide_spread_takes_a_bucket_window(reference: Ref) -> None:
    # the benchmark's float32 pair: p99 of millions of ULPs, far too spread for WINDOW_MAX_BINS at full
    # resolution; a window of 65536-wide buckets plus the list of in-window distances
    a, b = noisy(torch.float32)
    m, route = check(a, b, reference)
    assert m.p99_ulp is not None and m.p99_ulp > 1 << 20
    assert route["window"] == 1 and route["coarse"] == 1 and route["refine"] == 0 and route["fallback"] == 0


def test_float32_window_past_the_fine_histogram(reference: Ref) -> None:
    # p99 between 2**17 and 2**18 ULPs: the sample's window is wider than 65536 bins, so it is kept as
    # a window of 65536-wide buckets with the list of its distances
    a = positive(torch.float32)
    g = torch.Generator().manual_seed(2)
    dist = torch.randint(0, 50, (N,), generator=g)
    tail = torch.rand(N, generator=g) < 0.05
    dist[tail] = torch.randint(1 << 17, 1 << 18, (int(tail.sum()),), generator=g)
    m, route = check(a, with_ulps(a, dist), reference)
    assert m.p99_ulp is not None and (1 << 17) <= m.p99_ulp < 1 << 18
    assert route["window"] == 1 and route["coarse"] == 1 and route["fallback"] == 0
    assert cpu.last_window is not None and cpu.last_window[2] == 16


def test_wide_plain_window(reference: Ref) -> None:
    # float16 with a thin tail spread over 10,000 ULPs: a plain window of thousands of bins
    a = positive(torch.float16)
    g = torch.Generator().manual_seed(12)
    dist = torch.randint(0, 10, (N,), generator=g)
    tail = torch.rand(N, generator=g) < 0.015
    dist[tail] = torch.randint(100, 10_100, (int(tail.sum()),), generator=g)
    m, route = check(a, with_ulps(a, dist), reference)
    assert m.nonfinite_b == 0
    assert route["window"] == 1 and route["coarse"] == 0 and route["fallback"] == 0
    assert cpu.last_window is not None and cpu.last_window[1] - cpu.last_window[0] > 1000


def test_float32_crowded_bucket_window_refines_with_a_second_pass(reference: Ref) -> None:
    # 98.7% of the distances in one bucket, the rest spread over thousands: the bucket window holds
    # nearly everything, too many to list, so its bucket is refined by a pass over the data
    a = positive(torch.float32)
    g = torch.Generator().manual_seed(3)
    dist = torch.full((N,), (100 << 16) + 5, dtype=torch.int64)
    tail = torch.rand(N, generator=g) < 0.013
    dist[tail] = torch.randint(100 << 16, 10_000 << 16, (int(tail.sum()),), generator=g)
    m, route = check(a, with_ulps(a, dist), reference)
    assert route["window"] == 1 and route["coarse"] == 1 and route["refine"] == 1 and route["fallback"] == 0


def test_window_starting_at_zero(reference: Ref) -> None:
    # nearly identical tensors (1.1% apart): the window starts at distance 0, and NaNs (placeholders at
    # distance 0 in the masked blocks) must not be counted in it
    a = positive(torch.bfloat16)
    g = torch.Generator().manual_seed(4)
    dist = torch.where(torch.rand(N, generator=g) < 0.011, torch.randint(1, 4, (N,), generator=g), 0)
    b = with_ulps(a, dist)
    nan_at = torch.randint(0, N, (500,), generator=g)
    a[nan_at[:250]] = math.nan
    b[nan_at[250:]] = math.nan
    m, route = check(a, b, reference)
    assert m.p99_ulp == 1 and m.nonfinite_a > 0
    assert route["window"] == 1 and cpu.last_window is not None and cpu.last_window[0] == 0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float8_e4m3fn], ids=lambda d: str(d)[6:])
def test_nonfinite_everywhere_including_the_sample(reference: Ref, dtype: torch.dtype) -> None:
    a, b = noisy(dtype, rel=1e-6 if dtype == torch.float32 else 0.01)
    g = torch.Generator().manual_seed(5)
    sampled = cpu.sample_mask(N).nonzero().flatten()
    picks = torch.cat([sampled[torch.randint(0, sampled.numel(), (300,), generator=g)],
                       torch.randint(0, N, (300,), generator=g)])  # fmt: skip
    specials = [math.nan] if dtype == torch.float8_e4m3fn else [math.nan, math.inf, -math.inf]
    for i, p in enumerate(picks.tolist()):
        (a if i % 3 else b)[p] = specials[i % len(specials)]
    a[picks[:50]], b[picks[:50]] = math.nan, math.nan  # same class in both: passes
    m, route = check(a, b, reference)
    assert m.nonfinite_a > 0 and m.nonfinite_b > 0 and m.nonfinite_mismatch > 0
    assert route["window"] == 1 and route["fallback"] == 0
    masked = cpu.compare_cpu(a, b, force_masked=True, **KW)  # type: ignore[arg-type]
    assert masked is not None
    assert_same(masked, m)


# ---------------------------------------------------------------- a sample that misleads


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=lambda d: str(d)[6:])
def test_sample_of_zeros_elsewhere_large_falls_back(reference: Ref, dtype: torch.dtype) -> None:
    a = positive(dtype)
    dist = torch.full((N,), 1000, dtype=torch.int64)
    dist[cpu.sample_mask(N)] = 0
    m, route = check(a, with_ulps(a, dist), reference)
    assert m.p99_ulp == 1000
    assert route["fallback"] == 1 and route["window"] == 0


def test_sample_of_large_elsewhere_small_falls_back(reference: Ref) -> None:
    # half the sampled elements are 1000 ULPs apart (0.8% of all), the rest of the pair 0 or 5 apart:
    # the sample's window sits at 1000, the p99 is 5
    a = positive(torch.bfloat16)
    g = torch.Generator().manual_seed(6)
    dist = torch.where(torch.rand(N, generator=g) < 0.02, 5, 0)
    sampled = cpu.sample_mask(N)
    dist[sampled] = torch.where(torch.rand(int(sampled.sum()), generator=g) < 0.5, 1000, 0)
    m, route = check(a, with_ulps(a, dist), reference)
    assert m.p99_ulp == 5
    assert route["fallback"] == 1


def test_sample_covers_the_whole_pair() -> None:
    mask = cpu.sample_mask(N)
    share = mask.float().mean().item()
    assert 0.9 / 64 < share < 1.1 / 64
    per_chunk = mask[: N // cpu.CHUNK * cpu.CHUNK].view(-1, cpu.CHUNK).sum(1)
    assert (per_chunk == cpu.CHUNK // 64).all()
    # runs do not line up with power-of-two rows: every column of 4096-wide rows gets sampled
    cols = mask[: N // 4096 * 4096].view(-1, 4096).any(0)
    assert cols.float().mean().item() > 0.9


def test_large_pairs_sample_about_sample_max_elements() -> None:
    assert cpu.sample_gap(N) == cpu.SAMPLE_GAP
    for n in (1 << 24, (1 << 24) + 12345, 1 << 25, 3 << 25, 1 << 28):
        gap = cpu.sample_gap(n)
        assert gap % cpu.SAMPLE_GAP == 0 and (gap // cpu.SAMPLE_GAP) & (gap // cpu.SAMPLE_GAP - 1) == 0
        runs = n // gap
        assert runs * cpu.SAMPLE_RUN <= cpu.SAMPLE_MAX and (
            gap == cpu.SAMPLE_GAP or 2 * runs * cpu.SAMPLE_RUN > cpu.SAMPLE_MAX
        )
    n = 1 << 25  # the mask follows the longer gap: one run of SAMPLE_RUN in each
    mask = cpu.sample_mask(n)
    per_gap = mask.view(-1, cpu.sample_gap(n)).sum(1)
    assert (per_gap == cpu.SAMPLE_RUN).all()


# ---------------------------------------------------------------- routes around the window


def test_threads_do_not_change_results() -> None:
    a, b = noisy(torch.bfloat16, n=4 * cpu.CHUNK + 5, seed=7)
    a[123], b[4 * cpu.CHUNK] = math.nan, math.inf
    results = []
    for t in (1, 4):
        cpu.set_threads(t)
        m, route = routed(a, b)
        assert route["window"] == 1
        results.append(m)
    assert_same(results[1], results[0])
    assert (results[0].max_ulp, results[0].p99_ulp) == numpy_ulp(a, b)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=lambda d: str(d)[6:])
def test_sample_on_many_threads_adds_their_histograms(
    reference: Ref, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    # five sampling threads started in C, their histograms added there: float32's spread over every
    # fine and many coarse bins (merged a range at a time), bfloat16's in a few small bins
    monkeypatch.setattr(cpu, "_SAMPLE_PER_THREAD", 1 << 12)
    cpu.set_threads(5)
    a, b = noisy(dtype, rel=0.3 if dtype == torch.float32 else 0.01, seed=19)
    m, route = check(a, b, reference)
    assert route["window"] == 1 and route["fallback"] == 0
    assert (m.max_ulp, m.p99_ulp) == numpy_ulp(a, b)
    lib = cpu.library()
    assert lib is not None
    team = (cpu.Sampler * 5)()
    hists = [torch.full((cpu.FINE_BINS + 1,), 7, dtype=torch.int64) for _ in range(10)]
    for i, slot in enumerate(team):  # dirty buffers, cleared in full by the kernel
        slot.fine, slot.coarse = (
            hists[2 * i].data_ptr(),
            hists[2 * i + 1].data_ptr() if dtype == torch.float32 else None,
        )
        slot.clear_fine, slot.clear_coarse = cpu.FINE_BINS, cpu.FINE_BINS + 1
    n, gap = a.numel(), cpu.sample_gap(a.numel())
    got = lib.vk_sample_par(a.data_ptr(), b.data_ptr(), cpu._DT[dtype], n, gap, cpu.SAMPLE_RUN, gap, team, 5)
    sampled = cpu.sample_mask(n)
    d = numpy_distances(a[sampled], b[sampled])
    assert got == d.size == int(hists[0].sum())
    expect = np.bincount(np.minimum(d, cpu.FINE_BINS), minlength=cpu.FINE_BINS + 1)
    assert (hists[0].numpy() == expect).all() and team[0].maxd == d.max()
    if dtype == torch.float32:
        assert (hists[1].numpy() == np.bincount(d >> 16, minlength=cpu.FINE_BINS + 1)).all()


def test_callers_on_several_threads_share_the_pool() -> None:
    # both passes run on the C kernel's pool of threads, one round at a time: callers from several
    # Python threads queue for it and each gets its own pair's exact result
    pairs = [noisy(dt, seed=20 + i) for i, dt in enumerate([torch.bfloat16, torch.float32, torch.float16] * 2)]
    cpu.set_threads(3)
    alone = [compare_tensors(a, b) for a, b in pairs]
    with ThreadPoolExecutor(max_workers=len(pairs)) as ex:
        together = list(ex.map(lambda ab: compare_tensors(*ab), pairs))
    for x, y, (a, b) in zip(alone, together, pairs):
        assert_same(y, x)
        assert (y.max_ulp, y.p99_ulp) == numpy_ulp(a, b)


def test_pool_rounds_of_alternating_sizes_count_exactly() -> None:
    # Rounds of 2 and 3 threads in turn: a pool thread left out of one round and part of the next must
    # run each of its tasks once (a review found a worker that paired one round with the next one's
    # thread count: a window histogram zeroed after it was filled, a round that ended early). The race
    # was rare (5 in 200k rounds); this checks every count of a few thousand rounds.
    lib = cpu.library()
    assert lib is not None
    a, b = noisy(torch.bfloat16, n=1 << 14, seed=40)
    d = numpy_distances(a, b)
    lo, hi = int(np.percentile(d, 95)), int(d.max()) + 1
    want_below, want_window = int((d < lo).sum()), np.bincount(d[d >= lo] - lo, minlength=hi - lo)
    hists = [torch.empty(hi - lo, dtype=torch.int64) for _ in range(3)]
    for it in range(4000):
        k = 2 + it % 2
        accs, wins = (cpu.Acc * k)(), (cpu.Win * k)()
        for w, h in zip(wins, hists):
            w.lo, w.width, w.shift, w.window = lo, hi - lo, 0, h.data_ptr()
        rc = lib.vk_compare_win_par(
            a.data_ptr(), b.data_ptr(), cpu._DT[a.dtype], a.numel(), 2048, 1e-5, 1e-3, accs, wins, k, 0
        )
        assert rc == 0
        assert sum(w.below for w in wins) == want_below, it
        assert (sum(h[: hi - lo] for h in hists[:k]).numpy() == want_window).all(), it
        assert sum(x.n_both for x in accs) == a.numel(), it


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_a_forked_child_gets_a_pool_of_its_own() -> None:
    # the parent's pool threads do not exist in a child made by fork(): its first comparison starts new
    # ones instead of waiting for the parent's forever
    a, b = noisy(torch.bfloat16, seed=30)
    cpu.set_threads(3)
    parent = compare_tensors(a, b)  # the pool exists now
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(1) as pool:
        child = pool.apply_async(_p99_in_child, (a, b)).get(timeout=120)
    assert child == (parent.max_ulp, parent.p99_ulp)


def _p99_in_child(a: torch.Tensor, b: torch.Tensor) -> tuple[int | None, int | None]:
    cpu.set_threads(3)
    m = compare_tensors(a, b)
    return m.max_ulp, m.p99_ulp


def test_small_and_non_contiguous_pairs_keep_the_full_histograms(reference: Ref) -> None:
    a, b = noisy(torch.bfloat16, n=cpu.WINDOW_FROM - 1, seed=8)
    _, route = check(a, b, reference)
    assert route["full"] == 1 and route["window"] == 0
    a, b = noisy(torch.bfloat16, n=N + 1, seed=9)
    at, bt = a.view(-1, 2).t(), b.view(-1, 2).t()  # not contiguous
    fast, route = routed(at, bt)
    assert route["full"] == 1
    assert (fast.max_ulp, fast.p99_ulp) == numpy_ulp(at.contiguous(), bt.contiguous())


def test_mixed_dtypes_have_no_ulp_metrics(reference: Ref) -> None:
    a, b = noisy(torch.float32, seed=10)
    fast, route = routed(a, b.to(torch.bfloat16))
    assert fast.max_ulp is None and not any(route.values())
    assert_same(fast, reference(a, b.to(torch.bfloat16)))


def test_sample_histograms_are_cleared_between_pairs() -> None:
    # the sample pass clears only the bins that its thread's last use may have filled: pairs that fill
    # different bins (full histograms of a small float32 pair, float32 and bfloat16 samples) in turn on
    # the same threads must each take the window and be exact
    pairs = [
        noisy(torch.float32, n=cpu.WINDOW_FROM // 2, seed=13),  # full histograms, every coarse bin
        noisy(torch.bfloat16, seed=14),
        noisy(torch.float32, seed=15),
        noisy(torch.float32, seed=16, rel=1e-6),
        noisy(torch.bfloat16, seed=17),
        noisy(torch.float32, seed=18),
    ]
    for t in (1, 2, 5):
        cpu.set_threads(t)
        for i, (a, b) in enumerate(pairs):
            m, route = routed(a, b)
            assert route["window"] == (i > 0), i
            assert (m.max_ulp, m.p99_ulp) == numpy_ulp(a, b)


# the largest distance between finite values of each format (the largest finite against its negative)
TOP_DIST = {
    torch.bfloat16: 0xFEFE,
    torch.float16: 0xF7FE,
    torch.float32: 0xFEFFFFFE,
    torch.float8_e4m3fn: 0xFC,
    torch.float8_e5m2: 0xF6,
}


def far_pair(dtype: torch.dtype, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Close values, except: 2% of pairs of opposite signs near the largest finite value (a p99 near the
    format's largest distance, a window clipped at its top), +0 against -0 (distance 0), 0 against the
    smallest subnormal of either sign; the last 40 elements (the ragged tail) are all far pairs."""
    g = torch.Generator().manual_seed(seed)
    fi = torch.finfo(dtype)
    a = torch.randn(n, generator=g, dtype=torch.float64)
    b = a * (1 + 0.01 * torch.randn(n, generator=g, dtype=torch.float64))
    u = torch.rand(n, generator=g)
    far = u < 0.02
    far[-40:] = True
    sign = torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0).double()
    a[far] = sign[far] * fi.max * (0.5 + 0.5 * torch.rand(int(far.sum()), generator=g, dtype=torch.float64))
    b[far] = -sign[far] * fi.max * (0.5 + 0.5 * torch.rand(int(far.sum()), generator=g, dtype=torch.float64))
    zeros = (u >= 0.02) & (u < 0.03)
    a[zeros], b[zeros] = 0.0, -0.0
    tiny = (u >= 0.03) & (u < 0.035)
    a[tiny], b[tiny] = 0.0, sign[tiny] * fi.tiny * fi.eps
    return a.to(dtype), b.to(dtype)


@pytest.mark.parametrize("extra", [0, 1, 17, 31])
@pytest.mark.parametrize("dtype", list(TOP_DIST), ids=lambda d: str(d).removeprefix("torch."))
def test_far_pairs_of_opposite_signs_and_signed_zeros(reference: Ref, dtype: torch.dtype, extra: int) -> None:
    # the in-register ULP code: distances up to the format's top (exact in the lanes' unsigned
    # arithmetic), a window clipped there, and ragged last groups of every length class
    a, b = far_pair(dtype, N + extra, seed=extra)
    m, route = check(a, b, reference)
    assert m.p99_ulp is not None and m.p99_ulp > TOP_DIST[dtype] * 0.9 and m.max_ulp <= TOP_DIST[dtype]
    assert route["window"] == 1 and route["fallback"] == 0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=lambda d: str(d)[6:])
def test_nonfinite_in_the_ragged_tail(reference: Ref, dtype: torch.dtype) -> None:
    # a NaN or Inf in the last, partial group of a block read without masking: the block is read again
    # with masking, and the in-window distances its first read found are dropped
    a, b = far_pair(dtype, N, seed=7)
    a[-3], b[-1] = math.inf, math.nan
    b[cpu.CHUNK - 5] = -math.inf  # the last group of the first chunk's last block
    m, route = check(a, b, reference)
    assert m.nonfinite_a == 1 and m.nonfinite_b == 2 and route["window"] == 1


def test_portable_build_matches_reference(tmp_path: Path) -> None:
    # the AVX-512 code is what this machine runs; the portable code (other CPUs) is built here on purpose
    script = """
import os, torch
from validator.kernels import cpu, _native
from validator.metrics import compare_tensors
assert _native.library() is not None, _native.build_error()
def pair(dtype, n, seed):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(n, generator=g, dtype=torch.float64) * 3
    b = a * (1 + 0.01 * torch.randn(n, generator=g, dtype=torch.float64))
    a, b = a.to(dtype), b.to(dtype)
    b[::997] = float("nan")
    return a, b
for i, dtype in enumerate([torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn]):
    a, b = pair(dtype, (1 << 21) + 13, i)
    fast = compare_tensors(a, b)
    os.environ["VALIDATOR_KERNELS"] = "0"
    ref = compare_tensors(a, b)
    del os.environ["VALIDATOR_KERNELS"]
    assert (fast.max_ulp, fast.p99_ulp, fast.pass_ratio, fast.max_abs) == (ref.max_ulp, ref.p99_ulp, ref.pass_ratio, ref.max_abs), (dtype, fast, ref)
    assert abs(fast.rel_l2 - ref.rel_l2) <= 1e-12 * ref.rel_l2, (dtype, fast.rel_l2, ref.rel_l2)
assert cpu.stats["window"] >= 4, cpu.stats
print("ok")
"""
    env = {**os.environ, "VALIDATOR_NATIVE_FLAGS": "-DVK_NO_AVX512", "VALIDATOR_KERNEL_CACHE": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]
