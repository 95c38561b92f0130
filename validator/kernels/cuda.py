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

from .common import KEY_BITS, Totals, p99_from_keys, ulp_spec
from .reference import chunk_pairs, compute_device

BLOCK = 2048  # elements per tile
TILES = 4  # tiles per program
NUM_WARPS = 8
REFINE_BINS = 256  # bins of one refining pass (a tl.histogram per tile)
_BITS = {1: 8, 2: 16, 4: 32}  # element size -> bits of the ULP ordinal
_F8 = {torch.float8_e4m3fn: 1, torch.float8_e5m2: 2}


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
def _pass_kernel(
    a_ptr, b_ptr, n, tol_ptr, f_ptr, i_ptr, keys_ptr,
    BLOCK: tl.constexpr, TILES: tl.constexpr, BITS: tl.constexpr, A8: tl.constexpr, B8: tl.constexpr,
    KEY_BITS: tl.constexpr, NKEYS: tl.constexpr, HIST: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    atol, rtol = tl.load(tol_ptr), tl.load(tol_ptr + 1)  # float64 (a float argument would be float32)
    s_a2 = tl.cast(0.0, tl.float64)
    s_b2, s_d2, s_abs, s_ad, top = s_a2, s_a2, s_a2, s_a2, s_a2
    c_both = tl.cast(0, tl.int64)
    c_pass, c_nfa, c_nfb, c_mis, top_ulp = c_both, c_both, c_both, c_both, c_both
    hist = tl.zeros([NKEYS], dtype=tl.int32)
    for t in tl.range(TILES):
        offs = (pid * TILES + t).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        inb = offs < n
        a = tl.load(a_ptr + offs, mask=inb, other=0.0)
        b = tl.load(b_ptr + offs, mask=inb, other=0.0)
        xa, xb = _f64(a), _f64(b)
        qa, qb = tl.sum(xa * xa), tl.sum(xb * xb)
        clean = (qa + qb) * 0.0 == 0.0  # no NaN/Inf in the tile (else its sums are not finite)
        if A8 or B8:
            clean = clean & (tl.sum((_finite(xa, a, A8) & _finite(xb, b, B8)).to(tl.int32)) == BLOCK)
        if clean:  # the common case: nothing to mask
            both = inb
            d = xb - xa
            ad = tl.abs(d)
            passed = inb & (ad <= atol + rtol * tl.abs(xa))
        else:  # the reference's masking
            fa, fb = _finite(xa, a, A8), _finite(xb, b, B8)
            both = fa & fb & inb
            nan_a, nan_b = _nan(xa, a, A8), _nan(xb, b, B8)
            # non-finite in both and of the same kind: both NaN, or both Inf of one sign
            same = inb & ~fa & ~fb & ((nan_a & nan_b) | (~nan_a & ~nan_b & ((xa < 0) == (xb < 0))))
            xa, xb = tl.where(both, xa, 0.0), tl.where(both, xb, 0.0)
            qa, qb = tl.sum(xa * xa), tl.sum(xb * xb)
            d = xb - xa
            ad = tl.abs(d)
            passed = (both & (ad <= atol + rtol * tl.abs(xa))) | same
            c_nfa += tl.sum((inb & ~fa).to(tl.int32))
            c_nfb += tl.sum((inb & ~fb).to(tl.int32))
            c_mis += tl.sum((inb & ~both & ~same).to(tl.int32))
        s_a2 += qa
        s_b2 += qb
        s_d2 += tl.sum(d * d)
        s_abs += tl.sum(ad)
        s_ad += tl.sum(xa * d)
        top = tl.maximum(top, tl.max(ad))
        c_both += tl.sum(both.to(tl.int32))
        c_pass += tl.sum(passed.to(tl.int32))
        if BITS != 0:
            dist = tl.where(both, tl.abs(_ordinal(a, BITS) - _ordinal(b, BITS)), 0)
            top_ulp = tl.maximum(top_ulp, tl.max(dist).to(tl.int64))
            if HIST:  # positions left out land in key 0; the host takes them off
                hist += tl.histogram(_key(dist, BITS, KEY_BITS), NKEYS)
    base = pid * 6
    tl.store(f_ptr + base + 0, s_a2)
    tl.store(f_ptr + base + 1, s_b2)
    tl.store(f_ptr + base + 2, s_d2)
    tl.store(f_ptr + base + 3, s_abs)
    tl.store(f_ptr + base + 4, s_ad)
    tl.store(f_ptr + base + 5, top)
    tl.store(i_ptr + base + 0, c_both)
    tl.store(i_ptr + base + 1, c_pass)
    tl.store(i_ptr + base + 2, c_nfa)
    tl.store(i_ptr + base + 3, c_nfb)
    tl.store(i_ptr + base + 4, c_mis)
    tl.store(i_ptr + base + 5, top_ulp)
    if HIST:
        tl.atomic_add(keys_ptr + tl.arange(0, NKEYS), hist.to(tl.int64), mask=hist > 0)


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
    a8, b8 = _F8.get(a.dtype, 0), _F8.get(b.dtype, 0)
    tol = torch.tensor([atol, rtol], dtype=torch.float64, device=device)
    per_program = BLOCK * TILES
    keys = torch.zeros(nkeys, dtype=torch.int64, device=device)
    fparts, iparts, slots = [], [], 0
    pieces = _pieces(a, b, device, chunk_elems)
    for ca, cb in pieces:
        programs = triton.cdiv(ca.numel(), per_program)
        fp = torch.empty(programs, 6, dtype=torch.float64, device=device)
        ip = torch.empty(programs, 6, dtype=torch.int64, device=device)
        _pass_kernel[(programs,)](
            ca, cb, ca.numel(), tol, fp, ip, keys,
            BLOCK=BLOCK, TILES=TILES, BITS=bits, A8=a8, B8=b8, KEY_BITS=KEY_BITS, NKEYS=nkeys, HIST=hist,
            num_warps=NUM_WARPS, enable_fp_fusion=False,
        )  # fmt: skip
        fparts.append(fp)
        iparts.append(ip)
        slots += programs * per_program
    if not pieces:
        return Totals(a.numel(), (0.0,) * 5, 0.0, (0,) * 5, (0, 0) if spec is not None else None)
    f, i = torch.cat(fparts), torch.cat(iparts)
    packed = torch.cat([f[:, :5].sum(0), f[:, 5].max().view(1)]).cpu().tolist()
    ints = torch.cat([i[:, :5].sum(0), i[:, 5].max().view(1), keys]).cpu().tolist()
    counts = tuple(ints[:5])
    ulp = None
    if spec is not None:
        ulp = (ints[5], None)
        if p99:
            binned = ints[6:]
            binned[0] -= slots - counts[0]  # padding and non-finite positions were binned as distance 0

            def refine(lo: int, shift: int, bins: int) -> list[int]:
                out = torch.zeros(2 * REFINE_BINS, dtype=torch.int32, device=device)
                for ca, cb in pieces:
                    _refine_kernel[(triton.cdiv(ca.numel(), per_program),)](
                        ca, cb, ca.numel(), lo, shift, out,
                        BLOCK=BLOCK, TILES=TILES, BITS=bits, A8=a8, NBINS=REFINE_BINS,
                        num_warps=NUM_WARPS, enable_fp_fusion=False,
                    )  # fmt: skip
                return out[:bins].cpu().tolist()

            ulp = (ints[5], p99_from_keys(binned, counts[0], refine, REFINE_BINS))
    return Totals(a.numel(), tuple(packed[:5]), packed[5], counts, ulp)  # type: ignore[arg-type]
