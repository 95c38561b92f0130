"""CPU backend: one fused numba pass per pair, float32 per element, float64 across blocks.

Both tensors are read as raw bytes in blocks of at most :data:`BLOCK` elements (none across an edge of
``edges``); ``prange`` hands units of blocks to numba's threads: :data:`GROUP` blocks of one pair
(:func:`compare_cpu`), or a whole small pair (:func:`compare_cpu_many`). Each block is read from memory
once, into two float32 scratch buffers (bf16: its bits shifted up by 16; fp16 and fp8: a table of every bit
pattern built once from torch's own conversion; float32 as is: all exact), and everything else reads the
scratch:

- sums of a², b², d², |d|, a·d in :data:`LANES` float32 lanes, added in float64 per block;
- the largest float32 |d|, and the tolerance test counted against tolerances moved 2**-18 down and up
  (``common.EPS``, ``TINY``): equal counts are the float64 count, else the block counts again in float64;
- the ULP distances from the raw bits: their maximum, and either the counts of distances 1 and 2 (all
  distances <= 2) or each distance's key (``common.ulp_key``) added to the unit's histogram.

A block whose float32 sums of squares are not finite or leave 2**-100..2**100 (NaN/Inf, squares past
float32's range, tiny values, all zeros) is computed again the reference's way: float64, NaN/Inf
masked and counted. Pairs with a float64 side take that path for every block. ``max_abs``: float32
rounding is monotonic, so the exact largest |d| is among the positions of the largest float32 |d|;
each unit reads the blocks that hold its largest again in float64, unless their ULP distances show their
float32 differences exact (``common.exact_ulp``). The p99 bin is refined by further
parallel passes.

Each block writes one row of partials, and a pair's rows are added one after another (:func:`_add_rows`,
the same code for one pair, many pairs and a pair merged from ranges), so the result does not depend on
the thread count, on which thread ran which block, or on how pairs were grouped. Integer and boolean
pairs take the reference (``backends.backend_for``).
"""

# mypy: disallow-untyped-defs=False, disallow-untyped-calls=False, disallow-untyped-decorators=False
from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator, Sequence
from typing import NamedTuple

import numba
import numpy as np
import torch
from numba import njit, prange

from validator.numerics.backends.common import (
    EPS,
    KEY_BITS,
    NUM_KEYS,
    SAFE_HI,
    SAFE_LO,
    TINY,
    Refine,
    Totals,
    exact_ulp,
    p99_from_keys,
    pieces_of,
)
from validator.numerics.backends.reference import chunk_pairs

BLOCK = 2048  # elements per block: its float32 sums and counts are one row of partials
GROUP = 32  # blocks per prange iteration
LANES = 32  # float32 accumulators per sum within a block
PARTS = 16  # fixed slices of a refining pass, each with its own histogram
REFINE_BINS = 1 << 12
SMALL = 1 << 18  # elements: smaller pieces run on one thread
# BLOCK, GROUP, LANES, PARTS: chosen on the 2-core dev box (benchmarks/engine_bench.md); BLOCK and LANES
# fix the float32 summation order, nothing else in a result depends on them
F32, BF16, LUT16, LUT8, F64 = 0, 1, 2, 3, 4  # how a side is widened
_KINDS = {torch.float32: F32, torch.bfloat16: BF16, torch.float16: LUT16, torch.float64: F64}
_KINDS |= {torch.float8_e4m3fn: LUT8, torch.float8_e5m2: LUT8}
# ULP dtypes: element size, sign bit, magnitude mask, exponent field (all ones: NaN or Inf)
_ULP_BITS = {
    torch.bfloat16: (2, 15, 0x7FFF, 0x7F80),
    torch.float16: (2, 15, 0x7FFF, 0x7C00),
    torch.float32: (4, 31, 0x7FFFFFFF, 0x7F800000),
    torch.float8_e4m3fn: (1, 7, 0x7F, 0x7F),  # no Inf; NaN is S.1111.111
    torch.float8_e5m2: (1, 7, 0x7F, 0x7C),
}
_FRAC = (1 << KEY_BITS) - 1
_LOCK = threading.Lock()
# numba's own thread pool, whose idle threads wait without spinning (numba would pick an OpenMP runtime where one
# is installed, and its threads spin after each pass, taking a core from the next pair's Python on a 2-core box:
# many small pairs compared 10-40% slower; benchmarks/many_pairs_bench.md). Set before the first parallel call.
numba.config.THREADING_LAYER = "workqueue"  # type: ignore[attr-defined]


def threads() -> int:
    """The threads one comparison runs on (numba's)."""
    return int(numba.get_num_threads())


@contextlib.contextmanager
def _kernel(n: int) -> Iterator[None]:
    """Around each call of a parallel kernel over ``n`` elements: one call at a time (the "workqueue"
    threading layer must not be entered from two threads at once, and a call already keeps every core busy), prange iterations handed out one at a time, and at most SMALL elements on the calling thread
    alone (waking numba's other threads costs more than the pass, on a loaded machine far more). Results
    depend on none of it."""
    with _LOCK, numba.parallel_chunksize(1):
        saved = numba.get_num_threads()
        if n <= SMALL:
            numba.set_num_threads(1)  # this thread's setting only
        try:
            yield
        finally:
            numba.set_num_threads(saved)


@functools.cache
def _table(dtype: torch.dtype) -> np.ndarray:
    """float32 bits of every bit pattern of a 16- or 8-bit float type (torch's conversion, exact)."""
    if dtype not in (torch.float16, torch.float8_e4m3fn, torch.float8_e5m2):
        return np.zeros(1, np.uint32)
    bits = np.arange(1 << (8 * dtype.itemsize), dtype=np.uint16).astype(np.int16 if dtype.itemsize == 2 else np.uint8)
    table: np.ndarray = torch.from_numpy(bits).view(dtype).float().numpy().view(np.uint32)
    return table


# ---------------------------------------------------------------- the kernels


@njit(cache=True)
def _widen(raw, kind, table, lo, m, out):
    """float32 bits of elements lo .. lo+m of ``raw`` (bytes) into out[:m]; zeros up to whole lanes (what _fast reads)."""
    if kind == F32:
        x32 = raw[4 * lo : 4 * (lo + m)].view(np.uint32)
        for j in range(m):
            out[j] = x32[j]
    elif kind == BF16:
        x16 = raw[2 * lo : 2 * (lo + m)].view(np.uint16)
        for j in range(m):
            out[j] = np.uint32(x16[j]) << 16
    elif kind == LUT16:
        x16 = raw[2 * lo : 2 * (lo + m)].view(np.uint16)
        for j in range(m):
            out[j] = table[x16[j]]
    else:
        x8 = raw[lo : lo + m]
        for j in range(m):
            out[j] = table[x8[j]]
    out[m : -(-m // LANES) * LANES] = 0


@njit(cache=True)
def _widen64(raw, kind, table, lo, m, bits, out):
    """Elements lo .. lo+m of ``raw`` as float64 into out[:m] (``bits``: float32 scratch)."""
    if kind == F64:
        out[:m] = raw[8 * lo : 8 * (lo + m)].view(np.float64)
    else:
        _widen(raw, kind, table, lo, m, bits)
        out[:m] = bits[:m].view(np.float32)


@njit(cache=True)
def _fast(xa, xb, m, tol, lanes, f, c):
    """A block in float32 lanes: sums and largest |d| into row f, counts into row c. False: the block
    needs float64 (row c untouched). tol: atol, rtol, the band's atol, rtol down and up, band?"""
    mm = -(-m // LANES) * LANES  # whole lanes; the scratch past m is zero
    s_a2, s_b2, s_d2, s_abs, s_ad, s_top = lanes[0], lanes[1], lanes[2], lanes[3], lanes[4], lanes[5]
    lanes[:] = 0
    for k in range(0, mm, LANES):  # flat indices: a view per row of lanes costs more than the row
        for j in range(LANES):
            x, y = xa[k + j], xb[k + j]
            d = y - x
            ad = abs(d)
            s_a2[j] += x * x
            s_b2[j] += y * y
            s_d2[j] += d * d
            s_abs[j] += ad
            s_ad[j] += x * d
            s_top[j] = max(s_top[j], ad)
    a_lo, r_lo, a_hi, r_hi = np.float32(tol[2]), np.float32(tol[3]), np.float32(tol[4]), np.float32(tol[5])
    n_lo = n_hi = np.int32(0)  # counted in int32 (m <= BLOCK): the loop vectorizes twice as wide
    for j in range(m):
        ad, aa = abs(xb[j] - xa[j]), abs(xa[j])
        n_lo = np.int32(n_lo + (ad <= aa * r_lo + a_lo))
        n_hi = np.int32(n_hi + (ad <= aa * r_hi + a_hi))
    f0 = f1 = f2 = f3 = f4 = 0.0  # each sum lane by lane, the five side by side
    for j in range(LANES):
        f0 += np.float64(s_a2[j])
        f1 += np.float64(s_b2[j])
        f2 += np.float64(s_d2[j])
        f3 += np.float64(s_abs[j])
        f4 += np.float64(s_ad[j])
    f[0], f[1], f[2], f[3], f[4] = f0, f1, f2, f3, f4
    top = np.float64(s_top.max())
    # NaN/Inf make a sum NaN or large (NaN fails every test); tiny squares lose precision
    if not (SAFE_LO <= f[0] <= SAFE_HI and SAFE_LO <= f[1] <= SAFE_HI and (SAFE_LO <= f[2] <= SAFE_HI or top == 0)):
        return False
    passed = int(n_lo)
    if tol[6] == 0 or n_lo != n_hi:
        passed = 0
        for j in range(m):
            x, y = np.float64(xa[j]), np.float64(xb[j])
            passed += abs(y - x) <= tol[0] + tol[1] * abs(x)
    f[5], f[6] = 0.0, top  # the float32 max: made exact at the end of _pass
    c[0], c[1], c[2], c[3], c[4] = m, passed, 0, 0, 0
    return True


@njit(cache=True)
def _masked(xa, xb, m, atol, rtol, f, c):
    """A block the reference's way, in float64: NaN/Inf left out of the sums and counted."""
    s_a2 = s_b2 = s_d2 = s_abs = s_ad = top = 0.0
    both = passed = nf_a = nf_b = mismatch = 0
    for j in range(m):
        x, y = xa[j], xb[j]
        fin_a, fin_b = np.isfinite(x), np.isfinite(y)
        if fin_a and fin_b:
            d = y - x
            ad = abs(d)
            s_a2 += x * x
            s_b2 += y * y
            s_d2 += d * d
            s_abs += ad
            s_ad += x * d
            top = max(top, ad)
            both += 1
            passed += ad <= atol + rtol * abs(x)
        else:
            nf_a += not fin_a
            nf_b += not fin_b
            if not fin_a and not fin_b and (x == y or (np.isnan(x) and np.isnan(y))):
                passed += 1  # NaN/NaN, +Inf/+Inf or -Inf/-Inf
            else:
                mismatch += 1
    f[0], f[1], f[2], f[3], f[4], f[5], f[6] = s_a2, s_b2, s_d2, s_abs, s_ad, top, 0.0
    c[0], c[1], c[2], c[3], c[4] = both, passed, nf_a, nf_b, mismatch


@njit(cache=True)
def _ordinal(x, sign, mask):
    """Bit pattern -> point on a monotonic integer line: x, or -(x & mask) if the sign bit is set."""
    neg = x >> sign
    return ((x & mask) ^ -neg) + neg


@njit(cache=True)
def _key(d):
    """common.ulp_key: exponent and KEY_BITS leading fraction bits of d + 1 (d < 2**32)."""
    v = d + 1
    e = 0
    for step in (16, 8, 4, 2, 1):
        if v >> (e + step):
            e += step
    return (e << KEY_BITS) + (((v << KEY_BITS) >> e) & _FRAC)


@njit(cache=True)
def _ulp(ra, rb, sign, mask, em, hist, clean):
    """Largest ULP distance of a block over the positions finite in both (all of them if ``clean``);
    their keys added to hist. The bits are read as mask's integer type."""
    zero = mask - mask
    top = c1 = c2 = 0
    both = ra.size
    if clean and sign < 31:  # 8- and 16-bit: distances below 2**17, in int32 (the loop vectorizes twice as wide)
        s, mk, t, n1, n2 = np.int32(sign), np.int32(mask), np.int32(0), np.int32(0), np.int32(0)
        for j in range(ra.size):
            x, y = np.int32(_ordinal(np.int32(ra[j]), s, mk)), np.int32(_ordinal(np.int32(rb[j]), s, mk))
            d32 = np.int32(abs(x - y))
            t, n1, n2 = max(t, d32), np.int32(n1 + (d32 == 1)), np.int32(n2 + (d32 == 2))
        top, c1, c2 = int(t), int(n1), int(n2)
    else:  # float32 (distances below 2**32), or NaN/Inf in the block
        both = 0
        for j in range(ra.size):
            x, y = ra[j] + zero, rb[j] + zero
            ok = ((x & em) != em) & ((y & em) != em)
            d = abs(_ordinal(x, sign, mask) - _ordinal(y, sign, mask)) * ok
            top = max(top, d)
            both += ok
            c1 += d == 1
            c2 += d == 2
    if top <= 2:  # the usual case: three bins
        hist[_key(0)] += both - c1 - c2
        hist[_key(1)] += c1
        hist[_key(2)] += c2
        return top
    for j in range(ra.size):
        x, y = ra[j] + zero, rb[j] + zero
        if ((x & em) != em) & ((y & em) != em):
            hist[_key(abs(_ordinal(x, sign, mask) - _ordinal(y, sign, mask)))] += 1
    return top


@njit(cache=True)
def _block_ulp(ra, rb, lo, m, spec, hist, clean):
    """_ulp of a block, its bits read as 8-, 16- or 32-bit integers (spec[0]: bytes per element)."""
    size, sign, mask, em = spec[0], spec[1], spec[2], spec[3]
    if size == 1:
        return _ulp(ra[lo : lo + m], rb[lo : lo + m], sign, mask, em, hist, clean)
    if size == 2:
        x16, y16 = ra[2 * lo : 2 * (lo + m)].view(np.uint16), rb[2 * lo : 2 * (lo + m)].view(np.uint16)
        return _ulp(x16, y16, sign, mask, em, hist, clean)
    x32, y32 = ra[4 * lo : 4 * (lo + m)].view(np.uint32), rb[4 * lo : 4 * (lo + m)].view(np.uint32)
    return _ulp(x32, y32, sign, mask, em, hist, clean)


@njit(cache=True)
def _block(ra, rb, kinds, ta, tb, lo, m, tol, spec, f, c, hist, ua, ub, ya, yb, lanes):
    """Block ``lo .. lo+m`` of a pair: its row of partials f (a², b², d², |d|, a·d, exact max |d|, float32
    max |d|) and c (both, passed, non-finite a, b, mismatched, max ULP); its ULP keys added to hist."""
    fast = False
    if kinds[0] != F64 and kinds[1] != F64:
        _widen(ra, kinds[0], ta, lo, m, ua)
        _widen(rb, kinds[1], tb, lo, m, ub)
        fast = _fast(ua.view(np.float32), ub.view(np.float32), m, tol, lanes, f, c)
    if not fast:
        _widen64(ra, kinds[0], ta, lo, m, ua, ya)
        _widen64(rb, kinds[1], tb, lo, m, ub, yb)
        _masked(ya, yb, m, tol[0], tol[1], f, c)
    c[5] = _block_ulp(ra, rb, lo, m, spec, hist, fast) if spec[0] else 0


@njit(cache=True)
def _exact_max(ra, rb, kinds, ta, tb, starts, part_f, part_i, exact, first, stop, ua, ub):
    """The exact largest |d| over blocks first .. stop: that of the blocks whose largest float32 |d| is the
    largest (float32 rounding is monotonic), read again (into ua, ub) in float64, unless the block's ULP
    distances stay within ``exact`` (``common.exact_ulp``: its float32 differences are exact)."""
    best, top32 = part_f[first:stop, 5].max(), part_f[first:stop, 6].max()
    if top32 > 0:
        top = 0  # the bits of the largest |d|: they order as the values, and an integer max vectorizes
        for blk in range(first, stop):
            if part_f[blk, 6] != top32:
                continue
            if part_i[blk, 5] <= exact:  # its float32 differences are exact, and so its largest
                best = max(best, top32)
            else:
                lo = starts[blk]
                m = starts[blk + 1] - lo
                _widen(ra, kinds[0], ta, lo, m, ua)
                _widen(rb, kinds[1], tb, lo, m, ub)
                xa, xb = ua.view(np.float32), ub.view(np.float32)
                for j in range(m):
                    top = max(top, int(np.float64(abs(np.float64(xb[j]) - np.float64(xa[j]))).view(np.int64)))
        best = max(best, np.int64(top).view(np.float64))
    return best


@njit(parallel=True, cache=True, nogil=True)
def _pass(ra, rb, kinds, ta, tb, starts, units, tol, spec, exact, part_f, part_i, keys, tops):
    """The rows of partials of every block (block i: elements starts[i] .. starts[i+1], see _block), a
    prange iteration per unit u of blocks units[u] .. units[u+1]: its ULP keys into keys[u], its exact
    largest |d| into tops[u] (the largest over a pair's units is the pair's: the exact value is in a block
    that holds the pair's largest float32 |d|, whose unit reads it again)."""
    for u in prange(len(units) - 1):
        ua, ub = np.empty(BLOCK, np.uint32), np.empty(BLOCK, np.uint32)
        ya, yb = np.empty(BLOCK), np.empty(BLOCK)
        lanes = np.empty((6, LANES), np.float32)
        for blk in range(units[u], units[u + 1]):
            lo = starts[blk]
            _block(ra, rb, kinds, ta, tb, lo, starts[blk + 1] - lo, tol, spec, part_f[blk], part_i[blk], keys[u], ua, ub, ya, yb, lanes)
        tops[u] = _exact_max(ra, rb, kinds, ta, tb, starts, part_f, part_i, exact, units[u], units[u + 1], ua, ub)


@njit(cache=True)
def _add_rows(rows, owner, first, sums, blocks):
    """The rows of partials of each pair p (rows first[p] .. first[p+1]) added one after another in float64:
    a², b², d², |d|, a·d into sums[p], and the d² and a² of row r into blocks[0, owner[r]], blocks[1, owner[r]]."""
    for p in range(len(first) - 1):
        for i in range(5):
            s = 0.0
            for r in range(first[p], first[p + 1]):
                s += rows[r, i]
            sums[p, i] = s
        for r in range(first[p], first[p + 1]):
            blocks[0, owner[r]] += rows[r, 2]
            blocks[1, owner[r]] += rows[r, 0]


@njit(cache=True)
def _count(ra, rb, spec, lo, shift, out):
    """out[i] += how many positions finite in both have (d - lo) >> shift == i."""
    sign, mask, em = spec[1], spec[2], spec[3]
    for j in range(ra.size):
        x, y = np.int64(ra[j]), np.int64(rb[j])
        if ((x & em) != em) & ((y & em) != em):
            k = (abs(_ordinal(x, sign, mask) - _ordinal(y, sign, mask)) - lo) >> shift
            if 0 <= k < out.size:
                out[k] += 1


@njit(parallel=True, cache=True, nogil=True)
def _refine(ra, rb, n, spec, lo, shift, out):
    """out[p]: the counts of :func:`_count` over slice p of PARTS (integer counts: any order)."""
    size = spec[0]
    for p in prange(PARTS):
        s0, s1 = p * n // PARTS * size, (p + 1) * n // PARTS * size
        if size == 1:
            _count(ra[s0:s1], rb[s0:s1], spec, lo, shift, out[p])
        elif size == 2:
            _count(ra[s0:s1].view(np.uint16), rb[s0:s1].view(np.uint16), spec, lo, shift, out[p])
        else:
            _count(ra[s0:s1].view(np.uint32), rb[s0:s1].view(np.uint32), spec, lo, shift, out[p])


# ---------------------------------------------------------------- the passes over pairs


@functools.lru_cache(maxsize=64)
def _setup(dtype_a: torch.dtype, dtype_b: torch.dtype) -> tuple[np.ndarray, np.ndarray]:
    """How each side is widened, and the ULP bits (zeros: no ULP metrics)."""
    kinds = np.array([_KINDS[dtype_a], _KINDS[dtype_b]], np.int64)
    same = dtype_a == dtype_b and dtype_a in _ULP_BITS
    return kinds, np.array(_ULP_BITS[dtype_a] if same else (0, 0, 0, 0), np.int64)


@functools.lru_cache(maxsize=64)
def _tolerances(atol: float, rtol: float) -> np.ndarray:
    """atol, rtol, the float32 band around them (common.EPS, TINY), and whether the band is used."""
    band = rtol <= 2.0**20 and atol <= SAFE_HI  # else the tolerance test is counted in float64
    return np.array([atol, rtol, atol * (1 - EPS) - TINY, rtol * (1 - EPS), atol * (1 + EPS) + TINY, rtol * (1 + EPS), band])


def _bytes(t: torch.Tensor) -> np.ndarray:
    """The bytes of ``t`` (flattened; copied only where it is not one dense run)."""
    flat = t.reshape(-1)
    if flat.stride(0) != 1:
        flat = torch.empty_like(flat, memory_format=torch.contiguous_format).copy_(flat)
    return flat.view(torch.uint8).numpy()


@functools.lru_cache(maxsize=256)
def _rows(edges: tuple[int, ...], start: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(starts, owner): rows of at most BLOCK elements of piece ``start .. start + n``, none across an
    edge (row i: elements starts[i] .. starts[i+1] of the piece), and the edge block each row is in."""
    owner, lo, hi = np.array(pieces_of(edges, start, start + n), np.int64).reshape(-1, 3).T
    count = -(-(hi - lo) // BLOCK)  # rows of each block
    before = np.cumsum(count) - count
    starts = np.repeat(lo - BLOCK * before, count) + BLOCK * np.arange(count.sum())
    return np.append(starts, n), np.repeat(owner, count)


class _Run(NamedTuple):
    """What :func:`_run` returns: the rows of partials (``[rows, 7]``, see _block); per unit the ULP keys and
    the exact largest |d|; per pair the sums, the counts and the largest ULP distance; the block d² and a²."""

    rows: np.ndarray
    keys: np.ndarray
    tops: np.ndarray
    sums: np.ndarray
    counts: np.ndarray
    max_ulp: np.ndarray
    blocks: np.ndarray


def _run(
    ra: np.ndarray, rb: np.ndarray, dtypes: tuple[torch.dtype, torch.dtype], atol: float, rtol: float,
    starts: np.ndarray, units: np.ndarray, first: np.ndarray, owner: np.ndarray, n_blocks: int,
) -> _Run:  # fmt: skip
    """The pass over pairs laid end to end in ``ra``, ``rb`` (bytes), and its totals: row i is elements
    starts[i] .. starts[i+1] (the last start: the end), unit u (a prange iteration) rows units[u] ..
    units[u+1], pair p rows first[p] .. first[p+1]; row i's d² and a² go to edge block owner[i] of ``n_blocks``."""
    kinds, spec = _setup(*dtypes)
    exact = exact_ulp(dtypes[0]) if spec[0] else -1  # the ULP distances bound the exponent gap
    ta, tb = _table(dtypes[0]), _table(dtypes[1])
    rows = len(starts) - 1
    part_f, part_i = np.empty((rows, 7)), np.empty((rows, 6), np.int64)
    keys, tops = np.zeros((len(units) - 1, NUM_KEYS), np.int64), np.empty(len(units) - 1)
    with _kernel(int(starts[-1])):
        _pass(ra, rb, kinds, ta, tb, starts, units, _tolerances(atol, rtol), spec, exact, part_f, part_i, keys, tops)
    sums, blocks = np.empty((len(first) - 1, 5)), np.zeros((2, n_blocks))
    _add_rows(part_f, owner, first, sums, blocks)
    counts, max_ulp = np.add.reduceat(part_i[:, :5], first[:-1]), np.maximum.reduceat(part_i[:, 5], first[:-1])
    return _Run(part_f, keys, tops, sums, counts, max_ulp, blocks)


def _one(ra: np.ndarray, rb: np.ndarray, dtypes: tuple[torch.dtype, torch.dtype], atol: float, rtol: float,
         edges: tuple[int, ...], start: int) -> _Run:  # fmt: skip
    """:func:`_run` over elements ``start ..`` of one pair (``edges``: the whole pair's), GROUP blocks a unit."""
    starts, owner = _rows(edges, start, ra.size // dtypes[0].itemsize)
    rows = len(owner)
    units = np.append(np.arange(0, rows, GROUP), rows)
    return _run(ra, rb, dtypes, atol, rtol, starts, units, np.array([0, rows]), owner, len(edges) - 1)


def _pieces(a: torch.Tensor, b: torch.Tensor, chunk_elems: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The pair as bytes: whole when both are contiguous, else contiguous copies of ``chunk_elems``."""
    if a.is_contiguous() and b.is_contiguous():
        yield _bytes(a), _bytes(b)
        return
    for ca, cb in chunk_pairs(a, b, chunk_elems):
        yield _bytes(ca), _bytes(cb)


def _refiner(a: torch.Tensor, b: torch.Tensor, chunk_elems: int, spec: np.ndarray) -> Refine:
    """common.Refine over the pair, read again (:func:`_pieces`) at each call."""

    def refine(lo: int, shift: int, bins: int) -> list[int]:
        hist = np.zeros(bins, np.int64)
        for ra, rb in _pieces(a, b, chunk_elems):
            out = np.zeros((PARTS, bins), np.int64)
            n = ra.size // a.element_size()
            with _kernel(n):
                _refine(ra, rb, n, spec, lo, shift, out)
            hist += out.sum(0)
        return hist.tolist()

    return refine


def totals(numel: int, sums: list[float], max_abs: float, counts: list[int], max_ulp: int, keys: list[int] | None,
           refine: Refine, block_d2: list[float], block_a2: list[float]) -> Totals:  # fmt: skip
    """The ``Totals`` of a pair from what its pass added up (``keys``: its ULP key histogram, None without
    ULP metrics; ``refine`` is called only when the p99's key bin holds more than one distance)."""
    ulp = None if keys is None else (max_ulp, p99_from_keys(keys, counts[0], refine, REFINE_BINS))
    return Totals(numel, tuple(sums), max_abs, tuple(counts), ulp, tuple(block_d2), tuple(block_a2))  # type: ignore[arg-type]


def compare_cpu(
    a: torch.Tensor, b: torch.Tensor, *, atol: float, rtol: float, chunk_elems: int = 1 << 22, edges: Sequence[int] = ()
) -> Totals:
    """The totals of ``a`` against ``b``, both float dtypes on the CPU (``edges``: see ``common.Totals``).
    A non-contiguous pair is measured in contiguous pieces, whose sums are added in float64."""
    edges = tuple(edges) or (0, a.numel())
    _, spec = _setup(a.dtype, b.dtype)
    sums, counts, blocks = np.zeros(5), np.zeros(5, np.int64), np.zeros((2, len(edges) - 1))
    keys, max_abs, max_ulp = np.zeros(NUM_KEYS, np.int64), 0.0, 0.0
    offset = 0
    for ra, rb in _pieces(a, b, chunk_elems):
        if ra.size:
            got = _one(ra, rb, (a.dtype, b.dtype), atol, rtol, edges, offset)
            offset += ra.size // a.element_size()
            sums += got.sums[0]
            counts += got.counts[0]
            blocks += got.blocks
            keys += got.keys.sum(0)
            max_abs, max_ulp = max(max_abs, got.tops.max()), max(max_ulp, got.max_ulp[0])
    keys_l = keys.tolist() if spec[0] else None
    refine = _refiner(a, b, chunk_elems, spec)
    return totals(a.numel(), sums.tolist(), float(max_abs), counts.tolist(), int(max_ulp), keys_l, refine, *blocks.tolist())


def batchable(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether :func:`compare_cpu_many` takes this pair (float dtypes on the CPU already checked): both
    contiguous, not empty and of at most SMALL elements (a larger pair keeps every thread busy alone)."""
    return 0 < a.numel() <= SMALL and a.is_contiguous() and b.is_contiguous()


def compare_cpu_many(
    pairs: Sequence[tuple[torch.Tensor, torch.Tensor, Sequence[int]]], *, atol: float, rtol: float
) -> list[Totals]:
    """:func:`compare_cpu` of each pair ``(a, b, edges)``, bit for bit, in one run of the kernels over all of
    them, a pair a unit: for many small pairs, where the calls, not the elements, cost. Every pair has the
    dtypes of the first and is :func:`batchable`; the bytes are copied side by side."""
    if not pairs:
        return []
    dtypes = (pairs[0][0].dtype, pairs[0][1].dtype)
    _, spec = _setup(*dtypes)
    edges = [tuple(e) or (0, a.numel()) for a, _, e in pairs]
    plans = [_rows(e, 0, a.numel()) for (a, _, _), e in zip(pairs, edges)]  # cached per shape
    first = np.cumsum([0] + [len(owner) for _, owner in plans])
    at = np.cumsum([0] + [a.numel() for a, _, _ in pairs])  # first element of each pair
    edge_at = np.cumsum([0] + [len(e) - 1 for e in edges])  # first edge block of each pair
    rows = np.diff(first)
    starts = np.concatenate([s[:-1] for s, _ in plans] + [at[-1:]])
    starts[:-1] += np.repeat(at[:-1], rows)  # each pair's rows moved to where the pair is
    owner = np.concatenate([o for _, o in plans]) + np.repeat(edge_at[:-1], rows)
    ra = torch.cat([a.reshape(-1) for a, _, _ in pairs]).view(torch.uint8).numpy()
    rb = torch.cat([b.reshape(-1) for _, b, _ in pairs]).view(torch.uint8).numpy()
    got = _run(ra, rb, dtypes, atol, rtol, starts, first, first, owner, int(edge_at[-1]))
    sums, counts, tops, max_ulp, keys = (x.tolist() for x in (got.sums, got.counts, got.tops, got.max_ulp, got.keys))
    (d2, a2), at = got.blocks.tolist(), edge_at.tolist()
    return [
        totals(a.numel(), sums[p], tops[p], counts[p], max_ulp[p], keys[p] if spec[0] else None,
               _refiner(a, b, 1 << 22, spec), d2[at[p] : at[p + 1]], a2[at[p] : at[p + 1]])  # fmt: skip
        for p, (a, b, _) in enumerate(pairs)
    ]


# ---------------------------------------------------------------- ranges of a pair (validator.numerics.ranges)


def compare_cpu_range(
    a: torch.Tensor, b: torch.Tensor, *, atol: float, rtol: float, edges: Sequence[int], start: int
) -> tuple[np.ndarray, np.ndarray, float, int, np.ndarray | None]:
    """The pass of :func:`compare_cpu` over elements ``start .. start + n`` of a pair (``a``, ``b``: those
    ``n > 0`` elements, row-major; ``edges``: the whole pair's), before anything is added across rows: (the
    rows of partials a², b², d², |d|, a·d, ``[rows, 5]``; the five counts; the exact largest |d|; the largest
    ULP distance; the ULP key histogram, None without ULP metrics). ``start`` must be the first element of
    one of the whole pair's rows (a block edge, or an edge plus a multiple of :data:`BLOCK`): the rows are
    then the whole pair's, bit for bit."""
    got = _one(_bytes(a), _bytes(b), (a.dtype, b.dtype), atol, rtol, tuple(edges), start)
    keys = got.keys.sum(0) if _setup(a.dtype, b.dtype)[1][0] else None
    return np.ascontiguousarray(got.rows[:, :5]), got.counts[0], float(got.tops.max()), int(got.max_ulp[0]), keys


def refine_cpu(a: torch.Tensor, b: torch.Tensor, lo: int, shift: int, bins: int) -> list[int]:
    """``common.Refine`` over the elements of ``a`` and ``b`` only (a range of a pair): counts of
    ``(d - lo) >> shift`` for the distances ``lo <= d < lo + (bins << shift)`` (integers: ranges add)."""
    _, spec = _setup(a.dtype, b.dtype)
    if not spec[0]:
        raise ValueError(f"no ULP metrics for {a.dtype} against {b.dtype}")
    return _refiner(a, b, 1 << 22, spec)(lo, shift, bins)


def merge_rows(rows: np.ndarray, owner: np.ndarray, n_blocks: int) -> tuple[np.ndarray, np.ndarray]:
    """(sums, block d² and a²) of a contiguous pair from all its rows of partials (``[rows, 5]``, in row
    order) and the edge block of each row, added by the code :func:`compare_cpu` adds them with."""
    sums, blocks = np.zeros((1, 5)), np.zeros((2, n_blocks))
    _add_rows(rows, owner, np.array([0, len(rows)]), sums, blocks)
    return sums[0], blocks


def row_plan(edges: Sequence[int], numel: int) -> tuple[np.ndarray, np.ndarray]:
    """(starts, owner) of the rows :func:`compare_cpu` lays over a contiguous pair of ``numel`` elements."""
    return _rows(tuple(edges), 0, numel)
