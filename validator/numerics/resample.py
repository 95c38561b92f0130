"""The bootstrap's resampled sums and rel_l2 values (``floors.bootstrap_intervals``).

A resample draws each of ``n`` blocks ``counts[j, k]`` times (``counts``: ``[n, resamples]``, small unsigned
integers, exact in float64); its sums are added block after block in that order, from 0.0, the same order for
every resample, every pair and every machine (a BLAS matrix-vector product picks its own order). Each value is
one product and one sum per block, in float64, then the formulas below: IEEE arithmetic with one rounding
each, so the NumPy code here and numba's compiled loops (``resample_compiled.py``) give the same bits
(``tests/validator/numerics/test_resample.py``). A call over few pairs' blocks (at most :data:`NUMPY_WORK`
pairs x blocks, or :data:`LOADED_WORK` where numba is loaded already) runs here in NumPy, with nothing compiled
and numba not imported; a larger one in the compiled loops, which read each draw once for every pair.
"""

from __future__ import annotations

import sys

import numpy as np

NUMPY_WORK = 4096  # pairs x blocks: calls no larger run in NumPy (at 64 blocks, 1,000 resamples: about 0.1 ms a pair)
LOADED_WORK = 1024  # pairs x blocks: where numba is loaded, calls larger than this run compiled (0.01 ms a pair)
_CHUNK = 16  # pairs at a time: their [pairs, resamples] sums stay in cache


def resampled_rel_l2_many(counts: np.ndarray, d2: np.ndarray, a2: np.ndarray) -> np.ndarray:
    """rel_l2 of every resample of each pair's blocks (rows of ``d2`` and ``a2``), ``[pairs, resamples]``:
    sqrt(sd * (1 / sa)) of its sums, 0 where sd is 0 and sa is not, +inf where it is undefined (sa zero: every
    drawn reference block zero)."""
    if _compiled(d2.size):
        from validator.numerics.resample_compiled import resampled_rel_l2_many as compiled

        out: np.ndarray = compiled(counts, d2, a2)
        return out
    return rel_l2_numpy(counts, d2, a2)


def rel_l2_numpy(counts: np.ndarray, d2: np.ndarray, a2: np.ndarray) -> np.ndarray:
    """:func:`resampled_rel_l2_many` in NumPy."""
    out = np.empty((d2.shape[0], counts.shape[1]))
    for p in range(0, d2.shape[0], _CHUNK):
        sd, sa = _sums(counts, d2[p : p + _CHUNK], a2[p : p + _CHUNK])
        with np.errstate(all="ignore"):
            out[p : p + _CHUNK] = _finite_or_inf(np.sqrt(np.where(sd == 0, 0.0, sd) * (1.0 / sa)))
    return out


def ratios_many(counts: np.ndarray, d2: np.ndarray, a2: np.ndarray, fcounts: np.ndarray, fd2: np.ndarray,
                fa2: np.ndarray) -> np.ndarray:  # fmt: skip
    """Per resample, each pair's rel_l2 over its floor's (rows of d2, a2 drawn by ``counts``; of fd2, fa2 by
    ``fcounts``), ``[pairs, resamples]``: sqrt((sd / fd) * (fa / sa)), written so that a paired resample of
    all-zero reference rows (sa == fa == 0) still compares the two errors; 0 where sd is 0, the scale 1 where
    fa == sa, +inf where undefined."""
    if _compiled(d2.size + fd2.size):
        from validator.numerics.resample_compiled import ratios_many as compiled

        out: np.ndarray = compiled(counts, d2, a2, fcounts, fd2, fa2)
        return out
    return ratios_numpy(counts, d2, a2, fcounts, fd2, fa2)


def ratios_numpy(counts: np.ndarray, d2: np.ndarray, a2: np.ndarray, fcounts: np.ndarray, fd2: np.ndarray,
                 fa2: np.ndarray) -> np.ndarray:  # fmt: skip
    """:func:`ratios_many` in NumPy."""
    out = np.empty((d2.shape[0], counts.shape[1]))
    for p in range(0, d2.shape[0], _CHUNK):
        fd, fa = _sums(fcounts, fd2[p : p + _CHUNK], fa2[p : p + _CHUNK])
        sd, sa = _sums(counts, d2[p : p + _CHUNK], a2[p : p + _CHUNK])
        with np.errstate(all="ignore"):
            err = np.where(sd == 0, 0.0, sd / fd)
            scale = np.where(fa == sa, 1.0, fa / sa)
            out[p : p + _CHUNK] = _finite_or_inf(np.sqrt(err * scale))
    return out


def _sums(counts: np.ndarray, d2: np.ndarray, a2: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(Σ_j counts[j, k] d2[p, j], Σ_j counts[j, k] a2[p, j]) for every pair p and resample k, j in order."""
    shape = (d2.shape[0], counts.shape[1])
    sd, sa, term = np.zeros(shape), np.zeros(shape), np.empty(shape)
    wide = counts.astype(np.float64)  # exact: small integers
    for j in range(counts.shape[0]):
        np.multiply(wide[j], d2[:, j : j + 1], out=term)
        sd += term
        np.multiply(wide[j], a2[:, j : j + 1], out=term)
        sa += term
    return sd, sa


def _compiled(size: int) -> bool:
    """Whether a call over ``size`` pairs x blocks runs in the compiled loops: above NUMPY_WORK, or above
    LOADED_WORK where numba is loaded already (a pass over pairs above ``small.NUMPY_MAX`` loaded it), as for the
    batches of 64 pairs of many stored tensors (7 ms a call in NumPy, 0.8 compiled). Not for a few large pairs
    (16 of 64 blocks at most): their first comparison would wait for the loops' first compile (about 1 s on the
    2-core dev box) to save a millisecond. The bits are the same either way."""
    return size > NUMPY_WORK or (size > LOADED_WORK and "numba" in sys.modules)


def _finite_or_inf(v: np.ndarray) -> np.ndarray:
    v[np.isnan(v)] = np.inf
    return v
