"""The bootstrap's resampled sums and rel_l2 values, compiled (numba, cached on disk at first use): what
``resample.py`` runs for many pairs. Each function here has its twin there in NumPy, with the same bits.

A resample draws each of ``n`` blocks ``counts[j, k]`` times (``counts``: ``[n, resamples]``, small unsigned
integers, exact in float64); its sums are
added block after block in that order, the same order for every resample, every pair and every machine (a BLAS
matrix-vector product picks its own order). The ``_many`` kernels run the same code for each row of many pairs'
block sums (``[pairs, n]``), in one call.
"""

# mypy: disallow-untyped-defs=False, disallow-untyped-calls=False, disallow-untyped-decorators=False
from __future__ import annotations

import numpy as np

from validator.numerics.jit import njit


@njit(cache=True)
def resample_sums(counts, d2, a2):
    """(Σ_j counts[j, k] d2[j], Σ_j counts[j, k] a2[j]) for every resample k, j in order."""
    n, r = counts.shape
    sd, sa = np.zeros(r), np.zeros(r)
    for j in range(n):
        dj, aj = d2[j], a2[j]
        for k in range(r):
            sd[k] += counts[j, k] * dj
            sa[k] += counts[j, k] * aj
    return sd, sa


@njit(cache=True, error_model="numpy")
def resampled_rel_l2(counts, d2, a2):
    """rel_l2 of every resample: sqrt(sd * (1 / sa)) of its sums, 0 where sd is 0 and sa is not, +inf where it
    is undefined (sa zero: every drawn reference block zero)."""
    sd, sa = resample_sums(counts, d2, a2)
    out = np.empty(sd.size)
    for k in range(sd.size):
        v = np.sqrt((0.0 if sd[k] == 0 else sd[k]) * (1.0 / sa[k]))
        out[k] = np.inf if np.isnan(v) else v
    return out


@njit(cache=True, error_model="numpy")
def ratios(sd, sa, fd, fa):
    """sqrt((sd / fd) * (fa / sa)) per resample: the candidate's rel_l2 over the floor's, written so that a
    paired resample of all-zero reference rows (sa == fa == 0) still compares the two errors; 0 where sd is 0,
    the scale 1 where fa == sa, +inf where undefined."""
    out = np.empty(sd.size)
    for k in range(sd.size):
        err = 0.0 if sd[k] == 0 else sd[k] / fd[k]
        scale = 1.0 if fa[k] == sa[k] else fa[k] / sa[k]
        v = np.sqrt(err * scale)
        out[k] = np.inf if np.isnan(v) else v
    return out


@njit(cache=True, error_model="numpy")
def resampled_rel_l2_many(counts, d2, a2):
    """:func:`resampled_rel_l2` of each pair's blocks (rows of d2 and a2): ``[pairs, resamples]``."""
    out = np.empty((d2.shape[0], counts.shape[1]))
    for p in range(d2.shape[0]):
        _put_row(out, p, resampled_rel_l2(counts, d2[p], a2[p]))
    return out


@njit(cache=True, error_model="numpy")
def ratios_many(counts, d2, a2, fcounts, fd2, fa2):
    """:func:`ratios` of each pair's resampled sums (rows of d2, a2 drawn by ``counts``) over its floor's (rows
    of fd2, fa2 drawn by ``fcounts``): ``[pairs, resamples]``."""
    out = np.empty((d2.shape[0], counts.shape[1]))
    for p in range(d2.shape[0]):
        fd, fa = resample_sums(fcounts, fd2[p], fa2[p])
        sd, sa = resample_sums(counts, d2[p], a2[p])
        _put_row(out, p, ratios(sd, sa, fd, fa))
    return out


@njit(cache=True)
def _put_row(out, p, row):
    """out[p] = row, element by element: a row assignment compiles numba's shape-error messages (seconds of
    compiling at first use, for nothing)."""
    for k in range(row.size):
        out[p, k] = row[k]
