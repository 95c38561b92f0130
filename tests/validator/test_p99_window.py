"""The speculative p99 window (validator.kernels._finish): the rule that turns a sample's histograms
into ``[lo, hi)``, and the exact p99 read back from a count below plus the window's histogram. Checked
against independent NumPy int64 computations."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from validator.kernels import _finish as f


def _hists(d: np.ndarray, wide: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    fine = np.bincount(np.minimum(d, f.FINE_BINS), minlength=f.FINE_BINS + 1)
    coarse = np.bincount(d >> 16, minlength=1 << 16) if wide else None
    return torch.from_numpy(fine), (torch.from_numpy(coarse) if coarse is not None else None)


def _np_rank_value(d: np.ndarray, rank: int) -> int:
    return 0 if rank < 1 else int(np.sort(d)[rank - 1])


def _np_p99(d: np.ndarray) -> int:
    return int(np.sort(d)[math.ceil(0.99 * d.size) - 1])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_window_bounds_are_the_sample_quantiles(seed: int) -> None:
    rng = np.random.default_rng(seed)
    d = np.abs(rng.standard_normal(200_000) * 40).astype(np.int64)
    got = f.p99_window(*_hists(d, wide=False), d.size)
    delta = max(2e-4, 6 * math.sqrt(0.99 * 0.01 / d.size))
    r_lo, r_hi = math.floor((0.99 - delta) * d.size), math.ceil((0.99 + delta) * d.size)
    assert got == (_np_rank_value(d, r_lo), _np_rank_value(d, r_hi) + 1)
    lo, hi = got
    assert lo <= _np_p99(d) < hi  # the sample's own p99 lies inside


def test_window_beyond_the_fine_range_uses_the_coarse_buckets() -> None:
    rng = np.random.default_rng(3)
    d = (np.abs(rng.standard_normal(100_000)) * 300_000).astype(np.int64)  # float32-like spread
    lo, hi = f.p99_window(*_hists(d, wide=True), d.size)  # type: ignore[misc]
    assert lo % (1 << 16) == 0 and (hi - 1) % (1 << 16) == 0
    assert lo <= _np_p99(d) < hi
    assert hi - lo <= f.WINDOW_MAX_BINS


def test_no_window_for_small_samples_or_too_wide_ones() -> None:
    d = np.arange(1000, dtype=np.int64)
    assert f.p99_window(*_hists(d, wide=False), d.size) is None  # below WINDOW_MIN_SAMPLE
    assert f.window_ranks(f.WINDOW_MIN_SAMPLE - 1) is None
    rng = np.random.default_rng(4)
    d = (rng.random(100_000) * 2**31).astype(np.int64)  # uniform over 2**31: the window spans ~2**21
    assert f.p99_window(*_hists(d, wide=True), d.size) is None


def test_all_equal_distances_give_a_one_bin_window() -> None:
    d = np.full(50_000, 7, dtype=np.int64)
    assert f.p99_window(*_hists(d, wide=False), d.size) == (7, 8)
    d = np.zeros(50_000, dtype=np.int64)
    assert f.p99_window(*_hists(d, wide=False), d.size) == (0, 1)


@pytest.mark.parametrize("lo,width", [(0, 5), (30, 40), (90, 3), (200, 1)])
def test_p99_in_window_matches_numpy(lo: int, width: int) -> None:
    rng = np.random.default_rng(lo + width)
    d = np.abs(rng.standard_normal(123_457) * 50).astype(np.int64)
    below = int((d < lo).sum())
    sel = d[(d >= lo) & (d < lo + width)] - lo
    window = torch.from_numpy(np.bincount(sel, minlength=width))
    got = f.p99_in_window(d.size, below, window, lo)
    p99 = _np_p99(d)
    assert got == (p99 if lo <= p99 < lo + width else None)


def test_p99_in_window_edges() -> None:
    assert f.p99_in_window(0, 0, torch.zeros(4, dtype=torch.int64), 0) is None
    one = torch.tensor([1], dtype=torch.int64)
    assert f.p99_in_window(1, 0, one, 9) == 9
    assert f.p99_in_window(1, 1, one, 9) is None  # the rank lies below the window
