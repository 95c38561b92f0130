"""The CUDA path: one fused Triton kernel reads both tensors once and produces every metric.

Layout of the work (docs/performance.md has the numbers):

- A persistent grid (a few programs per multiprocessor) walks the tensor in tiles of ``BLOCK``
  elements. Each program keeps float64 running sums (a², b², ab, d², |d|) and the running max |d| per
  lane in registers, and an int32 pass count and max ULP distance, and adds them into its own row of a
  ``[grid, 16]`` float64 buffer at the end: no atomics on the sums, and a fixed summation order.
- ULP distances (same dtype only) go to a per-program register histogram of ``NSMALL`` bins
  (``tl.histogram``); the rare distances of ``NSMALL - 1`` and more are added with relaxed atomics into
  an exact global histogram of 2**16 + 1 bins, kept in ``NCOPY`` copies chosen by program id
  (float32 adds a histogram of ``distance >> 16`` for the exact two-level p99 of docs/metrics.md).
- The first pass assumes every element is finite and masks nothing. If its sums come out non-finite
  (a NaN/Inf was read, or float64 overflowed), the pair is read again by the same kernel compiled with
  ``MASKED``, which applies the reference semantics element by element.
- A one-program finishing kernel reduces the rows and the histograms and finds the p99 on the device,
  so the host reads 16 numbers once.

The tolerance test must round exactly like the reference's ``atol + rtol * |a|`` (two roundings), so
the kernels are compiled with ``enable_fp_fusion=False``; the running sums use explicit ``tl.fma``.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
from typing import Any

import torch

from .. import metrics as _ref
from ._finish import FINE_BINS, ULP_DTYPES, first_reaching, metrics_from_totals, nearest_rank

__all__ = ["available", "compare_cuda", "CONFIG"]

try:  # Triton is optional: without it CUDA tensors take the reference path
    import triton
    import triton.language as tl

    _HAVE_TRITON = True
except ImportError:  # pragma: no cover - depends on the environment
    _HAVE_TRITON = False

# Tuning knobs (benchmarks/compare_bench.py sweeps them on the device).
CONFIG: dict[str, int] = {
    "BLOCK": 512,  # elements per tile (the H200 sweep's best, docs/results/perf-h200.md)
    "num_warps": 4,
    "programs_per_sm": 16,  # persistent grid: this many programs per multiprocessor
    "NSMALL": 32,  # register-histogram bins; the last one means "NSMALL - 1 or more"
    "NCOPY": 8,  # copies of the global histogram
    "PREFETCH": 1,  # load the next tile before computing this one
    "DIAG": 0,  # timing diagnostics only: 1 = no ULP histograms (no p99), 2 = no ULP work at all
}
if os.environ.get("VALIDATOR_CUDA_CONFIG"):  # tuning: a JSON object overriding some of the above
    CONFIG.update({k: int(v) for k, v in json.loads(os.environ["VALIDATOR_CUDA_CONFIG"]).items() if k in CONFIG})
_NPART = 16  # columns of the per-program buffer
_MAX_LAUNCH = 1 << 30  # elements per launch (contiguous inputs are split)
_FMAX = 1.7976931348623157e308

_TORCH_TO_ULP_BITS = {
    torch.bfloat16: 16,
    torch.float16: 16,
    torch.float32: 32,
    torch.float8_e4m3fn: 8,
    torch.float8_e5m2: 8,
}


def available() -> bool:
    return _HAVE_TRITON and torch.cuda.is_available()


if _HAVE_TRITON:

    @triton.jit
    def _ordinal(x, ULP_BITS: tl.constexpr):
        """The value's bit pattern mapped onto the monotonic integer line (int32, int64 for float32)."""
        if ULP_BITS == 8:
            s = x.to(tl.int8, bitcast=True).to(tl.int32)
            o = tl.where(s < 0, -(s & 0x7F), s)
        elif ULP_BITS == 16:
            s = x.to(tl.int16, bitcast=True).to(tl.int32)
            o = tl.where(s < 0, -(s & 0x7FFF), s)
        else:
            s = x.to(tl.int32, bitcast=True).to(tl.int64)
            o = tl.where(s < 0, -(s & 0x7FFFFFFF), s)
        return o

    @triton.jit
    def _to_f64(x):
        """Exact widening; narrow types go through float32 (exact too)."""
        if x.dtype == tl.float64:
            y = x
        elif x.dtype == tl.float32:
            y = x.to(tl.float64)
        elif x.dtype == tl.float8e5:  # the top byte of a float16: widen the bits, NaN/Inf included
            h = (x.to(tl.int8, bitcast=True).to(tl.int16) << 8).to(tl.float16, bitcast=True)
            y = h.to(tl.float32).to(tl.float64)
        else:
            y = x.to(tl.float32).to(tl.float64)
        return y

    @triton.jit
    def _tile(
        a, b, inb, atol, rtol, fine_ptr, coarse_ptr, hoff,
        s_aa, s_bb, s_ab, s_dd, s_ad, m_ad, c_pass, m_ulp, c_both, c_nfa, c_nfb, c_mis, hist,
        EDGE: tl.constexpr, MASKED: tl.constexpr, ULP_BITS: tl.constexpr, NSMALL: tl.constexpr,
        DIAG: tl.constexpr,
    ):  # fmt: skip
        """Add one tile of loaded values. EDGE: ``inb`` marks the lanes inside the tensor."""
        xa = _to_f64(a)
        xb = _to_f64(b)
        if EDGE:
            xa = tl.where(inb, xa, 0.0)
            xb = tl.where(inb, xb, 0.0)
        if MASKED:
            fa = tl.abs(xa) <= 1.7976931348623157e308
            fb = tl.abs(xb) <= 1.7976931348623157e308
            both = fa & fb
            same = (~fa) & (~fb) & ((xa == xb) | ((xa != xa) & (xb != xb)))
            if EDGE:
                both = both & inb
                same = same & inb
                fa = fa | (~inb)
                fb = fb | (~inb)
            xa = tl.where(both, xa, 0.0)
            xb = tl.where(both, xb, 0.0)
        d = xb - xa
        ad = tl.abs(d)
        s_aa = tl.fma(xa, xa, s_aa)
        s_bb = tl.fma(xb, xb, s_bb)
        s_ab = tl.fma(xa, xb, s_ab)
        s_dd = tl.fma(d, d, s_dd)
        s_ad = s_ad + ad
        m_ad = tl.maximum(m_ad, ad)
        ok = ad <= atol + rtol * tl.abs(xa)
        if MASKED:
            ok = (ok & both) | same
            c_both += both.to(tl.int32)
            c_nfa += (~fa).to(tl.int32)
            c_nfb += (~fb).to(tl.int32)
            mis = (~both) & (~same)
            if EDGE:
                mis = mis & inb
            c_mis += mis.to(tl.int32)
        elif EDGE:
            ok = ok & inb
        c_pass += ok.to(tl.int32)
        if ULP_BITS > 0 and DIAG < 2:
            dist = tl.abs(_ordinal(a, ULP_BITS) - _ordinal(b, ULP_BITS))
            if MASKED:
                dist = tl.where(both, dist, 0)
            elif EDGE:
                dist = tl.where(inb, dist, 0)
            m_ulp = tl.maximum(m_ulp, dist)
            if DIAG == 0:  # DIAG 1 (timing only): no histograms, so no p99
                hist += tl.histogram(tl.minimum(dist, NSMALL - 1).to(tl.int32), NSMALL)
                tail = dist >= NSMALL - 1
                fidx = tl.minimum(dist, 65536).to(tl.int32)
                tl.atomic_add(fine_ptr + hoff + fidx, 1, mask=tail, sem="relaxed")
                if ULP_BITS == 32:
                    cidx = (dist >> 16).to(tl.int32)
                    tl.atomic_add(coarse_ptr + hoff + cidx, 1, mask=dist >= 65536, sem="relaxed")
        return s_aa, s_bb, s_ab, s_dd, s_ad, m_ad, c_pass, m_ulp, c_both, c_nfa, c_nfb, c_mis, hist

    @triton.jit(do_not_specialize=["n", "nprog"])
    def _compare_kernel(
        a_ptr, b_ptr, n, nprog, tol_ptr, part_ptr, small_ptr, fine_ptr, coarse_ptr,
        BLOCK: tl.constexpr, MASKED: tl.constexpr, ULP_BITS: tl.constexpr, NSMALL: tl.constexpr,
        NCOPY: tl.constexpr, NPART: tl.constexpr, PREFETCH: tl.constexpr, DIAG: tl.constexpr,
    ):  # fmt: skip
        pid = tl.program_id(0)  # nprog: the grid size (an argument, for Triton's interpreter)
        atol = tl.load(tol_ptr)  # float64: a Python float argument would arrive as float32
        rtol = tl.load(tol_ptr + 1)
        s_aa = tl.zeros([BLOCK], tl.float64)
        s_bb = tl.zeros([BLOCK], tl.float64)
        s_ab = tl.zeros([BLOCK], tl.float64)
        s_dd = tl.zeros([BLOCK], tl.float64)
        s_ad = tl.zeros([BLOCK], tl.float64)
        m_ad = tl.zeros([BLOCK], tl.float64)
        c_pass = tl.zeros([BLOCK], tl.int32)
        if ULP_BITS == 32:
            m_ulp = tl.zeros([BLOCK], tl.int64)
        else:
            m_ulp = tl.zeros([BLOCK], tl.int32)
        c_both = tl.zeros([BLOCK], tl.int32)
        c_nfa = tl.zeros([BLOCK], tl.int32)
        c_nfb = tl.zeros([BLOCK], tl.int32)
        c_mis = tl.zeros([BLOCK], tl.int32)
        hist = tl.zeros([NSMALL], tl.int32)
        hoff = (pid % NCOPY) * 65537
        n_full = n // BLOCK
        offs = tl.arange(0, BLOCK)
        if PREFETCH:
            # registers hold the next tile while this one is computed: two tiles in flight per warp
            has = pid < n_full
            a_nx = tl.load(a_ptr + pid * BLOCK + offs, mask=(offs < BLOCK) & has)
            b_nx = tl.load(b_ptr + pid * BLOCK + offs, mask=(offs < BLOCK) & has)
            for t in range(pid, n_full, nprog):
                a = a_nx
                b = b_nx
                tn = t + nprog
                a_nx = tl.load(a_ptr + tn * BLOCK + offs, mask=(offs < BLOCK) & (tn < n_full))
                b_nx = tl.load(b_ptr + tn * BLOCK + offs, mask=(offs < BLOCK) & (tn < n_full))
                s_aa, s_bb, s_ab, s_dd, s_ad, m_ad, c_pass, m_ulp, c_both, c_nfa, c_nfb, c_mis, hist = _tile(
                    a, b, offs < BLOCK, atol, rtol, fine_ptr, coarse_ptr, hoff,
                    s_aa, s_bb, s_ab, s_dd, s_ad, m_ad, c_pass, m_ulp, c_both, c_nfa, c_nfb, c_mis, hist,
                    False, MASKED, ULP_BITS, NSMALL, DIAG,
                )  # fmt: skip
        else:
            for t in range(pid, n_full, nprog):
                a = tl.load(a_ptr + t * BLOCK + offs)
                b = tl.load(b_ptr + t * BLOCK + offs)
                s_aa, s_bb, s_ab, s_dd, s_ad, m_ad, c_pass, m_ulp, c_both, c_nfa, c_nfb, c_mis, hist = _tile(
                    a, b, offs < BLOCK, atol, rtol, fine_ptr, coarse_ptr, hoff,
                    s_aa, s_bb, s_ab, s_dd, s_ad, m_ad, c_pass, m_ulp, c_both, c_nfa, c_nfb, c_mis, hist,
                    False, MASKED, ULP_BITS, NSMALL, DIAG,
                )  # fmt: skip
        if pid == nprog - 1:
            if n_full * BLOCK < n:
                inb = offs < n - n_full * BLOCK
                a = tl.load(a_ptr + n_full * BLOCK + offs, mask=inb)  # lanes past the end: zeroed in _tile
                b = tl.load(b_ptr + n_full * BLOCK + offs, mask=inb)
                s_aa, s_bb, s_ab, s_dd, s_ad, m_ad, c_pass, m_ulp, c_both, c_nfa, c_nfb, c_mis, hist = _tile(
                    a, b, inb, atol, rtol, fine_ptr, coarse_ptr, hoff,
                    s_aa, s_bb, s_ab, s_dd, s_ad, m_ad, c_pass, m_ulp, c_both, c_nfa, c_nfb, c_mis, hist,
                    True, MASKED, ULP_BITS, NSMALL, DIAG,
                )  # fmt: skip
        # add this program's totals into its own row (several launches accumulate)
        row = part_ptr + pid * NPART
        tl.store(row + 0, tl.load(row + 0) + tl.sum(s_aa, 0))
        tl.store(row + 1, tl.load(row + 1) + tl.sum(s_bb, 0))
        tl.store(row + 2, tl.load(row + 2) + tl.sum(s_ab, 0))
        tl.store(row + 3, tl.load(row + 3) + tl.sum(s_dd, 0))
        tl.store(row + 4, tl.load(row + 4) + tl.sum(s_ad, 0))
        tl.store(row + 5, tl.maximum(tl.load(row + 5), tl.max(m_ad, 0)))
        tl.store(row + 6, tl.load(row + 6) + tl.sum(c_pass.to(tl.int64), 0).to(tl.float64))
        tl.store(row + 7, tl.maximum(tl.load(row + 7), tl.max(m_ulp, 0).to(tl.float64)))
        if MASKED:
            tl.store(row + 8, tl.load(row + 8) + tl.sum(c_both.to(tl.int64), 0).to(tl.float64))
            tl.store(row + 9, tl.load(row + 9) + tl.sum(c_nfa.to(tl.int64), 0).to(tl.float64))
            tl.store(row + 10, tl.load(row + 10) + tl.sum(c_nfb.to(tl.int64), 0).to(tl.float64))
            tl.store(row + 11, tl.load(row + 11) + tl.sum(c_mis.to(tl.int64), 0).to(tl.float64))
        if ULP_BITS > 0:
            bins = tl.arange(0, NSMALL)
            srow = small_ptr + pid * NSMALL + bins
            tl.store(srow, tl.load(srow) + hist)

    @triton.jit(do_not_specialize=["grid", "slots", "n_known"])
    def _finish_kernel(
        part_ptr, grid, small_ptr, slots, n_known, out_ptr,
        MASKED: tl.constexpr, ULP_BITS: tl.constexpr, NSMALL: tl.constexpr, NPART: tl.constexpr,
        ROWS: tl.constexpr,
    ):  # fmt: skip
        """One program: totals of the per-program rows (columns as in the kernel; 8 = elements finite in
        both), and from the register histograms: 12 = number of bins 0..NSMALL-2 whose cumulative count
        stays below the p99 rank (NSMALL-1 means the p99 lies in the global histogram), 13 = their total,
        14 = the rank.
        """
        cols = tl.arange(0, NPART)
        tot = tl.zeros([NPART], tl.float64)
        mx = tl.zeros([NPART], tl.float64)
        bins = tl.arange(0, NSMALL)
        hist = tl.zeros([NSMALL], tl.int64)
        for r0 in range(0, grid, ROWS):
            rows = r0 + tl.arange(0, ROWS)
            rmask = rows < grid
            blk = tl.load(part_ptr + rows[:, None] * NPART + cols[None, :], mask=rmask[:, None], other=0.0)
            tot += tl.sum(blk, 0)
            mx = tl.maximum(mx, tl.max(blk, 0))
            if ULP_BITS > 0:
                sb = tl.load(small_ptr + rows[:, None] * NSMALL + bins[None, :], mask=rmask[:, None], other=0)
                hist += tl.sum(sb.to(tl.int64), 0)
        res = tl.where((cols == 5) | (cols == 7), mx, tot)
        if MASKED:
            n_both = tl.sum(tl.where(cols == 8, tot, 0.0), 0).to(tl.int64)
        else:
            n_both = n_known.to(tl.int64)
            res = tl.where(cols == 8, n_both.to(tl.float64), res)
        if ULP_BITS > 0:
            # positions outside the comparison (masked, or past the end) were binned at distance 0
            hist = tl.where(bins == 0, hist - (slots.to(tl.int64) - n_both), hist)
            hist = tl.where(bins == NSMALL - 1, 0, hist)  # counted (exactly) in the global histogram
            rank = (99 * n_both + 99) // 100
            cum = tl.cumsum(hist, 0)
            idx = tl.sum(((cum < rank) & (bins < NSMALL - 1)).to(tl.int64), 0)
            res = tl.where(cols == 12, idx.to(tl.float64), res)
            res = tl.where(cols == 13, tl.sum(hist, 0).to(tl.float64), res)
            res = tl.where(cols == 14, rank.to(tl.float64), res)
        tl.store(out_ptr + cols, res)


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


_TOL_CACHE: dict[tuple[str, float, float], torch.Tensor] = {}


def _tolerances(device: torch.device, atol: float, rtol: float) -> torch.Tensor:
    """(atol, rtol) as a float64 device tensor, kept so that repeated calls copy nothing."""
    key = (str(device), atol, rtol)
    t = _TOL_CACHE.get(key)
    if t is None:
        if len(_TOL_CACHE) > 64:
            _TOL_CACHE.clear()
        t = _TOL_CACHE[key] = torch.tensor([atol, rtol], dtype=torch.float64).to(device)
    return t


def _grid_max(device: torch.device) -> int:
    if device.type != "cuda":  # Triton's interpreter (TRITON_INTERPRET=1), used by the CPU tests
        return 3
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _sm_count(index) * CONFIG["programs_per_sm"]


def _pieces(a: torch.Tensor, b: torch.Tensor, device: torch.device, chunk_elems: int):
    """Contiguous 1-D pieces of a and b on ``device`` (views when both are already there, contiguous)."""
    if a.device == device and b.device == device and a.is_contiguous() and b.is_contiguous():
        fa, fb = a.reshape(-1), b.reshape(-1)
        for s in range(0, fa.numel(), _MAX_LAUNCH):
            yield fa[s : s + _MAX_LAUNCH], fb[s : s + _MAX_LAUNCH]
        return
    for ca, cb in _ref._chunk_pairs(a, b, max(1, min(chunk_elems, _MAX_LAUNCH))):
        yield ca.to(device, non_blocking=False).contiguous(), cb.to(device, non_blocking=False).contiguous()


def _run(
    a: torch.Tensor,
    b: torch.Tensor,
    device: torch.device,
    atol: float,
    rtol: float,
    chunk_elems: int,
    masked: bool,
    ulp_bits: int,
) -> tuple[list[float], torch.Tensor | None, torch.Tensor | None]:
    """One pass over the pair: the 16 totals of ``_finish_kernel`` plus, in column 15, the p99 counted
    from the global histogram; and the global histograms (for the rare float32 second pass)."""
    block, nsmall, ncopy = CONFIG["BLOCK"], CONFIG["NSMALL"], CONFIG["NCOPY"]
    grid_max = _grid_max(device)
    part = torch.zeros(grid_max, _NPART, dtype=torch.float64, device=device)
    small = torch.zeros(grid_max, nsmall, dtype=torch.int32, device=device)
    fine = torch.zeros(ncopy * 65537 if ulp_bits else 1, dtype=torch.int32, device=device)
    coarse = torch.zeros(ncopy * 65537 if ulp_bits == 32 else 1, dtype=torch.int32, device=device)
    tol = _tolerances(device, float(atol), float(rtol))
    slots = 0
    grid_used = 1
    for ca, cb in _pieces(a, b, device, chunk_elems):
        n = ca.numel()
        if n == 0:
            continue
        tiles = -(-n // block)
        grid = min(tiles, grid_max)
        grid_used = max(grid_used, grid)
        slots += tiles * block
        _compare_kernel[(grid,)](
            ca, cb, n, grid, tol, part, small, fine, coarse,
            BLOCK=block, MASKED=masked, ULP_BITS=ulp_bits, NSMALL=nsmall, NCOPY=ncopy, NPART=_NPART,
            PREFETCH=bool(CONFIG.get("PREFETCH", 0)), DIAG=int(CONFIG.get("DIAG", 0)),
            num_warps=CONFIG["num_warps"], enable_fp_fusion=False,
        )  # fmt: skip
    out = torch.zeros(_NPART, dtype=torch.float64, device=device)
    _finish_kernel[(1,)](
        part, grid_used, small, slots, a.numel(), out,
        MASKED=masked, ULP_BITS=ulp_bits, NSMALL=nsmall, NPART=_NPART, ROWS=64, num_warps=4,
        enable_fp_fusion=False,
    )  # fmt: skip
    if ulp_bits:
        # bins NSMALL-1 .. 2**16 from the global histogram, queued behind the kernels (no sync here):
        # the p99 is NSMALL-1 plus the number of those bins whose running count stays below the rank
        tail = fine.view(ncopy, 65537)[:, nsmall - 1 :].sum(0, dtype=torch.int64)
        below = (tail.cumsum(0).to(torch.float64) + out[13] < out[14]).sum()
        out[15] = below.to(torch.float64) + (nsmall - 1)
    return out.cpu().tolist(), (fine if ulp_bits else None), (coarse if ulp_bits == 32 else None)


def supports(a: torch.Tensor, b: torch.Tensor, device: torch.device) -> bool:
    floats = (torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2)
    return (
        available()
        and device.type == "cuda"
        and a.dtype in floats
        and b.dtype in floats
        and not (a.is_neg() or b.is_neg())
    )


def compare_cuda(
    a: torch.Tensor,
    b: torch.Tensor,
    device: torch.device,
    *,
    atol: float,
    rtol: float,
    chunk_elems: int,
    force_masked: bool = False,
) -> _ref.TensorMetrics | None:
    """Metrics computed on CUDA ``device`` (inputs already checked), or ``None`` when unsupported."""
    if not supports(a, b, device):
        return None
    return _compare_on(a, b, device, atol=atol, rtol=rtol, chunk_elems=chunk_elems, force_masked=force_masked)


def _compare_on(
    a: torch.Tensor,
    b: torch.Tensor,
    device: torch.device,
    *,
    atol: float,
    rtol: float,
    chunk_elems: int,
    force_masked: bool = False,
) -> _ref.TensorMetrics:
    a, b = a.detach(), b.detach()
    ulp_bits = _TORCH_TO_ULP_BITS.get(a.dtype, 0) if a.dtype == b.dtype and a.dtype in ULP_DTYPES else 0
    with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
        res, fine, coarse = _run(a, b, device, atol, rtol, chunk_elems, force_masked, ulp_bits)
        masked = force_masked
        if not masked and not all(_finite(x) for x in res[0:2]):
            masked = True
            res, fine, coarse = _run(a, b, device, atol, rtol, chunk_elems, True, ulp_bits)
    n_both = int(res[8])
    counts = (
        [n_both, int(res[6]), int(res[9]), int(res[10]), int(res[11])] if masked else [a.numel(), int(res[6]), 0, 0, 0]
    )
    ulp = None
    if ulp_bits:
        nsmall = CONFIG["NSMALL"]
        p99 = int(res[12]) if int(res[12]) < nsmall - 1 else int(res[15])
        if CONFIG.get("DIAG"):  # timing diagnostics leave the histograms out: there is no p99
            p99 = -1
        elif n_both == 0:
            p99 = 0
        elif p99 >= FINE_BINS:
            p99 = _p99_beyond_fine(a, b, device, fine, coarse, n_both, chunk_elems)
        ulp = (int(res[7]), p99)
    return metrics_from_totals(a, b, atol, rtol, res[0:5], res[5], counts, ulp)


def _finite(x: float) -> bool:
    return x == x and abs(x) != float("inf")


def _p99_beyond_fine(
    a: torch.Tensor, b: torch.Tensor, device: torch.device, fine: Any, coarse: Any, n_both: int, chunk_elems: int
) -> int:
    """float32 with the p99 at 2**16 ULPs or more: the coarse histogram names the bucket, a second pass
    bins the low 16 bits inside it (the reference's two-level method; rare, so plain torch)."""
    assert fine is not None and coarse is not None
    rank = nearest_rank(n_both)
    coarse_tot = coarse.view(-1, 65537).sum(0, dtype=torch.int64).cpu()
    coarse_tot[0] = n_both - int(coarse_tot[1:].sum())  # only distances >= 2**16 were binned coarsely
    bucket = first_reaching(coarse_tot, rank)
    rank_in_bucket = rank - int(coarse_tot[:bucket].sum())
    low = torch.zeros(FINE_BINS, dtype=torch.int64, device=device)
    spec = _ref._ULP_DTYPES[a.dtype]
    for ca, cb in _pieces(a, b, device, chunk_elems):
        dist = _ref._ulp_distance(ca, cb, spec)
        sel = torch.isfinite(ca) & torch.isfinite(cb) & ((dist >> 16) == bucket)
        low += torch.bincount((dist & 0xFFFF)[sel], minlength=FINE_BINS)
    return (bucket << 16) + first_reaching(low.cpu(), rank_in_bucket)
