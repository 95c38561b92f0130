"""GPU backend: one fused Triton pass over a pair, float64 arithmetic per element.

Each program reads ``TILES`` tiles of ``BLOCK`` elements of both tensors once and writes its partial
totals (five float64 sums, the largest ``|d|``, five counts, the largest ULP distance) to a buffer of
its own; torch adds the partials in a fixed order, so a pair gives the same bits on every call. The
ULP key histogram (``common.ulp_key``) is added with integer atomics, whose order cannot change a sum.
A tile whose sums of squares come out non-finite is computed again with the reference's masking
(NaN/Inf positions left out of the sums and counted), from the registers it already holds.

Every value is converted to float64 before any arithmetic, like the reference, so ``max_abs``, the
tolerance test and the counts are exact and the sums differ from the reference's only in the order
of float64 additions. The tolerance test must round like the reference (a multiply, then an add), so
kernels are compiled with ``enable_fp_fusion=False``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import EPS, KEY_BITS, SAFE_HI, SAFE_LO, TINY, Totals, p99_from_keys, ulp_spec
from .reference import chunk_pairs, compute_device

BLOCK = 1024  # elements per tile
TILES = 4  # tiles per program
NUM_WARPS = 4
REFINE_BINS = 256  # bins of one refining pass (a tl.histogram per tile)
_BITS = {1: 8, 2: 16, 4: 32}  # element size -> bits of the ULP ordinal
_F8 = {torch.float8_e4m3fn: 1, torch.float8_e5m2: 2}
_LO, _HI = tl.constexpr(SAFE_LO), tl.constexpr(SAFE_HI)


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
def _passed_f64(xa, xb, inb, atol, rtol):
    """The reference's tolerance test in float64 (a multiply, then an add: no FMA here)."""
    a64, b64 = xa.to(tl.float64), xb.to(tl.float64)
    return tl.sum((inb & (tl.abs(b64 - a64) <= atol + rtol * tl.abs(a64))).to(tl.int32))


@triton.jit
def _masked_tile(a, b, inb, atol, rtol, A8: tl.constexpr, B8: tl.constexpr):
    """One tile as the reference reads it: float64, NaN/Inf left out of the sums and counted."""
    ya, yb = _f64(a), _f64(b)
    fa, fb = _finite(ya, a, A8), _finite(yb, b, B8)
    both = fa & fb & inb
    nan_a, nan_b = _nan(ya, a, A8), _nan(yb, b, B8)
    # non-finite in both and of the same kind: both NaN, or both Inf of one sign
    same = inb & ~fa & ~fb & ((nan_a & nan_b) | (~nan_a & ~nan_b & ((ya < 0) == (yb < 0))))
    ya, yb = tl.where(both, ya, 0.0), tl.where(both, yb, 0.0)
    e = yb - ya
    ae = tl.abs(e)
    passed = (both & (ae <= atol + rtol * tl.abs(ya))) | same
    return (
        tl.sum(ya * ya), tl.sum(yb * yb), tl.sum(e * e), tl.sum(ae), tl.sum(ya * e), tl.max(ae), both,
        tl.sum(both.to(tl.int32)), tl.sum(passed.to(tl.int32)), tl.sum((inb & ~fa).to(tl.int32)),
        tl.sum((inb & ~fb).to(tl.int32)), tl.sum((inb & ~both & ~same).to(tl.int32)),
    )  # fmt: skip


@triton.jit
def _pass_kernel(
    a_ptr, b_ptr, n, tol_ptr, f_ptr, i_ptr, keys_ptr,
    BLOCK: tl.constexpr, TILES: tl.constexpr, BITS: tl.constexpr, A8: tl.constexpr, B8: tl.constexpr,
    F64: tl.constexpr, BAND: tl.constexpr, KEY_BITS: tl.constexpr, NKEYS: tl.constexpr, HIST: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    atol, rtol = tl.load(tol_ptr), tl.load(tol_ptr + 1)  # float64 (a float argument would be float32)
    a_lo, r_lo = tl.load(tol_ptr + 2).to(tl.float32), tl.load(tol_ptr + 3).to(tl.float32)
    a_hi, r_hi = tl.load(tol_ptr + 4).to(tl.float32), tl.load(tol_ptr + 5).to(tl.float32)
    zero = tl.cast(0.0, tl.float64)
    s_a2, s_b2, s_d2, s_abs, s_ad, top64, top32 = zero, zero, zero, zero, zero, zero, zero
    c_both = tl.cast(0, tl.int64)
    c_pass, c_nfa, c_nfb, c_mis, top_ulp, small, m1, m2 = c_both, c_both, c_both, c_both, c_both, c_both, c_both, c_both
    hist = tl.zeros([NKEYS], dtype=tl.int32)
    for t in tl.range(TILES):
        offs = (pid * TILES + t).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        inb = offs < n
        a = tl.load(a_ptr + offs, mask=inb, other=0.0)
        b = tl.load(b_ptr + offs, mask=inb, other=0.0)
        if F64:  # a float64 input: every tile as the reference reads it
            ta2, tb2, td2, tabs, tad, t64, both, nb, npass, nfa, nfb, nmis = _masked_tile(a, b, inb, atol, rtol, A8, B8)
            t32 = zero
        else:  # float32 within the tile: exact for the inputs, the sums rounded once per term
            xa, xb = a.to(tl.float32), b.to(tl.float32)
            d = xb - xa
            ad = tl.abs(d)
            qa, qb, qd, m = tl.sum(xa * xa), tl.sum(xb * xb), tl.sum(d * d), tl.max(ad)
            # NaN/Inf anywhere, or squares past float32's range, make a sum large or NaN (NaN <= x is False)
            clean = (qa <= _HI) & (qb <= _HI) & (qd <= _HI)
            if A8 or B8:  # float8: the bits say what is finite
                clean = clean & (tl.sum((_finite(xa, a, A8) & _finite(xb, b, B8)).to(tl.int32)) == BLOCK)
            if clean & ((qa < _LO) | (qb < _LO) | ((qd < _LO) & (m > 0))):  # tiny squares
                zero_a, zero_b = tl.max(tl.abs(xa)) == 0, tl.max(tl.abs(xb)) == 0
                clean = ((qa >= _LO) | zero_a) & ((qb >= _LO) | zero_b) & ((qd >= _LO) | (m == 0))
            if clean:  # the common case: nothing to mask
                ta2, tb2, td2 = qa.to(tl.float64), qb.to(tl.float64), qd.to(tl.float64)
                tabs, tad = tl.sum(ad).to(tl.float64), tl.sum(xa * d).to(tl.float64)
                t64, t32, both = zero, m.to(tl.float64), inb  # t32: made exact by _exact_max_kernel
                nb = tl.sum(inb.to(tl.int32))
                nfa, nfb, nmis = nb * 0, nb * 0, nb * 0
                n_lo, n_hi = nb, nb + 1
                if BAND:  # counted against tolerances moved down and up: equal counts are the exact count
                    aa = tl.abs(xa)
                    n_lo = tl.sum((inb & (ad <= aa * r_lo + a_lo)).to(tl.int32))
                    n_hi = tl.sum((inb & (ad <= aa * r_hi + a_hi)).to(tl.int32))
                if n_lo == n_hi:
                    npass = n_lo
                else:
                    npass = _passed_f64(xa, xb, inb, atol, rtol)
            else:
                ta2, tb2, td2, tabs, tad, t64, both, nb, npass, nfa, nfb, nmis = _masked_tile(
                    a, b, inb, atol, rtol, A8, B8
                )
                t32 = zero
        s_a2 += ta2
        s_b2 += tb2
        s_d2 += td2
        s_abs += tabs
        s_ad += tad
        top64 = tl.maximum(top64, t64)
        top32 = tl.maximum(top32, t32)
        c_both += nb
        c_pass += npass
        c_nfa += nfa
        c_nfb += nfb
        c_mis += nmis
        if BITS != 0:
            dist = tl.where(both, tl.abs(_ordinal(a, BITS) - _ordinal(b, BITS)), 0)
            top = tl.max(dist)
            top_ulp = tl.maximum(top_ulp, top.to(tl.int64))
            if HIST:  # positions left out count as distance 0; the host takes them off
                if top > 2:
                    hist += tl.histogram(_key(dist, BITS, KEY_BITS), NKEYS)
                else:  # distances 0, 1 and 2 only: their counts follow from two moments
                    small += 1
                    m1 += tl.sum(dist).to(tl.int64)
                    m2 += tl.sum(dist * dist).to(tl.int64)
    f = f_ptr + pid * 7
    tl.store(f + 0, s_a2)
    tl.store(f + 1, s_b2)
    tl.store(f + 2, s_d2)
    tl.store(f + 3, s_abs)
    tl.store(f + 4, s_ad)
    tl.store(f + 5, top64)
    tl.store(f + 6, top32)
    i = i_ptr + pid * 9
    tl.store(i + 0, c_both)
    tl.store(i + 1, c_pass)
    tl.store(i + 2, c_nfa)
    tl.store(i + 3, c_nfb)
    tl.store(i + 4, c_mis)
    tl.store(i + 5, top_ulp)
    tl.store(i + 6, small)
    tl.store(i + 7, m1)
    tl.store(i + 8, m2)
    if HIST:
        tl.atomic_add(keys_ptr + tl.arange(0, NKEYS), hist.to(tl.int64), mask=hist > 0)


@triton.jit
def _exact_max_kernel(
    a_ptr, b_ptr, n, f_ptr, g_ptr, out_ptr,
    BLOCK: tl.constexpr, TILES: tl.constexpr, A8: tl.constexpr, B8: tl.constexpr,
):  # fmt: skip
    """The exact largest |d| of the float32 tiles: float32 rounding is monotonic, so it is the largest
    float64 |d| among the positions whose float32 |d| equals the largest float32 |d|, ``g``. Only the
    programs that saw ``g`` read their tiles again."""
    pid = tl.program_id(0)
    g = tl.load(g_ptr)
    best = tl.cast(0.0, tl.float64)
    if (tl.load(f_ptr + pid * 7 + 6) == g) & (g > 0):
        g32 = g.to(tl.float32)
        for t in tl.range(TILES):
            offs = (pid * TILES + t).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
            inb = offs < n
            a = tl.load(a_ptr + offs, mask=inb, other=0.0)
            b = tl.load(b_ptr + offs, mask=inb, other=0.0)
            xa, xb = a.to(tl.float32), b.to(tl.float32)
            hit = inb & (tl.abs(xb - xa) == g32) & _finite(xa, a, A8) & _finite(xb, b, B8)
            exact = tl.abs(_f64(b) - _f64(a))
            best = tl.maximum(best, tl.max(tl.where(hit, exact, 0.0)))
    tl.store(out_ptr + pid, best)


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


def compare_cuda(
    a: torch.Tensor, b: torch.Tensor, *, atol: float, rtol: float, chunk_elems: int, p99: bool = True
) -> Totals:
    device = compute_device(a, b)
    spec = ulp_spec(a, b)
    bits = _BITS[a.element_size()] if spec is not None else 0
    hist = bool(bits) and p99
    nkeys = (bits << KEY_BITS) if hist else 1  # keys of the distances below 2**bits
    f8 = {"A8": _F8.get(a.dtype, 0), "B8": _F8.get(b.dtype, 0)}
    f64 = torch.float64 in (a.dtype, b.dtype)
    band = rtol <= 2.0**20 and atol <= SAFE_HI  # else the tolerance test is counted in float64
    tol = torch.tensor(
        [atol, rtol, atol * (1 - EPS) - TINY, rtol * (1 - EPS), atol * (1 + EPS) + TINY, rtol * (1 + EPS)],
        dtype=torch.float64,
    ).to(device)
    tiles = {"BLOCK": BLOCK, "TILES": TILES}
    per_program = BLOCK * TILES
    keys = torch.zeros(nkeys, dtype=torch.int64, device=device)
    parts, slots = [], 0
    pieces = _pieces(a, b, device, chunk_elems)
    for ca, cb in pieces:
        programs = triton.cdiv(ca.numel(), per_program)
        fp = torch.empty(programs, 7, dtype=torch.float64, device=device)
        ip = torch.empty(programs, 9, dtype=torch.int64, device=device)
        _pass_kernel[(programs,)](
            ca, cb, ca.numel(), tol, fp, ip, keys, **tiles, BITS=bits, **f8, F64=f64, BAND=band,
            KEY_BITS=KEY_BITS, NKEYS=nkeys, HIST=hist, num_warps=NUM_WARPS, enable_fp_fusion=False,
        )  # fmt: skip
        parts.append((ca, cb, fp, ip))
        slots += programs * per_program
    if not pieces:
        return Totals(a.numel(), (0.0,) * 5, 0.0, (0,) * 5, (0, 0) if spec is not None else None)
    f, i = torch.cat([p[2] for p in parts]), torch.cat([p[3] for p in parts])
    g = f[:, 6].max()
    exact = [f[:, 5]]
    for ca, cb, fp, _ in parts if not f64 else []:
        out = torch.empty(fp.shape[0], dtype=torch.float64, device=device)
        _exact_max_kernel[(fp.shape[0],)](
            ca, cb, ca.numel(), fp, g, out, **tiles, **f8, num_warps=NUM_WARPS, enable_fp_fusion=False
        )
        exact.append(out)
    top = torch.cat(exact).max()
    floats = torch.cat([f[:, :5].sum(0), top.view(1)]).cpu().tolist()
    ints = torch.cat([i[:, :5].sum(0), i[:, 5].max().view(1), i[:, 6:].sum(0), keys]).cpu().tolist()
    counts = tuple(ints[:5])
    ulp = None
    if spec is not None:
        ulp = (ints[5], None)
        if hist:
            small, m1, m2 = ints[6:9]
            binned = ints[9:]
            n2 = (m2 - m1) // 2  # tiles whose distances are 0, 1 or 2: n1 + 2 n2 = m1, n1 + 4 n2 = m2
            binned[0] += small * BLOCK - (m1 - 2 * n2) - n2
            binned[1 << KEY_BITS] += m1 - 2 * n2  # key of distance 1
            binned[(1 << KEY_BITS) + (1 << (KEY_BITS - 1))] += n2  # key of distance 2
            binned[0] -= slots - counts[0]  # padding and non-finite positions were counted as distance 0

            def refine(lo: int, shift: int, bins: int) -> list[int]:
                out = torch.zeros(2 * REFINE_BINS, dtype=torch.int32, device=device)
                for ca, cb, _, _ in parts:
                    _refine_kernel[(triton.cdiv(ca.numel(), per_program),)](
                        ca, cb, ca.numel(), lo, shift, out, **tiles, BITS=bits, A8=f8["A8"],
                        NBINS=REFINE_BINS, num_warps=NUM_WARPS, enable_fp_fusion=False,
                    )  # fmt: skip
                return out[:bins].cpu().tolist()

            ulp = (ints[5], p99_from_keys(binned, counts[0], refine, REFINE_BINS))
    return Totals(a.numel(), tuple(floats[:5]), floats[5], counts, ulp)  # type: ignore[arg-type]
