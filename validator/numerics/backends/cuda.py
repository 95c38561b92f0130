"""GPU backend: a Triton pass over a pair, float32 per element (float64 with a float64 side), float64 across
programs.

A pair's elements are cut into programs by its size and edges alone, so a pair gives the same bits on
every call. Two kernels, then one small read back to the host:

1. ``_pass_kernel``: each program reads its elements of both tensors once and keeps per-lane sums (a², b², d²,
   |d|, a·d; float32, float64 where a side is float64), the largest |d|, two counts of the tolerance test and
   the largest ULP distance; it reduces them once and writes one row of partials (see ``ROW_WIDTH``). Whole tiles are
   read without a mask (a few instructions an element fewer), a last part-tile under one. A group of FLUSH tiles
   whose sums come out past float32's range (NaN/Inf among them) is read again at once (pipelined as the first
   read), NaN/Inf left out and counted. Where the pass could differ from the float64 reference it marks the row:
   - float32 squares outside float32's comfortable range (``common.SAFE_LO``, ``SAFE_HI``) with NaN/Inf left
     out: the whole row;
   - the tolerance test counted against tolerances moved 2**-20 down and up, with different counts: the count
     (float64 pairs count it as the reference does);
   - the largest |d|: float32 rounding is monotonic, so the exact largest |d| is among the positions whose
     float32 |d| equals the largest of all rows', g. The float32 difference of two 8- or 16-bit floats is
     exact unless their exponents are far apart, which only a large ULP distance allows (``common.exact_ulp``);
     a row whose distances stay within that bound holds an exact largest |d|, any other is marked.
2. ``_fix_kernel``: the programs of marked rows read their elements again and redo what was marked in
   float64, as the reference rounds it (a marked largest |d|: the whole row, where its float32 largest is g);
   the others only read their row. The program that finishes the last
   row of a segment (a block of the edges, or its part in one piece) adds that segment's d² and a², and the last
   program to finish adds all rows; each in a fixed order (sums and counts added, maxima taken).

Integer sums do not depend on order. Each kernel is launched through ``JITFunction.run`` once per kind of pair,
then by the binary that returned (:func:`_launch`).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
import triton
import triton.language as tl
from triton.compiler import CompiledKernel

from validator.numerics.backends.common import SAFE_HI, SAFE_LO, Totals, blocks_meeting, exact_ulp, tolerances, ulp_spec
from validator.numerics.backends.reference import chunk_pairs, compute_device
from validator.numerics.backends.small import empty_totals

TILE = 1024  # elements per tile
MIN_TILES = 16  # tiles per program at least
PROGRAMS = 1024  # programs of a pair at most (one per block of the edges at least)
NUM_WARPS = 4
FIX_ROWS = 1  # rows per program of the second kernel
STAGES = 3  # tiles in flight per program (Triton's software pipelining)
FLUSH = 64  # tiles whose float32 per-lane sums are added into float64 at once (the sums' accuracy)
VECTOR = 16  # elements: programs start and end on multiples of this where the block edges allow
# TILE, MIN_TILES, NUM_WARPS, STAGES: tuning constants, set by timing alternatives on an H200; FLUSH and PROGRAMS
# (with FIX_ROWS): timed against alternatives by benchmarks/cuda_tuning.py (benchmarks/engine_bench.md). Results do
# not depend on them beyond float32 rounding inside a program
_BITS = {1: 8, 2: 16, 4: 32}  # element size -> bits of the ULP ordinal
_F8 = {torch.float8_e4m3fn: 1, torch.float8_e5m2: 2}
_LO, _HI = tl.constexpr(SAFE_LO), tl.constexpr(SAFE_HI)
_CHUNK = tl.constexpr(256)  # rows read at once
# the columns of a row of partials, float64 (counts as int64 bits): a², b², d², |d|, a·d, the exact largest |d|
# (-1: still to find), the largest float32 |d| (-1: the row is redone in float64), then finite in both, passed,
# non-finite in a, in b, mismatched, max ULP, NaN in a, in b, the same infinity in both; -1 in a count marks
# work for _fix_kernel
A2, B2, D2, ABS, AD, MAX_EXACT, MAX32 = (tl.constexpr(i) for i in range(7))
BOTH, PASSED, NF_A, NF_B, MISMATCH, MAX_ULP, NAN_A, NAN_B, INF_SAME = (tl.constexpr(i) for i in range(7, 16))
ROW_WIDTH = 16


@triton.jit
def _ordinal(x, BITS: tl.constexpr):
    """Bit pattern -> point on a monotonic integer line (int32, int64 for 32-bit floats), as
    ``numerics.p99.ulp_distance``: s where the sign bit is clear, else -(s & mask)."""
    IT: tl.constexpr = tl.int32 if BITS == 32 else (tl.int16 if BITS == 16 else tl.int8)
    WIDE: tl.constexpr = tl.int64 if BITS == 32 else tl.int32
    s = x.to(IT, bitcast=True).to(WIDE)
    neg = s >> (WIDE.primitive_bitwidth - 1)
    return (s ^ (neg & ((1 << (BITS - 1)) - 1))) - neg


@triton.jit
def _finite(x, raw, F8: tl.constexpr, NAN: tl.constexpr = 0):
    """Finite positions of x (with NAN: its NaN positions). For float8 (F8: 1 e4m3fn, 2 e5m2) the bits decide,
    whatever the decoder: e4m3fn has no Inf and its NaN is S.1111.111; e5m2's exponent 11111 is Inf or NaN."""
    if F8 == 1:
        low = raw.to(tl.int8, bitcast=True) & 0x7F
        return (low == 0x7F) if NAN else (low != 0x7F)
    elif F8 == 2:
        low = raw.to(tl.int8, bitcast=True) & 0x7F
        return (low > 0x7C) if NAN else ((low & 0x7C) != 0x7C)
    else:
        return (x != x) if NAN else (tl.abs(x) < float("inf"))  # False for NaN and +-Inf


@triton.jit
def _unfused(product, keep, other):
    """``product`` where ``keep``: the select between the multiply and the add it feeds keeps the
    compiler from fusing them, so the float64 tolerance test rounds like the reference's."""
    return tl.where(keep, product, other)


@triton.jit
def _span(seg_ptr, K, pid, ALIGN: tl.constexpr):
    """Row pid's elements: their start and number, part pid % K of K near-equal parts of segment pid // K
    (seg[s] .. seg[s + 1], inside one block of the edges). With ALIGN > 1 every segment edge is a multiple
    of ALIGN, and so are the parts' edges: the compiler then knows the loads are whole vectors."""
    s, i = pid // K, (pid % K).to(tl.int64)
    lo, hi = tl.multiple_of(tl.load(seg_ptr + s), ALIGN), tl.multiple_of(tl.load(seg_ptr + s + 1), ALIGN)
    start = lo + (hi - lo) * i // K // ALIGN * ALIGN
    end = lo + (hi - lo) * (i + 1) // K // ALIGN * ALIGN
    return tl.multiple_of(start, ALIGN), (end - start).to(tl.int32)


@triton.jit
def _load(a_ptr, b_ptr, n, t, TILE: tl.constexpr, MASKED: tl.constexpr):
    """Tile t of a program's n elements (a_ptr, b_ptr: its first) and where it is inside them. Without
    MASKED the tile is known to be whole: the loads need no mask, and tests of ``inb`` fold away."""
    offs = t * TILE + tl.arange(0, TILE)
    if MASKED:
        inb = offs < n
        return tl.load(a_ptr + offs, mask=inb, other=0.0), tl.load(b_ptr + offs, mask=inb, other=0.0), inb
    else:
        return tl.load(a_ptr + offs), tl.load(b_ptr + offs), tl.full([TILE], 1, tl.int1)


@triton.jit
def _put(row, i, value):
    tl.store(row + i, value.to(tl.int64).to(tl.float64, bitcast=True))


@triton.jit
def _counts(row, both, passed, nf_a, nf_b, mismatch, max_ulp, nan_a, nan_b, inf_same):
    _put(row, BOTH, both)
    _put(row, PASSED, passed)
    _put(row, NF_A, nf_a)
    _put(row, NF_B, nf_b)
    _put(row, MISMATCH, mismatch)
    _put(row, MAX_ULP, max_ulp)
    _put(row, NAN_A, nan_a)
    _put(row, NAN_B, nan_b)
    _put(row, INF_SAME, inf_same)


@triton.jit
def _floats(row, s_a2, s_b2, s_d2, s_abs, s_ad, top):
    tl.store(row + A2, s_a2.to(tl.float64))
    tl.store(row + B2, s_b2.to(tl.float64))
    tl.store(row + D2, s_d2.to(tl.float64))
    tl.store(row + ABS, s_abs.to(tl.float64))
    tl.store(row + AD, s_ad.to(tl.float64))
    tl.store(row + MAX_EXACT, top.to(tl.float64))


@triton.jit
def _layout(buf_ptr, nseg):
    """Where a call's one buffer (float64 at buf_ptr, its counts int64 bits) keeps what: the totals (a ROW_WIDTH),
    the segments' d² and a², the count of finished programs and each segment's count of finished rows, then
    from a multiple of ROW_WIDTH on the rows of partials. Returns the rows, segments and counts."""
    head = (16 + 3 * nseg + 1 + 15) // 16 * 16  # ROW_WIDTH = 16
    ibuf_ptr = buf_ptr.to(tl.pointer_type(tl.int64), bitcast=True)
    return buf_ptr + head, buf_ptr + 16, ibuf_ptr + 16 + 2 * nseg


@triton.jit
def _widen(x, F64: tl.constexpr):
    """x in the pass's arithmetic: float64 where a side is float64 (8- and 16-bit floats by way of float32,
    exactly), else float32."""
    if x.dtype.is_fp64():
        return x
    elif F64:
        return x.to(tl.float32).to(tl.float64)
    else:
        return x.to(tl.float32)


@triton.jit
def _group(
    a_ptr, b_ptr, n, t0, t1, atol, rtol, a_lo, r_lo, a_hi, r_hi,
    TILE: tl.constexpr, BITS: tl.constexpr, A8: tl.constexpr, B8: tl.constexpr, F64: tl.constexpr,
    BAND: tl.constexpr, STAGES: tl.constexpr, MASKED: tl.constexpr, CHECK: tl.constexpr,
):  # fmt: skip
    """Tiles t0 .. t1 of a program: per-lane sums (a², b², d², |d|, a·d) and maxima, reduced once. Without
    CHECK the tiles are read as finite (the fast path: a NaN/Inf shows as a sum that is not finite); with
    CHECK, NaN/Inf are left out and counted: positions not finite in a, in b, in either, NaN in a, in b, the
    same non-finite value in both (NaN or one infinity), and, of those, the same infinity."""
    CT: tl.constexpr = tl.float64 if F64 else tl.float32
    v_a2 = tl.zeros([TILE], dtype=CT)
    v_b2, v_d2, v_abs, v_ad, v_top = v_a2, v_a2, v_a2, v_a2, v_a2
    v_lo = tl.zeros([TILE], dtype=tl.int32)
    v_hi, v_bad, v_nfa, v_nfb, v_out, v_nan_a, v_nan_b, v_same, v_inf = (v_lo,) * 9
    v_ulp = tl.zeros([TILE], dtype=tl.int64 if BITS == 32 else tl.int32)
    for t in tl.range(t0, t1, num_stages=STAGES):  # later tiles' loads go out early
        a, b, inb = _load(a_ptr, b_ptr, n, t, TILE, MASKED)
        xa, xb = _widen(a, F64), _widen(b, F64)
        both = inb
        if CHECK:
            fa, fb = _finite(xa, a, A8), _finite(xb, b, B8)
            both = inb & fa & fb
            nan_a, nan_b = _finite(xa, a, A8, 1), _finite(xb, b, B8, 1)
            inf_same = inb & ~fa & ~fb & ~nan_a & ~nan_b & ((xa < 0) == (xb < 0))
            same = (inb & nan_a & nan_b) | inf_same
            v_nfa += (inb & ~fa).to(tl.int32)
            v_nfb += (inb & ~fb).to(tl.int32)
            v_out += (inb & ~both).to(tl.int32)
            v_nan_a += (inb & nan_a).to(tl.int32)
            v_nan_b += (inb & nan_b).to(tl.int32)
            v_same += same.to(tl.int32)
            v_inf += inf_same.to(tl.int32)
            xa, xb = tl.where(both, xa, 0.0), tl.where(both, xb, 0.0)
        elif A8 or B8:  # float8: the bits say what is finite, whatever the decoder
            v_bad |= (~(_finite(xa, a, A8) & _finite(xb, b, B8))).to(tl.int32)
        d = xb - xa
        ad = tl.abs(d)
        v_a2 += xa * xa
        v_b2 += xb * xb
        v_d2 += d * d
        v_abs += ad
        v_ad += xa * d
        v_top = tl.maximum(v_top, ad)
        aa = tl.abs(xa)
        if F64:  # the reference's own float64 test
            v_lo += (both & (ad <= atol + _unfused(rtol * aa, both, xa))).to(tl.int32)
        elif BAND:  # counted against tolerances moved down and up: equal counts are the exact count
            # (a float32 |d| of 0 is an exact 0: it passes whatever atol >= 0)
            v_lo += (both & (ad <= tl.maximum(aa * r_lo + a_lo, 0.0))).to(tl.int32)
            v_hi += (both & (ad <= aa * r_hi + a_hi)).to(tl.int32)
        if BITS != 0:
            dist = tl.abs(_ordinal(a, BITS) - _ordinal(b, BITS))
            if CHECK:
                dist = tl.where(both, dist, 0)
            v_ulp = tl.maximum(v_ulp, dist)
    return (
        tl.sum(v_a2).to(tl.float64), tl.sum(v_b2).to(tl.float64), tl.sum(v_d2).to(tl.float64),
        tl.sum(v_abs).to(tl.float64), tl.sum(v_ad).to(tl.float64), tl.max(v_top).to(tl.float64),
        tl.sum(v_lo), tl.sum(v_hi), tl.max(v_ulp).to(tl.int64), tl.max(v_bad), tl.sum(v_nfa), tl.sum(v_nfb),
        tl.sum(v_out), tl.sum(v_nan_a),
        tl.sum(v_nan_b), tl.sum(v_same), tl.sum(v_inf),
    )  # fmt: skip


@triton.jit(do_not_specialize=["K", "first", "nseg", "zero"])  # see _launch
def _pass_kernel(
    a_ptr, b_ptr, seg_ptr, K, tol_ptr, buf_ptr, first, nseg, zero,
    TILE: tl.constexpr, BITS: tl.constexpr, A8: tl.constexpr, B8: tl.constexpr, F64: tl.constexpr,
    BAND: tl.constexpr, EXACT_ULP: tl.constexpr, STAGES: tl.constexpr, FLUSH: tl.constexpr, ALIGN: tl.constexpr,
):  # fmt: skip
    """Row ``first + pid`` of the rows (see ROW_WIDTH, :func:`_layout`): this program's partials, or its marks. With
    ``zero``, program 0 also clears the counts of finished programs and rows, for _fix_kernel."""
    part_ptr, _, count_ptr = _layout(buf_ptr, nseg)
    start, n = _span(seg_ptr, K, tl.program_id(0), ALIGN)
    a_ptr, b_ptr = a_ptr + start, b_ptr + start
    row = part_ptr + (first + tl.program_id(0)) * 16
    if (tl.program_id(0) == 0) & (zero != 0):
        for c0 in tl.range(0, nseg + 1, 256):
            c = c0 + tl.arange(0, 256)
            tl.store(count_ptr + c, tl.zeros([256], dtype=tl.int64), mask=c < nseg + 1)
    atol, rtol = tl.load(tol_ptr), tl.load(tol_ptr + 1)
    a_lo, r_lo = tl.load(tol_ptr + 2).to(tl.float32), tl.load(tol_ptr + 3).to(tl.float32)
    a_hi, r_hi = tl.load(tol_ptr + 4).to(tl.float32), tl.load(tol_ptr + 5).to(tl.float32)
    s_a2 = tl.cast(0.0, tl.float64)
    s_b2, s_d2, s_abs, s_ad, top = s_a2, s_a2, s_a2, s_a2, s_a2
    c_lo, over = tl.cast(0, tl.int32), tl.cast(0, tl.int32)
    c_hi, c_nfa, c_nfb, c_out, c_nan_a, c_nan_b, c_same, c_inf = c_lo, c_lo, c_lo, c_lo, c_lo, c_lo, c_lo, c_lo
    top_ulp = tl.cast(0, tl.int64)
    whole = n // TILE
    for MASKED in tl.static_range(2):  # the whole tiles, then the last part of one (if any) under a mask
        lo, hi = whole * MASKED, whole + (tl.cdiv(n, TILE) - whole) * MASKED
        for t0 in tl.range(lo, hi, FLUSH):  # FLUSH tiles at most in float32 per lane, then float64
            t1 = tl.minimum(t0 + FLUSH, hi)
            qa, qb, qd, qabs, qad, qtop, qlo, qhi, qulp, qbad, qnfa, qnfb, qout, qnan_a, qnan_b, qsame, qinf = _group(
                a_ptr, b_ptr, n, t0, t1, atol, rtol, a_lo, r_lo, a_hi, r_hi,
                TILE, BITS, A8, B8, F64, BAND, STAGES, MASKED, 0,
            )  # fmt: skip
            # NaN/Inf (float32: or squares past its range) make a sum large or not a number: these tiles again,
            # NaN/Inf left out and counted
            if F64:
                fine = (qa < float("inf")) & (qb < float("inf")) & (qd < float("inf")) & (qbad == 0)
            else:
                fine = (qa <= _HI) & (qb <= _HI) & (qd <= _HI) & (qbad == 0)
            if fine == 0:
                qa, qb, qd, qabs, qad, qtop, qlo, qhi, qulp, qbad, qnfa, qnfb, qout, qnan_a, qnan_b, qsame, qinf = _group(
                    a_ptr, b_ptr, n, t0, t1, atol, rtol, a_lo, r_lo, a_hi, r_hi,
                    TILE, BITS, A8, B8, F64, BAND, STAGES, MASKED, 1,
                )  # fmt: skip
                if not F64:  # past float32's range with NaN/Inf left out: the row in float64
                    over += ((qa <= _HI) & (qb <= _HI) & (qd <= _HI)).to(tl.int32) ^ 1
            s_a2, s_b2, s_d2, s_abs, s_ad = s_a2 + qa, s_b2 + qb, s_d2 + qd, s_abs + qabs, s_ad + qad
            top, top_ulp = tl.maximum(top, qtop), tl.maximum(top_ulp, qulp)
            c_lo, c_hi, c_out = c_lo + qlo, c_hi + qhi, c_out + qout
            c_nfa, c_nfb = c_nfa + qnfa, c_nfb + qnfb
            c_nan_a, c_nan_b, c_same, c_inf = c_nan_a + qnan_a, c_nan_b + qnan_b, c_same + qsame, c_inf + qinf
    if F64:
        c_pass = c_lo + c_same
        clean = over == 0
        top_exact = top
    else:
        if BAND:
            c_pass = tl.where(c_lo == c_hi, c_lo + c_same, -1)
        else:  # tolerances past the band's range: counted in float64
            c_pass = c_lo * 0 - 1
        # tiny squares (or all zeros, which float64 handles too) lose precision in float32; _fix_kernel's count
        # of the tolerance test reads finite rows only
        tiny = (s_a2 < _LO) | (s_b2 < _LO) | ((s_d2 < _LO) & (top != 0))
        clean = (over == 0) & ~tiny & ((c_pass >= 0) | (c_out == 0))
        top_exact = tl.where(top_ulp <= EXACT_ULP, top, -1.0)
    _floats(row, s_a2, s_b2, s_d2, s_abs, s_ad, top_exact)
    tl.store(row + MAX32, tl.where(clean, top, -1.0))
    _counts(row, tl.where(clean, n - c_out, -1), c_pass, c_nfa, c_nfb, c_out - c_same, top_ulp, c_nan_a, c_nan_b, c_inf)


@triton.jit
def _fix_row(
    a_ptr, b_ptr, seg_ptr, K, pid, row, mine, atol, rtol, part_ptr, programs,
    TILE: tl.constexpr, BITS: tl.constexpr, A8: tl.constexpr, B8: tl.constexpr, ALIGN: tl.constexpr,
    STAGES: tl.constexpr,
):  # fmt: skip
    """What the pass marked in ``row`` (its values ``mine``, as int64 bits), done again in float64 by
    :func:`_group` over all the row's tiles: the whole row with NaN/Inf left out and counted (a row marked so, or
    one whose largest float32 |d| may be inexact and is the largest of all rows, g), or its count of the tolerance
    test (a marked count is in a row of finite values only)."""
    start, n = _span(seg_ptr, K, pid, ALIGN)
    a_ptr, b_ptr = a_ptr + start, b_ptr + start
    cols = tl.arange(0, 16)
    tiles = tl.cdiv(n, TILE)
    whole = tl.sum(tl.where(cols == BOTH, mine, 0)) < 0
    if tl.sum(tl.where(cols == MAX_EXACT, mine, 0)) < 0:
        top = tl.sum(tl.where(cols == MAX32, mine, 0)).to(tl.float64, bitcast=True)
        g = tl.cast(-1.0, tl.float64)
        # g: the largest float32 |d| of all rows (the pass wrote them; each such row reads them all, fine for the
        # at most PROGRAMS + one per block rows of a pair). Float32 rounding is monotonic: the exact largest |d|
        # is in a row whose float32 largest is g
        for r0 in tl.range(0, programs, _CHUNK, num_stages=3):
            r = r0 + tl.arange(0, _CHUNK)
            g = tl.maximum(g, tl.max(tl.load(part_ptr + r * 16 + MAX32, mask=r < programs, other=-1.0)))
        whole = whole | ((top == g) & (g > 0))
    if whole:  # masked as the reference does
        qa, qb, qd, qabs, qad, qtop, qlo, _, qulp, _, qnfa, qnfb, qout, qnan_a, qnan_b, qsame, qinf = _group(
            a_ptr, b_ptr, n, 0, tiles, atol, rtol, 0.0, 0.0, 0.0, 0.0, TILE, BITS, A8, B8, 1, 0, STAGES, 1, 1,
        )  # fmt: skip
        _floats(row, qa, qb, qd, qabs, qad, qtop)
        _counts(row, n - qout, qlo + qsame, qnfa, qnfb, qout - qsame, qulp, qnan_a, qnan_b, qinf)
    elif tl.sum(tl.where(cols == PASSED, mine, 0)) < 0:
        _, _, _, _, _, _, passed, _, _, _, _, _, _, _, _, _, _ = _group(
            a_ptr, b_ptr, n, 0, tiles, atol, rtol, 0.0, 0.0, 0.0, 0.0, TILE, 0, A8, B8, 1, 0, STAGES, 1, 0,
        )  # fmt: skip
        _put(row, PASSED, passed)


@triton.jit(do_not_specialize=["K", "rows", "first", "programs", "fixers", "nseg"])  # see _launch
def _fix_kernel(
    a_ptr, b_ptr, seg_ptr, K, rows, tol_ptr, buf_ptr, first, programs, fixers, nseg,
    TILE: tl.constexpr, BITS: tl.constexpr, A8: tl.constexpr, B8: tl.constexpr, ALIGN: tl.constexpr,
    ROWS: tl.constexpr, STAGES: tl.constexpr,
):  # fmt: skip
    """Rows first + ROWS * pid ... of this piece's ``rows`` (of all ``programs``): what the pass marked, done
    again in float64 (:func:`_fix_row`). The last program to finish a segment's K rows adds their d² and a²
    (:func:`_segment`); the last of the ``fixers`` programs to finish adds the rows (:func:`_finish`)."""
    part_ptr, seg_out_ptr, count_ptr = _layout(buf_ptr, nseg)
    cols = tl.arange(0, 16)
    atol, rtol = tl.load(tol_ptr), tl.load(tol_ptr + 1)  # float64 (a float argument would be float32)
    for j in tl.range(ROWS):
        pid = tl.program_id(0) * ROWS + j
        if pid < rows:
            row = part_ptr + (first + pid) * 16
            mine = tl.load(row + cols).to(tl.int64, bitcast=True)  # the row in one read; its -1 marks work
            if tl.min(mine) < 0:
                _fix_row(
                    a_ptr, b_ptr, seg_ptr, K, pid, row, mine, atol, rtol, part_ptr, programs,
                    TILE, BITS, A8, B8, ALIGN, STAGES,
                )  # fmt: skip
            if nseg > 1:  # the row's writes, then its segment's count (release: the segment's last sees them all)
                s = (first + pid) // K
                tl.debug_barrier()
                if tl.atomic_add(count_ptr + 1 + s, 1, sem="acq_rel") == K - 1:
                    tl.debug_barrier()
                    _segment(part_ptr, seg_out_ptr, s, K)
    tl.debug_barrier()  # this program's writes, then the count (release: the last program sees them all)
    if tl.atomic_add(count_ptr, 1, sem="acq_rel") == fixers - 1:
        tl.debug_barrier()
        _finish(part_ptr, programs, buf_ptr, seg_out_ptr, nseg)


@triton.jit
def _segment(part_ptr, seg_out_ptr, s, K):
    """The d² and a² of segment s (its K rows) added in a fixed order into seg_out[2s], seg_out[2s + 1]. Reads
    past L1 (``.cg``): the rows were written on other multiprocessors."""
    acc_d, acc_a = tl.zeros([64], dtype=tl.float64), tl.zeros([64], dtype=tl.float64)
    for k0 in tl.range(0, K, 64):
        k = k0 + tl.arange(0, 64)
        r = (s * K + k).to(tl.int64) * 16
        acc_d += tl.load(part_ptr + r + D2, mask=k < K, other=0.0, cache_modifier=".cg")
        acc_a += tl.load(part_ptr + r + A2, mask=k < K, other=0.0, cache_modifier=".cg")
    tl.store(seg_out_ptr + 2 * s, tl.sum(acc_d))
    tl.store(seg_out_ptr + 2 * s + 1, tl.sum(acc_a))


@triton.jit
def _finish(part_ptr, programs, out_ptr, seg_out_ptr, nseg):
    """Adds the rows in a fixed order into out (a ROW_WIDTH: sums and counts added, maxima taken); one segment's
    d² and a² are the totals'. Reads past L1 (``.cg``): the rows were written on other multiprocessors."""
    cols = tl.arange(0, 16)
    is_max = (cols == MAX_EXACT) | (cols == MAX32) | (cols == MAX_ULP)
    acc_f = tl.zeros([_CHUNK, 16], dtype=tl.float64)
    acc_i = tl.zeros([_CHUNK, 16], dtype=tl.int64)
    for start in tl.range(0, programs, _CHUNK, num_stages=3):
        r = start + tl.arange(0, _CHUNK)
        v = tl.load(part_ptr + r[:, None] * 16 + cols[None, :], mask=(r < programs)[:, None], other=0.0, cache_modifier=".cg")
        vi = v.to(tl.int64, bitcast=True)
        acc_f = tl.where(is_max[None, :], tl.maximum(acc_f, v), acc_f + v)
        acc_i = tl.where(is_max[None, :], tl.maximum(acc_i, vi), acc_i + vi)
    total_f = tl.where(is_max, tl.max(acc_f, 0), tl.sum(acc_f, 0))
    total_i = tl.where(is_max, tl.max(acc_i, 0), tl.sum(acc_i, 0))
    tl.store(out_ptr + cols, tl.where(cols >= BOTH, total_i.to(tl.float64, bitcast=True), total_f))
    if nseg == 1:  # the one segment's d² and a² are the totals'
        tl.store(seg_out_ptr + cols - D2, total_f, mask=cols == D2)
        tl.store(seg_out_ptr + cols - A2 + 1, total_f, mask=cols == A2)


def _chunks(a: torch.Tensor, b: torch.Tensor, device: torch.device, chunk_elems: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Contiguous pieces on ``device`` (the kernels read them flat): the whole pair when it is already there
    and contiguous."""
    if a.device == b.device == device and a.is_contiguous() and b.is_contiguous():
        return [(a, b)] if a.numel() else []
    return [(ca.to(device).contiguous(), cb.to(device).contiguous()) for ca, cb in chunk_pairs(a, b, chunk_elems)]


@functools.lru_cache(maxsize=64)
def _tolerances(atol: float, rtol: float, device: torch.device) -> tuple[torch.Tensor, bool]:
    """``common.tolerances`` on the device, once per pair of values, and whether the band is used."""
    values, band = tolerances(atol, rtol)
    return torch.tensor(values, dtype=torch.float64).to(device), band


class _Plan(NamedTuple):
    """How a pair of pieces of given sizes is cut: the block of the edges each segment is in, each piece's
    segment edges on the device and its rows (programs), the alignment, and K (programs per segment)."""

    owner: list[int]
    seg_edges: list[torch.Tensor]
    rows: list[int]
    align: int
    K: int


@functools.lru_cache(maxsize=256)
def _plan(sizes: tuple[int, ...], edges: tuple[int, ...], device: torch.device) -> _Plan:
    segs, offset = [], 0
    for size in sizes:
        segs.append(blocks_meeting(edges, offset, offset + size))
        offset += size
    seg_edges = [torch.tensor([*(lo for _, lo, _ in found), found[-1][2]], dtype=torch.int64).to(device) for found in segs]
    # whole vectors (16 elements) when every segment edge allows it
    aligned = all(lo % VECTOR == 0 for found in segs for _, lo, _ in found) and all(n % VECTOR == 0 for n in sizes)
    longest = max(hi - lo for found in segs for _, lo, hi in found)
    owner = [j for found in segs for j, _, _ in found]
    # at most PROGRAMS programs past MIN_TILES tiles each, and none of 2**28 elements or more (int32 counts)
    K = max(1, min(PROGRAMS // len(owner), triton.cdiv(longest, TILE * MIN_TILES)), triton.cdiv(longest + 1, 1 << 28))
    return _Plan(owner, seg_edges, [K * len(found) for found in segs], VECTOR if aligned else 1, K)


@functools.lru_cache(maxsize=64)
def _constants(dtype_a: torch.dtype, dtype_b: torch.dtype, align: int, band: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """The compile-time arguments of the pass and of the fix kernel for such a pair, built once."""
    bits = _BITS[dtype_a.itemsize] if ulp_spec(dtype_a, dtype_b) else 0
    common = {"TILE": TILE, "BITS": bits, "A8": _F8.get(dtype_a, 0), "B8": _F8.get(dtype_b, 0), "ALIGN": align}
    common["num_warps"] = NUM_WARPS
    exact = exact_ulp(dtype_a) if bits else -1
    f64 = torch.float64 in (dtype_a, dtype_b)
    pass_args = {"F64": f64, "BAND": band, "EXACT_ULP": exact, "STAGES": STAGES, "FLUSH": FLUSH, **common}
    return pass_args, {"ROWS": FIX_ROWS, "STAGES": STAGES, **common}


_BINARIES: dict[tuple[Any, ...], tuple[CompiledKernel, tuple[Any, ...]]] = {}


def _launch(kernel: Any, programs: int, constants: dict[str, Any], *args: Any) -> None:
    """``kernel[(programs,)](*args, **constants)``. ``JITFunction.run`` binds and specializes every argument on each
    call (32 µs a launch on an H100 host, 118 on a slower one: about what the pass takes on 8192x7168), so it runs
    once per kind of launch and later ones run the binary it returned, given the constants by position as ``run``
    gives them. The kernels' ints are not specialized (``do_not_specialize``) and their other tensors are the
    backend's own, fresh from the allocator: the device, the constants, and a and b's dtypes and 16-byte alignment
    pick the binary."""
    a, b = args[0], args[1]
    device = torch.cuda.current_device() if a.is_cuda else -1  # (-1: Triton's interpreter, on the CPU)
    key = (kernel, device, a.dtype, b.dtype, a.data_ptr() % 16 == 0, b.data_ptr() % 16 == 0, *constants.values())
    found = _BINARIES.get(key)
    if found is not None:
        found[0][(programs, 1, 1)](*args, *found[1])
        return
    binary = kernel[(programs,)](*args, **constants)
    if isinstance(binary, CompiledKernel):  # (Triton's interpreter returns none)
        _BINARIES[key] = binary, tuple(constants[p.name] for p in kernel.params[len(args) :])


def cuda_totals(
    a: torch.Tensor, b: torch.Tensor, *, atol: float, rtol: float, chunk_elems: int, edges: Sequence[int] = ()
) -> Totals:
    device = compute_device(a, b)
    spec = ulp_spec(a.dtype, b.dtype)
    edges = tuple(edges) or (0, a.numel())
    pieces = _chunks(a, b, device, chunk_elems)
    if not pieces:
        return empty_totals(a, b, edges)
    plan = _plan(tuple(ca.numel() for ca, _ in pieces), edges, device)
    owner, K, nseg, total = plan.owner, plan.K, len(plan.owner), sum(plan.rows)
    tol, band = _tolerances(atol, rtol, device)  # without the band the tolerance test is counted in float64
    pass_args, fix_args = _constants(a.dtype, b.dtype, plan.align, band)
    head = -(-(ROW_WIDTH + 3 * nseg + 1) // ROW_WIDTH) * ROW_WIDTH  # see _layout
    buf = torch.empty(head + ROW_WIDTH * total, dtype=torch.float64, device=device)
    first = 0
    for (ca, cb), se, rows in zip(pieces, plan.seg_edges, plan.rows):
        _launch(_pass_kernel, rows, pass_args, ca, cb, se, K, tol, buf, first, nseg, first == 0)
        first += rows
    first, fixes = 0, [-(-rows // FIX_ROWS) for rows in plan.rows]
    for (ca, cb), se, rows, fix in zip(pieces, plan.seg_edges, plan.rows, fixes):
        _launch(_fix_kernel, fix, fix_args, ca, cb, se, K, rows, tol, buf, first, total, sum(fixes), nseg)
        first += rows
    res = buf[:head].cpu().numpy()
    floats, ints = res[: MAX_EXACT.value + 1].tolist(), res[:ROW_WIDTH].view(np.int64).tolist()  # the totals' row
    seg = res[ROW_WIDTH : ROW_WIDTH + 2 * nseg].tolist()
    block_d2, block_a2 = seg[0::2], seg[1::2]
    if owner != list(range(len(edges) - 1)):  # blocks cut by the pieces: their segments added in order
        block_d2, block_a2 = (np.bincount(owner, part, len(edges) - 1).tolist() for part in (block_d2, block_a2))
    max_ulp = ints[MAX_ULP.value] if spec is not None else None
    sums, counts = tuple(floats[A2.value : AD.value + 1]), tuple(ints[BOTH.value : MISMATCH.value + 1])
    nonfinite = tuple(ints[NAN_A.value : INF_SAME.value + 1])
    return Totals(a.numel(), sums, max(floats[MAX_EXACT.value], 0.0), counts, max_ulp, tuple(block_d2), tuple(block_a2), nonfinite)
