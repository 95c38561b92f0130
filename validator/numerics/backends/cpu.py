"""CPU backend: one fused numba pass per pair, float32 per element, float64 across blocks.

Both tensors are read as raw bytes in blocks of :data:`BLOCK` elements; ``prange`` hands groups of
:data:`GROUP` blocks to numba's threads. Each block is read from memory once, into two float32
scratch buffers (bf16: its bits shifted up by 16; fp16 and fp8: a table of every bit pattern built
once from torch's own conversion; float32 as is: all exact), and everything else reads the scratch:

- sums of a², b², d², |d|, a·d in :data:`LANES` float32 lanes, added in float64 per block;
- the largest float32 |d|, and the tolerance test counted against tolerances moved 2**-18 down and up
  (``common.EPS``, ``TINY``): equal counts are the float64 count, else the block counts again in float64;
- the ULP distances from the raw bits: their maximum, and either the counts of distances 1 and 2 (all
  distances <= 2) or each distance's key (``common.ulp_key``) added to the group's histogram.

A block whose float32 sums of squares are not finite or leave 2**-100..2**100 (NaN/Inf, squares past
float32's range, tiny values, all zeros) is computed again the reference's way: float64, NaN/Inf
masked and counted. Pairs with a float64 side take that path for every block. ``max_abs``: float32
rounding is monotonic, so the exact largest |d| is among the positions of the largest float32 |d|;
the blocks that hold it are read again in float64. The p99 bin is refined by further parallel passes.

Each block writes one row of partials and the rows are added in block order, so the result does not
depend on the thread count or on which thread ran which block. Integer and boolean pairs take the
reference (``backends.backend_for``).

Many small pairs (:func:`compare_cpu_many`) run in one call, :func:`_pass_many`: ``prange`` hands a pair at
a time to numba's threads, each block of a pair goes through the same :func:`_block` as in :func:`_pass`,
and each pair's rows are added in block order as :func:`compare_cpu` adds them, so a pair's totals are the
same bits whichever way it was measured. For pairs of a few thousand elements the calls, not the elements,
cost (benchmarks/many_pairs_bench.md).
"""

# mypy: disallow-untyped-defs=False, disallow-untyped-calls=False, disallow-untyped-decorators=False
from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator, Sequence

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
# one kernel at a time: numba's default "workqueue" threading layer must not be entered from two
# threads at once, and a call already keeps every core busy
_LOCK = threading.Lock()


def threads() -> int:
    """The threads one comparison runs on (numba's)."""
    return int(numba.get_num_threads())


@contextlib.contextmanager
def _threads_for(n: int) -> Iterator[None]:
    """Pairs of at most SMALL elements run on the calling thread alone: waking numba's other threads
    costs more than the pass, and on a loaded machine far more. Results do not depend on it."""
    if n > SMALL:
        yield
        return
    saved = numba.get_num_threads()
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
    elif clean:
        for j in range(ra.size):
            d = abs(_ordinal(ra[j] + zero, sign, mask) - _ordinal(rb[j] + zero, sign, mask))
            top = max(top, d)
            c1 += d == 1
            c2 += d == 2
    else:
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
def _exact_max(ra, rb, kinds, ta, tb, starts, part_f, first, stop):
    """The exact largest |d| over blocks first .. stop: that of the blocks whose largest float32 |d| is the
    largest (float32 rounding is monotonic), read again in float64."""
    best, top32 = part_f[first:stop, 5].max(), part_f[first:stop, 6].max()
    if top32 > 0:
        ua, ub = np.empty(BLOCK, np.uint32), np.empty(BLOCK, np.uint32)
        top = 0  # the bits of the largest |d|: they order as the values, and an integer max vectorizes
        for blk in range(first, stop):
            if part_f[blk, 6] == top32:
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
def _pass(ra, rb, kinds, ta, tb, starts, tol, spec, part_f, part_i, keys):
    """Rows of partials per block (block i: elements starts[i] .. starts[i+1], see _block) and a ULP key
    histogram per group of blocks. Returns the exact largest |d|."""
    blocks = part_f.shape[0]
    for g in prange(keys.shape[0]):
        ua, ub = np.empty(BLOCK, np.uint32), np.empty(BLOCK, np.uint32)
        ya, yb = np.empty(BLOCK), np.empty(BLOCK)
        lanes = np.empty((6, LANES), np.float32)
        for blk in range(g * GROUP, min(blocks, (g + 1) * GROUP)):
            lo = starts[blk]
            _block(ra, rb, kinds, ta, tb, lo, starts[blk + 1] - lo, tol, spec, part_f[blk], part_i[blk], keys[g], ua, ub, ya, yb, lanes)
    return _exact_max(ra, rb, kinds, ta, tb, starts, part_f, 0, blocks)


@njit(parallel=True, cache=True, nogil=True)
def _pass_many(ra, rb, kinds, ta, tb, starts, first, owner, tol, spec, part_f, part_i, keys, sums, counts, tops, out_blocks):
    """:func:`_pass` and the reductions of :func:`compare_cpu` for many pairs in one call, a pair per
    iteration: pair p is blocks first[p] .. first[p+1] (elements of the concatenated ``ra``, ``rb``).
    Per pair: sums[p] (a², b², d², |d|, a·d; added in block order, as numpy's ``sum(0)`` of the rows),
    counts[p], tops[p] (exact max |d|, max ULP), keys[p] (ULP key histogram), and the d² and a² of each
    edge block (``owner``: global edge block of each row) into out_blocks[0], [1], in row order."""
    for p in prange(sums.shape[0]):
        ua, ub = np.empty(BLOCK, np.uint32), np.empty(BLOCK, np.uint32)
        ya, yb = np.empty(BLOCK), np.empty(BLOCK)
        lanes = np.empty((6, LANES), np.float32)
        b0, b1 = first[p], first[p + 1]
        for blk in range(b0, b1):
            lo = starts[blk]
            _block(ra, rb, kinds, ta, tb, lo, starts[blk + 1] - lo, tol, spec, part_f[blk], part_i[blk], keys[p], ua, ub, ya, yb, lanes)
        tops[p, 0] = _exact_max(ra, rb, kinds, ta, tb, starts, part_f, b0, b1)
        tops[p, 1] = part_i[b0:b1, 5].max()
        for i in range(5):
            s = 0.0
            for blk in range(b0, b1):
                s += part_f[blk, i]
            sums[p, i] = s
            counts[p, i] = part_i[b0:b1, i].sum()
        for blk in range(b0, b1):
            out_blocks[0, owner[blk]] += part_f[blk, 2]
            out_blocks[1, owner[blk]] += part_f[blk, 0]


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


# ---------------------------------------------------------------- the pass over a pair


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


def _pieces(a: torch.Tensor, b: torch.Tensor, chunk_elems: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The pair as bytes: whole when both are contiguous, else contiguous copies of ``chunk_elems``."""
    if a.is_contiguous() and b.is_contiguous():
        yield _bytes(a), _bytes(b)
        return
    for ca, cb in chunk_pairs(a, b, chunk_elems):
        yield _bytes(ca), _bytes(cb)


def _refine_hist(pieces: Callable[[], Iterator[tuple[np.ndarray, np.ndarray]]], size: int, spec: np.ndarray) -> Refine:
    """common.Refine over the pair that ``pieces()`` reads (``size``: bytes per element)."""

    def refine(lo: int, shift: int, bins: int) -> list[int]:
        hist = np.zeros(bins, np.int64)
        for ra, rb in pieces():
            out = np.zeros((PARTS, bins), np.int64)
            n = ra.size // size
            with _LOCK, _threads_for(n), numba.parallel_chunksize(1):
                _refine(ra, rb, n, spec, lo, shift, out)
            hist += out.sum(0)
        return hist.tolist()

    return refine


def compare_cpu(
    a: torch.Tensor, b: torch.Tensor, *, atol: float, rtol: float, chunk_elems: int = 1 << 22, edges: Sequence[int] = ()
) -> Totals:
    """The totals of ``a`` against ``b``, both float dtypes on the CPU (``edges``: see ``common.Totals``)."""
    edges = tuple(edges) or (0, a.numel())
    kinds, spec = _setup(a.dtype, b.dtype)
    ta, tb = _table(a.dtype), _table(b.dtype)
    tol = _tolerances(atol, rtol)
    sums, counts, max_abs, max_ulp = np.zeros(5), np.zeros(5, np.int64), 0.0, 0
    keys = np.zeros(NUM_KEYS, np.int64)
    block_d2, block_a2 = np.zeros(len(edges) - 1), np.zeros(len(edges) - 1)
    pieces: Callable[[], Iterator[tuple[np.ndarray, np.ndarray]]] = lambda: _pieces(a, b, chunk_elems)  # noqa: E731
    offset = 0
    for ra, rb in pieces():
        n = ra.size // a.element_size()
        if n == 0:
            continue
        starts, owner = _rows(edges, offset, n)  # the same for every pair of one shape: cached
        offset += n
        blocks = len(starts) - 1
        part_f, part_i = np.empty((blocks, 7)), np.empty((blocks, 6), np.int64)
        group_keys = np.zeros((-(-blocks // GROUP), NUM_KEYS), np.int64)
        with _LOCK, _threads_for(n), numba.parallel_chunksize(1):  # groups handed out one at a time
            max_abs = max(max_abs, float(_pass(ra, rb, kinds, ta, tb, starts, tol, spec, part_f, part_i, group_keys)))
        sums += part_f[:, :5].sum(0)  # in float64, in an order fixed by the number of blocks
        counts += part_i[:, :5].sum(0)
        max_ulp = max(max_ulp, int(part_i[:, 5].max()))
        keys += group_keys.sum(0)
        block_d2 += np.bincount(owner, part_f[:, 2], len(block_d2))  # row order: fixed
        block_a2 += np.bincount(owner, part_f[:, 0], len(block_a2))
    ulp = None
    if spec[0]:
        p99 = p99_from_keys(keys.tolist(), int(counts[0]), _refine_hist(pieces, a.element_size(), spec), REFINE_BINS)
        ulp = (max_ulp, p99)
    return Totals(
        a.numel(), tuple(float(s) for s in sums), max_abs, tuple(int(c) for c in counts), ulp,  # type: ignore[arg-type]
        tuple(block_d2.tolist()), tuple(block_a2.tolist()),
    )  # fmt: skip


def batchable(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether :func:`compare_cpu_many` takes this pair (float dtypes on the CPU already checked): both
    contiguous, not empty and of at most SMALL elements (a larger pair keeps every thread busy alone)."""
    return 0 < a.numel() <= SMALL and a.is_contiguous() and b.is_contiguous()


def compare_cpu_many(
    pairs: Sequence[tuple[torch.Tensor, torch.Tensor, Sequence[int]]], *, atol: float, rtol: float
) -> list[Totals]:
    """:func:`compare_cpu` of each pair ``(a, b, edges)``, bit for bit, in one pass of the engine over all
    of them (a pair per thread at a time): for many small pairs, where the calls, not the elements, cost.
    Every pair has the dtypes of the first and is :func:`batchable`; the bytes are copied side by side."""
    if not pairs:
        return []
    a0, b0 = pairs[0][0], pairs[0][1]
    kinds, spec = _setup(a0.dtype, b0.dtype)
    ta, tb = _table(a0.dtype), _table(b0.dtype)
    tol = _tolerances(atol, rtol)
    numel = [a.numel() for a, _, _ in pairs]
    plans = [_rows(tuple(e), 0, n) for (_, _, e), n in zip(pairs, numel)]  # cached per shape
    rows = np.array([len(owner) for _, owner in plans])
    n_edges = np.array([len(e) - 1 for _, _, e in pairs])
    first = np.zeros(len(pairs) + 1, np.int64)
    np.cumsum(rows, out=first[1:])
    elem_at = np.cumsum([0, *numel])
    edge_at = np.zeros(len(pairs) + 1, np.int64)
    np.cumsum(n_edges, out=edge_at[1:])
    starts = np.concatenate([s[:-1] for s, _ in plans] + [elem_at[-1:]])
    starts[:-1] += np.repeat(elem_at[:-1], rows)
    owner = np.concatenate([o for _, o in plans]) + np.repeat(edge_at[:-1], rows)
    ra = torch.cat([a.reshape(-1) for a, _, _ in pairs]).view(torch.uint8).numpy()
    rb = torch.cat([b.reshape(-1) for _, b, _ in pairs]).view(torch.uint8).numpy()
    part_f, part_i = np.empty((first[-1], 7)), np.empty((first[-1], 6), np.int64)
    keys = np.zeros((len(pairs), NUM_KEYS), np.int64)
    sums, counts = np.empty((len(pairs), 5)), np.empty((len(pairs), 5), np.int64)
    tops, out_blocks = np.empty((len(pairs), 2)), np.zeros((2, edge_at[-1]))
    with _LOCK, _threads_for(int(elem_at[-1])), numba.parallel_chunksize(1):  # pairs handed out one at a time
        _pass_many(ra, rb, kinds, ta, tb, starts, first, owner, tol, spec, part_f, part_i, keys, sums, counts, tops, out_blocks)
    out = []
    sums_l, counts_l, tops_l, keys_l, at = sums.tolist(), counts.tolist(), tops.tolist(), keys.tolist(), edge_at.tolist()
    block_d2, block_a2 = out_blocks.tolist()
    for p, (a, b, _) in enumerate(pairs):
        ulp = None
        if spec[0]:
            refine = _refine_hist(functools.partial(_pieces, a, b, 1 << 22), a.element_size(), spec)  # rarely called
            ulp = (int(tops_l[p][1]), p99_from_keys(keys_l[p], counts_l[p][0], refine, REFINE_BINS))
        blocks = slice(at[p], at[p + 1])
        out.append(
            Totals(numel[p], tuple(sums_l[p]), max(0.0, tops_l[p][0]), tuple(counts_l[p]), ulp,  # type: ignore[arg-type]
                   tuple(block_d2[blocks]), tuple(block_a2[blocks]))
        )  # fmt: skip
    return out


# ---------------------------------------------------------------- ranges of a pair (validator.numerics.ranges)


def compare_cpu_range(
    a: torch.Tensor, b: torch.Tensor, *, atol: float, rtol: float, edges: Sequence[int], start: int
) -> tuple[np.ndarray, np.ndarray, float, int, np.ndarray | None]:
    """The pass of :func:`compare_cpu` over elements ``start .. start + n`` of a pair (``a``, ``b``: those
    elements, ``n`` of them, row-major; ``edges``: the whole pair's, as given to ``compare_cpu``), before
    anything is added across rows: (the rows of float64 partials a², b², d², |d|, a·d, ``[rows, 5]``; the
    five counts; the exact largest |d|; the largest ULP distance; the ULP key histogram, None without ULP
    metrics). ``start`` must be the first element of one of the whole pair's rows (a block edge, or an edge
    plus a multiple of :data:`BLOCK`): the rows are then the whole pair's, bit for bit."""
    kinds, spec = _setup(a.dtype, b.dtype)
    ta, tb = _table(a.dtype), _table(b.dtype)
    tol = _tolerances(atol, rtol)
    ra, rb = _bytes(a), _bytes(b)
    n = ra.size // a.element_size()
    starts, _ = _rows(tuple(edges), start, n)
    blocks = len(starts) - 1
    part_f, part_i = np.empty((blocks, 7)), np.empty((blocks, 6), np.int64)
    group_keys = np.zeros((-(-blocks // GROUP), NUM_KEYS), np.int64)
    max_abs = 0.0
    if blocks:
        with _LOCK, _threads_for(n), numba.parallel_chunksize(1):
            max_abs = float(_pass(ra, rb, kinds, ta, tb, starts, tol, spec, part_f, part_i, group_keys))
    keys = group_keys.sum(0) if spec[0] else None
    max_ulp = int(part_i[:, 5].max()) if blocks else 0
    return np.ascontiguousarray(part_f[:, :5]), part_i[:, :5].sum(0), max_abs, max_ulp, keys


def refine_cpu(a: torch.Tensor, b: torch.Tensor, lo: int, shift: int, bins: int) -> list[int]:
    """``common.Refine`` over the elements of ``a`` and ``b`` only (a range of a pair): counts of
    ``(d - lo) >> shift`` for the distances ``lo <= d < lo + (bins << shift)`` (integers: ranges add)."""
    _, spec = _setup(a.dtype, b.dtype)
    if not spec[0]:
        raise ValueError(f"no ULP metrics for {a.dtype} against {b.dtype}")
    return _refine_hist(lambda: iter([(_bytes(a), _bytes(b))]), a.element_size(), spec)(lo, shift, bins)


def merge_rows(rows: np.ndarray, owner: np.ndarray, n_blocks: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(sums, block d², block a²) of a contiguous pair from all its rows of partials (``[rows, 5]``, in row
    order) and the edge block of each row, added as :func:`compare_cpu` adds them: the same bits."""
    sums = np.zeros(5)
    block_d2, block_a2 = np.zeros(n_blocks), np.zeros(n_blocks)
    if len(rows):
        sums += rows.sum(0)  # in float64, one row after another, as part_f[:, :5].sum(0)
        block_d2 += np.bincount(owner, rows[:, 2], n_blocks)
        block_a2 += np.bincount(owner, rows[:, 0], n_blocks)
    return sums, block_d2, block_a2


def row_plan(edges: Sequence[int], numel: int) -> tuple[np.ndarray, np.ndarray]:
    """(starts, owner) of the rows :func:`compare_cpu` lays over a contiguous pair of ``numel`` elements."""
    return _rows(tuple(edges), 0, numel)
