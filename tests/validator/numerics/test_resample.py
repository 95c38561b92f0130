"""validator.numerics.resample: the NumPy code and numba's compiled loops give the same bits."""

from __future__ import annotations

import numpy as np
import pytest

from validator.numerics import resample, resample_compiled


def _blocks(rng: np.random.Generator, pairs: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    d2 = rng.random((pairs, n)) ** 3 * 10.0 ** rng.integers(-30, 5, (pairs, 1))
    a2 = rng.random((pairs, n)) * 10.0 ** rng.integers(-5, 30, (pairs, 1))
    d2[0, :], a2[1, :] = 0.0, 0.0  # a pair without error; a pair whose reference is all zeros (undefined)
    a2[2, ::2] = 0.0  # zero reference blocks: some resamples draw only them
    return d2, a2


def _counts(rng: np.random.Generator, n: int, resamples: int = 1000) -> np.ndarray:
    idx = rng.integers(0, n, (resamples, n)) + n * np.arange(resamples)[:, None]
    return np.ascontiguousarray(np.bincount(idx.ravel(), minlength=resamples * n).reshape(resamples, n).T, np.uint8)


@pytest.mark.parametrize("n", [1, 3, 16, 64])
def test_numpy_and_compiled_agree_bitwise(n: int) -> None:
    rng = np.random.default_rng(n)
    d2, a2 = _blocks(rng, 5, n)
    fd2, fa2 = _blocks(rng, 5, n)
    fa2[3] = a2[3]  # the scale 1 where the floor's reference sums equal the candidate's
    counts, fcounts = _counts(rng, n), _counts(rng, n)
    assert d2.size + fd2.size <= resample.NUMPY_WORK  # NumPy's side
    got = resample.resampled_rel_l2_many(counts, d2, a2)
    want = resample_compiled.resampled_rel_l2_many(counts, d2, a2)
    assert got.tobytes() == want.tobytes()
    assert np.isinf(got[1]).all() and (got[0] == 0).all()
    for fc in (counts, fcounts):  # paired draws, and independent ones
        got = resample.ratios_many(counts, d2, a2, fc, fd2, fa2)
        assert got.tobytes() == resample_compiled.ratios_many(counts, d2, a2, fc, fd2, fa2).tobytes()


def test_large_calls_run_compiled_with_the_same_bits() -> None:
    rng = np.random.default_rng(7)
    d2, a2 = _blocks(rng, resample.NUMPY_WORK // 16 + 1, 16)
    counts = _counts(rng, 16)
    got = resample.resampled_rel_l2_many(counts, d2, a2)  # above NUMPY_WORK: the compiled loops
    one = [resample.resampled_rel_l2_many(counts, d2[p : p + 1], a2[p : p + 1]) for p in range(0, len(d2), 97)]
    assert np.concatenate(one).tobytes() == got[::97].tobytes()
