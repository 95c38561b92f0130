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
@pytest.mark.parametrize("pairs", [5, 40])
def test_numpy_and_compiled_agree_bitwise(n: int, pairs: int) -> None:
    rng = np.random.default_rng(n)
    d2, a2 = _blocks(rng, pairs, n)
    fd2, fa2 = _blocks(rng, pairs, n)
    fa2[3] = a2[3]  # the scale 1 where the floor's reference sums equal the candidate's
    counts, fcounts = _counts(rng, n), _counts(rng, n)
    got = resample.rel_l2_numpy(counts, d2, a2)
    assert got.tobytes() == resample_compiled.resampled_rel_l2_many(counts, d2, a2).tobytes()
    assert got.tobytes() == resample.resampled_rel_l2_many(counts, d2, a2).tobytes()  # whichever it picks
    assert np.isinf(got[1]).all() and (got[0] == 0).all()
    for fc in (counts, fcounts):  # paired draws, and independent ones
        got = resample.ratios_numpy(counts, d2, a2, fc, fd2, fa2)
        assert got.tobytes() == resample_compiled.ratios_many(counts, d2, a2, fc, fd2, fa2).tobytes()
        assert got.tobytes() == resample.ratios_many(counts, d2, a2, fc, fd2, fa2).tobytes()
