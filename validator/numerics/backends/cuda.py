"""GPU backend: one fused Triton pass over a pair, float32 per element, float64 across programs.

Each program reads ``TILES`` tiles of ``BLOCK`` elements of both tensors once, keeps per-lane float32
sums (a², b², d², |d|, a·d), the largest |d|, two counts of the tolerance test and the ULP distances'
largest value and first two moments, reduces them once and writes one row of partials. A one-program
kernel adds the rows in a fixed order, so a pair gives the same bits on every call; the host reads one
small buffer back. Where float32 could differ from the float64 reference, the program checks and
reads its tiles again:

- NaN/Inf, or squares outside float32's comfortable range (``common.SAFE_LO``/``SAFE_HI``): the whole
  program in float64 with the reference's masking (``_masked_program``); float64 inputs always;
- the tolerance test is counted against tolerances moved 2**-18 down and up; if the counts differ,
  the program counts again in float64 (``_passed_program``), rounding like the reference;
- ``max_abs``: float32 rounding is monotonic, so the exact largest |d| is among the positions whose
  float32 |d| is the largest; ``_exact_max_kernel`` recomputes those in float64;
- the exact p99: a program whose ULP distances are all 0, 1 or 2 gives their counts from two moments;
  any other adds its key histogram (``common.ulp_key``) with integer atomics (``_ulp_program``), and
  rare refining passes follow (``_refine_kernel``). Integer sums do not depend on order.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence

import numpy as np
import torch
import triton
import triton.language as tl

from validator.numerics.backends.common import (
    EPS,
    KEY_BITS,
    SAFE_HI,
    SAFE_LO,
    TINY,
    Totals,
    p99_from_keys,
    pieces_of,
    ulp_spec,
)
from validator.numerics.backends.reference import chunk_pairs, compute_device

BLOCK = 512  # elements per tile
TILES = 32  # tiles per program
NUM_WARPS = 4
STAGES = 3  # tiles in flight per program (Triton's software pipelining)
VECTOR = 16  # elements: programs start and end on multiples of this where the block edges allow
REFINE_BINS = 256  # bins of one refining pass (a tl.histogram per tile)
# BLOCK, TILES, NUM_WARPS, STAGES: chosen on an H200 (benchmarks/engine_bench.md); results do not depend on them
# beyond float32 rounding inside a program
_BITS = {1: 8, 2: 16, 4: 32}  # element size -> bits of the ULP ordinal
_F8 = {torch.float8_e4m3fn: 1, torch.float8_e5m2: 2}
_LO, _HI = tl.constexpr(SAFE_LO), tl.constexpr(SAFE_HI)
_FLOATS, _INTS = tl.constexpr(7), tl.constexpr(9)  # a program's partials: float64 values, then int64 values


@triton.jit
def _ordinal(x, BITS: tl.constexpr):
    """Bit pattern -> point on a monotonic integer line (int32, int64 for 32-bit floats)."""
    if BITS == 32:
        s = x.to(tl.int32, bitcast=True).to(tl.int64)
        return tl.where(s < 0, -(s & 0x7FFFFFFF), s)
    elif BITS == 16:
        s = x.to(tl.int16, bitcast=True).to(tl.int32)
        return tl.where(s < 0, -(s & 0x7FFF), s)
    else:
        s = x.to(tl.int8, bitcast=True).to(tl.int32)
        return tl.where(s < 0, -(s & 0x7F), s)


@triton.jit
def _f64(x):
    """x in float64 (8- and 16-bit floats by way of float32, exactly)."""
    if x.dtype.is_fp64():
        return x
    else:
        return x.to(tl.float32).to(tl.float64)


@triton.jit
def _finite(x, raw, F8: tl.constexpr):
    """Finite positions of x. For float8 (F8: 1 e4m3fn, 2 e5m2) the bits decide, whatever the decoder."""
    if F8 == 1:  # no Inf; NaN is S.1111.111
        return (raw.to(tl.int8, bitcast=True) & 0x7F) != 0x7F
    elif F8 == 2:  # exponent 11111: Inf or NaN
        return (raw.to(tl.int8, bitcast=True) & 0x7C) != 0x7C
    else:
        return tl.abs(x) < float("inf")  # False for NaN and +-Inf


@triton.jit
def _nan(x, raw, F8: tl.constexpr):
    if F8 == 1:
        return (raw.to(tl.int8, bitcast=True) & 0x7F) == 0x7F
    elif F8 == 2:
        return (raw.to(tl.int8, bitcast=True) & 0x7F) > 0x7C
    else:
        return x != x


@triton.jit
def _key(dist, BITS: tl.constexpr, KEY_BITS: tl.constexpr):
    """common.ulp_key: exponent and KEY_BITS leading fraction bits of dist + 1 (exact conversions)."""
    if BITS == 32:
        f = (dist + 1).to(tl.float64).to(tl.int64, bitcast=True)
        return ((f >> (52 - KEY_BITS)) - (1023 << KEY_BITS)).to(tl.int32)
    else:
        f = (dist + 1).to(tl.float32).to(tl.int32, bitcast=True)
        return (f >> (23 - KEY_BITS)) - (127 << KEY_BITS)


@triton.jit
def _unfused(product, keep, other):
    """``product`` where ``keep``: the select between the multiply and the add it feeds keeps the
    compiler from fusing them, so the float64 tolerance test rounds like the reference's."""
    return tl.where(keep, product, other)


@triton.jit
def _span(seg_ptr, K, ALIGN: tl.constexpr):
    """Elements start .. end of this program: part pid % K of K near-equal parts of segment pid // K (a
    segment: seg[s] .. seg[s + 1], inside one block of the edges). With ALIGN > 1 every segment edge is a
    multiple of ALIGN, and so are the parts' edges: the compiler then knows the loads are whole vectors."""
    pid = tl.program_id(0)
    s, i = pid // K, (pid % K).to(tl.int64)
    lo, hi = tl.multiple_of(tl.load(seg_ptr + s), ALIGN), tl.multiple_of(tl.load(seg_ptr + s + 1), ALIGN)
    start = lo + (hi - lo) * i // K // ALIGN * ALIGN
    end = lo + (hi - lo) * (i + 1) // K // ALIGN * ALIGN
    return tl.multiple_of(start, ALIGN), tl.multiple_of(end, ALIGN)


@triton.jit
def _load(a_ptr, b_ptr, end, start, t, BLOCK: tl.constexpr):
    """Tile t of the program's elements start .. end (int32 offsets from the program's base)."""
    offs = t * BLOCK + tl.arange(0, BLOCK)
    inb = offs < tl.minimum(end - start, 1 << 30).to(tl.int32)
    return tl.load(a_ptr + start + offs, mask=inb, other=0.0), tl.load(b_ptr + start + offs, mask=inb, other=0.0), inb


@triton.jit
def _masked_program(
    a_ptr, b_ptr, end, start, atol, rtol, BLOCK: tl.constexpr, TILES: tl.constexpr, A8: tl.constexpr, B8: tl.constexpr
):  # fmt: skip
    """A program's tiles as the reference reads them: float64, NaN/Inf left out of the sums and counted."""
    s_a2 = tl.cast(0.0, tl.float64)
    s_b2, s_d2, s_abs, s_ad, top = s_a2, s_a2, s_a2, s_a2, s_a2
    c_both = tl.cast(0, tl.int64)
    c_pass, c_nfa, c_nfb, c_mis = c_both, c_both, c_both, c_both
    for t in tl.range(TILES):
        a, b, inb = _load(a_ptr, b_ptr, end, start, t, BLOCK)
        ya, yb = _f64(a), _f64(b)
        fa, fb = _finite(ya, a, A8), _finite(yb, b, B8)
        both = fa & fb & inb
        nan_a, nan_b = _nan(ya, a, A8), _nan(yb, b, B8)
        # non-finite in both and of the same kind: both NaN, or both Inf of one sign
        same = inb & ~fa & ~fb & ((nan_a & nan_b) | (~nan_a & ~nan_b & ((ya < 0) == (yb < 0))))
        ya, yb = tl.where(both, ya, 0.0), tl.where(both, yb, 0.0)
        e = yb - ya
        ae = tl.abs(e)
        s_a2 += tl.sum(ya * ya)
        s_b2 += tl.sum(yb * yb)
        s_d2 += tl.sum(e * e)
        s_abs += tl.sum(ae)
        s_ad += tl.sum(ya * e)
        top = tl.maximum(top, tl.max(ae))
        c_both += tl.sum(both.to(tl.int32))
        c_pass += tl.sum(((both & (ae <= atol + _unfused(rtol * tl.abs(ya), both, ya))) | same).to(tl.int32))
        c_nfa += tl.sum((inb & ~fa).to(tl.int32))
        c_nfb += tl.sum((inb & ~fb).to(tl.int32))
        c_mis += tl.sum((inb & ~both & ~same).to(tl.int32))
    return s_a2, s_b2, s_d2, s_abs, s_ad, top, c_both, c_pass, c_nfa, c_nfb, c_mis


@triton.jit
def _passed_program(a_ptr, b_ptr, end, start, atol, rtol, BLOCK: tl.constexpr, TILES: tl.constexpr):
    """The tolerance test of a program's (finite) tiles in float64, as the reference rounds it."""
    count = tl.cast(0, tl.int64)
    for t in tl.range(TILES):
        a, b, inb = _load(a_ptr, b_ptr, end, start, t, BLOCK)
        a64, b64 = _f64(a), _f64(b)
        count += tl.sum((inb & (tl.abs(b64 - a64) <= atol + _unfused(rtol * tl.abs(a64), inb, a64))).to(tl.int32))
    return count


@triton.jit
def _ulp_program(
    a_ptr, b_ptr, end, start, keys_ptr, BLOCK: tl.constexpr, TILES: tl.constexpr, BITS: tl.constexpr,
    A8: tl.constexpr, KEY_BITS: tl.constexpr, NKEYS: tl.constexpr, HIST: tl.constexpr,
):  # fmt: skip
    """Largest ULP distance of a program's positions finite in both, and (HIST) their key histogram
    added to keys_ptr; positions left out count as distance 0 (the host takes them off)."""
    top = tl.cast(0, tl.int64)
    hist = tl.zeros([NKEYS], dtype=tl.int32)
    for t in tl.range(TILES):
        a, b, inb = _load(a_ptr, b_ptr, end, start, t, BLOCK)
        both = inb & _finite(a.to(tl.float32), a, A8) & _finite(b.to(tl.float32), b, A8)
        dist = tl.where(both, tl.abs(_ordinal(a, BITS) - _ordinal(b, BITS)), 0)
        top = tl.maximum(top, tl.max(dist).to(tl.int64))
        if HIST:
            hist += tl.histogram(_key(dist, BITS, KEY_BITS), NKEYS)
    if HIST:
        tl.atomic_add(keys_ptr + tl.arange(0, NKEYS), hist.to(tl.int64), mask=hist > 0)
    return top


@triton.jit
def _pass_kernel(
    a_ptr, b_ptr, seg_ptr, K, tol_ptr, part_ptr, keys_ptr,
    BLOCK: tl.constexpr, TILES: tl.constexpr, BITS: tl.constexpr, A8: tl.constexpr, B8: tl.constexpr,
    F64: tl.constexpr, BAND: tl.constexpr, KEY_BITS: tl.constexpr, NKEYS: tl.constexpr, HIST: tl.constexpr,
    STAGES: tl.constexpr, ALIGN: tl.constexpr,
):  # fmt: skip
    """One program's partial totals: row ``pid`` of ``part_ptr`` (_FLOATS float64, then _INTS int64 as bits)."""
    pid = tl.program_id(0)
    start, end = _span(seg_ptr, K, ALIGN)
    atol, rtol = tl.load(tol_ptr), tl.load(tol_ptr + 1)  # float64 (a float argument would be float32)
    top32 = tl.cast(0.0, tl.float64)
    small, m1, m2 = tl.cast(0, tl.int64), tl.cast(0, tl.int64), tl.cast(0, tl.int64)
    if F64:  # a float64 input: the reference's float64 throughout
        s_a2, s_b2, s_d2, s_abs, s_ad, top64, c_both, c_pass, c_nfa, c_nfb, c_mis = _masked_program(
            a_ptr, b_ptr, end, start, atol, rtol, BLOCK, TILES, A8, B8
        )
        top_ulp = top32.to(tl.int64)
    else:  # float32 per element, accumulated per lane, reduced once; checked before it counts
        a_lo, r_lo = tl.load(tol_ptr + 2).to(tl.float32), tl.load(tol_ptr + 3).to(tl.float32)
        a_hi, r_hi = tl.load(tol_ptr + 4).to(tl.float32), tl.load(tol_ptr + 5).to(tl.float32)
        v_a2 = tl.zeros([BLOCK], dtype=tl.float32)
        v_b2, v_d2, v_abs, v_ad, v_top = v_a2, v_a2, v_a2, v_a2, v_a2
        v_lo = tl.zeros([BLOCK], dtype=tl.int32)
        v_hi, v_bad, v_m1, v_m2 = v_lo, v_lo, v_lo, v_lo
        v_ulp = tl.zeros([BLOCK], dtype=tl.int64 if BITS == 32 else tl.int32)
        for t in tl.range(TILES, num_stages=STAGES):  # STAGES: the loads of later tiles go out early
            a, b, inb = _load(a_ptr, b_ptr, end, start, t, BLOCK)
            xa, xb = a.to(tl.float32), b.to(tl.float32)
            d = xb - xa
            ad = tl.abs(d)
            v_a2 += xa * xa
            v_b2 += xb * xb
            v_d2 += d * d
            v_abs += ad
            v_ad += xa * d
            v_top = tl.maximum(v_top, ad)
            aa = tl.abs(xa)
            if BAND:  # counted against tolerances moved down and up: equal counts are the exact count
                v_lo += (inb & (ad <= aa * r_lo + a_lo)).to(tl.int32)
                v_hi += (inb & (ad <= aa * r_hi + a_hi)).to(tl.int32)
            if A8 or B8:  # float8: the bits say what is finite
                v_bad |= (~(_finite(xa, a, A8) & _finite(xb, b, B8))).to(tl.int32)
            if BITS != 0:  # valid while the program is clean (checked below)
                dist = tl.abs(_ordinal(a, BITS) - _ordinal(b, BITS))
                v_ulp = tl.maximum(v_ulp, dist)
                if HIST:
                    v_m1 += dist.to(tl.int32)
                    v_m2 += (dist * dist).to(tl.int32)
        qa, qb, qd, m = tl.sum(v_a2), tl.sum(v_b2), tl.sum(v_d2), tl.max(v_top)
        # NaN/Inf anywhere or squares past float32's range make a sum large or NaN (NaN <= x is False);
        # tiny squares (or all zeros, which the float64 path handles too) lose precision
        clean = (qa <= _HI) & (qb <= _HI) & (qd <= _HI) & (tl.max(v_bad) == 0)
        clean = clean & (qa >= _LO) & (qb >= _LO) & ((qd >= _LO) | (m == 0))
        if clean:
            s_a2, s_b2, s_d2 = qa.to(tl.float64), qb.to(tl.float64), qd.to(tl.float64)
            s_abs, s_ad = tl.sum(v_abs).to(tl.float64), tl.sum(v_ad).to(tl.float64)
            top64, top32 = tl.cast(0.0, tl.float64), m.to(tl.float64)  # top32: made exact by _exact_max_kernel
            c_both = (end - start).to(tl.int64)
            c_nfa, c_nfb, c_mis = c_both * 0, c_both * 0, c_both * 0
            n_lo, n_hi = tl.sum(v_lo), tl.sum(v_hi)
            if not BAND:
                n_hi = n_lo + 1
            if n_lo == n_hi:
                c_pass = n_lo.to(tl.int64)
            else:
                c_pass = _passed_program(a_ptr, b_ptr, end, start, atol, rtol, BLOCK, TILES)
            top_ulp = tl.max(v_ulp).to(tl.int64)
        else:
            s_a2, s_b2, s_d2, s_abs, s_ad, top64, c_both, c_pass, c_nfa, c_nfb, c_mis = _masked_program(
                a_ptr, b_ptr, end, start, atol, rtol, BLOCK, TILES, A8, B8
            )
            top_ulp = top32.to(tl.int64) - 1  # marks "read the distances again" below
    if BITS != 0:  # top_ulp < 0: the distances must be read again, masked
        if HIST:
            if (top_ulp >= 0) & (top_ulp <= 2):  # distances 0, 1, 2 only: counts from two moments
                small, m1, m2 = small + 1, tl.sum(v_m1).to(tl.int64), tl.sum(v_m2).to(tl.int64)
            else:
                top_ulp = _ulp_program(a_ptr, b_ptr, end, start, keys_ptr, BLOCK, TILES, BITS, A8, KEY_BITS, NKEYS, HIST)
        elif top_ulp < 0:
            top_ulp = _ulp_program(a_ptr, b_ptr, end, start, keys_ptr, BLOCK, TILES, BITS, A8, KEY_BITS, NKEYS, HIST)
    row = part_ptr + pid * (_FLOATS + _INTS)
    tl.store(row + 0, s_a2)
    tl.store(row + 1, s_b2)
    tl.store(row + 2, s_d2)
    tl.store(row + 3, s_abs)
    tl.store(row + 4, s_ad)
    tl.store(row + 5, top64)
    tl.store(row + 6, top32)
    tl.store(row + 7, c_both.to(tl.float64, bitcast=True))
    tl.store(row + 8, c_pass.to(tl.float64, bitcast=True))
    tl.store(row + 9, c_nfa.to(tl.float64, bitcast=True))
    tl.store(row + 10, c_nfb.to(tl.float64, bitcast=True))
    tl.store(row + 11, c_mis.to(tl.float64, bitcast=True))
    tl.store(row + 12, top_ulp.to(tl.float64, bitcast=True))
    tl.store(row + 13, small.to(tl.float64, bitcast=True))
    tl.store(row + 14, m1.to(tl.float64, bitcast=True))
    tl.store(row + 15, m2.to(tl.float64, bitcast=True))


@triton.jit
def _finish_kernel(part_ptr, programs, out_ptr, seg_out_ptr, K, CHUNK: tl.constexpr):
    """Adds the programs' partials in a fixed order. Program 0: sums and counts added, maxima taken;
    out: the 5 sums, max top64, max top32, then the 5 counts, max ULP, small, m1, m2 (as int64 bits).
    Program s + 1: d² and a² of segment s (its K programs) into seg_out[2s], seg_out[2s + 1]."""
    rows = tl.arange(0, CHUNK)
    pid = tl.program_id(0)
    if pid > 0:
        base = (pid - 1).to(tl.int64) * K
        acc_d, acc_a = tl.zeros([CHUNK], dtype=tl.float64), tl.zeros([CHUNK], dtype=tl.float64)
        for r0 in tl.range(0, K, CHUNK, num_stages=3):
            r = (base + r0 + rows) * 16
            inside = r0 + rows < K
            acc_d += tl.load(part_ptr + r + 2, mask=inside, other=0.0)
            acc_a += tl.load(part_ptr + r, mask=inside, other=0.0)
        tl.store(seg_out_ptr + 2 * (pid - 1), tl.sum(acc_d))
        tl.store(seg_out_ptr + 2 * (pid - 1) + 1, tl.sum(acc_a))
    else:
        cols = tl.arange(0, 16)
        is_int = cols >= _FLOATS
        is_max = (cols == 5) | (cols == 6) | (cols == 12)
        acc_f = tl.zeros([CHUNK, 16], dtype=tl.float64)
        acc_i = tl.zeros([CHUNK, 16], dtype=tl.int64)
        for start in tl.range(0, programs, CHUNK, num_stages=3):
            r = start + rows
            v = tl.load(part_ptr + r[:, None] * 16 + cols[None, :], mask=(r < programs)[:, None], other=0.0)
            vi = v.to(tl.int64, bitcast=True)
            acc_f = tl.where(is_max[None, :], tl.maximum(acc_f, v), acc_f + v)
            acc_i = tl.where(is_max[None, :], tl.maximum(acc_i, vi), acc_i + vi)
        total_f = tl.where(is_max, tl.max(acc_f, 0), tl.sum(acc_f, 0))
        total_i = tl.where(is_max, tl.max(acc_i, 0), tl.sum(acc_i, 0))
        tl.store(out_ptr + cols, tl.where(is_int, total_i.to(tl.float64, bitcast=True), total_f))


@triton.jit
def _exact_max_kernel(
    a_ptr, b_ptr, seg_ptr, K, part_ptr, out_ptr,
    BLOCK: tl.constexpr, TILES: tl.constexpr, A8: tl.constexpr, B8: tl.constexpr, ALIGN: tl.constexpr,
):  # fmt: skip
    """The exact largest |d| of the float32 programs: float32 rounding is monotonic, so it is the largest
    float64 |d| among the positions whose float32 |d| equals the largest float32 |d|, g = out[6]. Only
    the programs that saw g read their tiles again; out[5] takes the maximum (int64 order = float order
    for values >= 0)."""
    pid = tl.program_id(0)
    g = tl.load(out_ptr + 6)
    if (tl.load(part_ptr + pid * (_FLOATS + _INTS) + 6) == g) & (g > 0):
        g32 = g.to(tl.float32)
        best = tl.cast(0.0, tl.float64)
        start, end = _span(seg_ptr, K, ALIGN)
        for t in tl.range(TILES):
            a, b, inb = _load(a_ptr, b_ptr, end, start, t, BLOCK)
            xa, xb = a.to(tl.float32), b.to(tl.float32)
            hit = inb & (tl.abs(xb - xa) == g32) & _finite(xa, a, A8) & _finite(xb, b, B8)
            best = tl.maximum(best, tl.max(tl.where(hit, tl.abs(_f64(b) - _f64(a)), 0.0)))
        tl.atomic_max(out_ptr.to(tl.pointer_type(tl.int64)) + 5, best.to(tl.int64, bitcast=True))


@triton.jit
def _refine_kernel(
    a_ptr, b_ptr, n, lo, shift, out_ptr,
    BLOCK: tl.constexpr, TILES: tl.constexpr, BITS: tl.constexpr, A8: tl.constexpr, NBINS: tl.constexpr,
):  # fmt: skip
    """Counts of (d - lo) >> shift in bins [0, NBINS) over the positions finite in both; the rest go
    to bin NBINS (of 2 * NBINS), which the host does not read."""
    pid = tl.program_id(0)
    hist = tl.zeros([2 * NBINS], dtype=tl.int32)
    for t in tl.range(TILES):
        offs = (pid * TILES + t).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        inb = offs < n
        a = tl.load(a_ptr + offs, mask=inb, other=0.0)
        b = tl.load(b_ptr + offs, mask=inb, other=0.0)
        both = inb & _finite(a.to(tl.float32), a, A8) & _finite(b.to(tl.float32), b, A8)
        rel = tl.abs(_ordinal(a, BITS) - _ordinal(b, BITS)) - lo
        idx = rel >> shift
        inside = both & (rel >= 0) & (idx < NBINS)
        hist += tl.histogram(tl.where(inside, idx, NBINS).to(tl.int32), 2 * NBINS)
    tl.atomic_add(out_ptr + tl.arange(0, 2 * NBINS), hist, mask=hist > 0)


def _pieces(a: torch.Tensor, b: torch.Tensor, device: torch.device, chunk_elems: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Flat contiguous pieces on ``device``: the whole pair when it is already there and contiguous."""
    if a.device == b.device == device and a.is_contiguous() and b.is_contiguous():
        return [(a.reshape(-1), b.reshape(-1))] if a.numel() else []
    return [(ca.to(device).contiguous(), cb.to(device).contiguous()) for ca, cb in chunk_pairs(a, b, chunk_elems)]


@functools.lru_cache(maxsize=64)
def _tolerances(atol: float, rtol: float, device: torch.device) -> torch.Tensor:
    """atol, rtol and the float32 band around them (common.EPS, TINY), on the device, once per pair of values."""
    band = [atol * (1 - EPS) - TINY, rtol * (1 - EPS), atol * (1 + EPS) + TINY, rtol * (1 + EPS)]
    return torch.tensor([atol, rtol, *band], dtype=torch.float64).to(device)


@functools.lru_cache(maxsize=256)
def _on_device(values: tuple[int, ...], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64).to(device)


def compare_cuda(
    a: torch.Tensor, b: torch.Tensor, *, atol: float, rtol: float, chunk_elems: int, p99: bool = True,
    edges: Sequence[int] = (),
) -> Totals:  # fmt: skip
    device = compute_device(a, b)
    spec = ulp_spec(a, b)
    edges = edges or (0, a.numel())
    bits = _BITS[a.element_size()] if spec is not None else 0
    hist = bool(bits) and p99
    nkeys = (bits << KEY_BITS) if hist else 1  # keys of the distances below 2**bits
    f8 = {"A8": _F8.get(a.dtype, 0), "B8": _F8.get(b.dtype, 0)}
    f64 = torch.float64 in (a.dtype, b.dtype)
    band = rtol <= 2.0**20 and atol <= SAFE_HI  # else the tolerance test is counted in float64
    tol = _tolerances(atol, rtol, device)
    per_program = BLOCK * TILES
    pieces = _pieces(a, b, device, chunk_elems)
    if not pieces:
        zeros = (0.0,) * (len(edges) - 1)
        return Totals(a.numel(), (0.0,) * 5, 0.0, (0,) * 5, (0, 0) if spec is not None else None, zeros, zeros)
    # each piece's blocks (segments), each cut into K programs of at most per_program elements
    segs, offset = [], 0
    for ca, _ in pieces:
        segs.append(pieces_of(edges, offset, offset + ca.numel()))
        offset += ca.numel()
    # whole vectors (16 elements) when every segment edge allows it; a part may then run ALIGN - 1 longer
    align = VECTOR if all(lo % VECTOR == 0 for found in segs for _, lo, _ in found) and all(
        ca.numel() % VECTOR == 0 for ca, _ in pieces
    ) else 1
    K = triton.cdiv(max(hi - lo for found in segs for _, lo, hi in found), per_program - align + 1)
    programs = [K * len(found) for found in segs]
    nseg = sum(len(found) for found in segs)
    part = torch.empty(sum(programs), 16, dtype=torch.float64, device=device)
    out = torch.zeros(16 + nkeys + 2 * nseg, dtype=torch.float64, device=device)  # totals, key histogram, segments
    keys = out.view(torch.int64)[16 : 16 + nkeys]
    rows = [part[r - p : r] for p, r in zip(programs, itertools.accumulate(programs))]
    seg_edges = [_on_device((*(lo for _, lo, _ in found), found[-1][2]), device) for found in segs]
    launch = {"BLOCK": BLOCK, "TILES": TILES, "num_warps": NUM_WARPS, "enable_fp_fusion": True}
    for (ca, cb), p, mine, se in zip(pieces, programs, rows, seg_edges):
        _pass_kernel[(p,)](
            ca, cb, se, K, tol, mine, keys, BITS=bits, **f8, F64=f64, BAND=band,
            KEY_BITS=KEY_BITS, NKEYS=nkeys, HIST=hist, STAGES=STAGES, ALIGN=align, **launch,
        )  # fmt: skip
    _finish_kernel[(1 + nseg,)](part, part.shape[0], out, out[16 + nkeys :], K, CHUNK=256, num_warps=4, enable_fp_fusion=True)
    for (ca, cb), p, mine, se in zip(pieces, programs, rows, seg_edges) if not f64 else []:
        _exact_max_kernel[(p,)](ca, cb, se, K, mine, out, **f8, ALIGN=align, **launch)
    res = out.cpu()
    floats, ints = res[:7].tolist(), res.view(torch.int64)[7 : 16 + nkeys].tolist()
    owner = [j for found in segs for j, _, _ in found]
    block_d2 = np.bincount(owner, res[16 + nkeys :: 2].numpy(), len(edges) - 1)  # segment order: fixed
    block_a2 = np.bincount(owner, res[17 + nkeys :: 2].numpy(), len(edges) - 1)
    counts = tuple(ints[:5])
    ulp: tuple[int, int | None] | None = None
    if spec is not None:
        ulp = (ints[5], None)
        if hist:
            small, m1, m2 = ints[6:9]
            binned = ints[9:]
            n2 = (m2 - m1) // 2  # programs whose distances are 0, 1 or 2: n1 + 2 n2 = m1, n1 + 4 n2 = m2
            binned[0] += small * per_program - (m1 - 2 * n2) - n2
            binned[1 << KEY_BITS] += m1 - 2 * n2  # key of distance 1
            binned[(1 << KEY_BITS) + (1 << (KEY_BITS - 1))] += n2  # key of distance 2
            binned[0] -= sum(programs) * per_program - counts[0]  # padding and non-finite: distance 0

            def refine(lo: int, shift: int, bins: int) -> list[int]:
                found = torch.zeros(2 * REFINE_BINS, dtype=torch.int32, device=device)
                for ca, cb in pieces:
                    _refine_kernel[(triton.cdiv(ca.numel(), per_program),)](
                        ca, cb, ca.numel(), lo, shift, found, BITS=bits, A8=f8["A8"], NBINS=REFINE_BINS, **launch
                    )
                return found[:bins].cpu().tolist()

            ulp = (ints[5], p99_from_keys(binned, counts[0], refine, REFINE_BINS))
    return Totals(
        a.numel(), tuple(floats[:5]), max(floats[5], 0.0), counts, ulp, tuple(block_d2.tolist()), tuple(block_a2.tolist())
    )
