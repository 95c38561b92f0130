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

Large contiguous same-dtype pairs take the CUDA C engine instead (``_cuda_kernel.cu``, built by NVRTC
at first use; docs/performance.md, "CUDA kernels"): the sampled p99 window, then one main pass whose
step is built around the integer ALU, its busiest pipe. Its host side is kept short, because on a
small pair the host's share of a call is as large as the GPU's: the kernels are launched through the
driver with their arguments bound once per size (``_CuPlan``, ``_CuWorkspace``, ``_Bound``), the
result row is written by the kernel into pinned host memory, and the kernels leave their workspace
zeroed for the next call. A pair like one compared before takes a lane (``lane_start``): the
launches come first, and ``compare_tensors`` checks its inputs while the GPU works.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from .. import metrics as _ref
from ._finish import (
    FINE_BINS,
    SAMPLE_STRIDE,
    ULP_DTYPES,
    WINDOW_MAX_BINS,
    first_reaching,
    metrics_from_totals,
    nearest_rank,
    window_ranks,
)

__all__ = ["available", "compare_cuda", "CONFIG"]

try:  # Triton is optional: without it CUDA tensors take the reference path
    import triton
    import triton.language as tl

    _HAVE_TRITON = True
except ImportError:  # pragma: no cover - depends on the environment
    _HAVE_TRITON = False


_LANES: dict[tuple[Any, ...], _Lane] = {}  # pairs seen before on the CUDA C engine (lane_start)


class _Config(dict[str, int]):
    """The tuning knobs: a dict whose every change drops the cached lanes (``_LANES``), which hold
    kernels, plans and workspaces built for the values in force when they were made."""

    def __setitem__(self, key: str, value: int) -> None:
        super().__setitem__(key, value)
        _LANES.clear()

    def __delitem__(self, key: str) -> None:
        super().__delitem__(key)
        _LANES.clear()

    def update(self, *args: Any, **kwargs: Any) -> None:
        super().update(*args, **kwargs)
        _LANES.clear()

    def clear(self) -> None:
        super().clear()
        _LANES.clear()

    def pop(self, *args: Any) -> Any:
        _LANES.clear()
        return super().pop(*args)

    def setdefault(self, key: str, default: int = 0) -> int:
        _LANES.clear()
        return super().setdefault(key, default)


# Tuning knobs (benchmarks/compare_bench.py sweeps them on the device).
CONFIG: dict[str, int] = _Config(
    {
        "BLOCK": 512,  # elements per tile (the H200 sweep's best, docs/results/perf-h200.md)
        "num_warps": 4,
        "programs_per_sm": 16,  # persistent grid: this many programs per multiprocessor
        "NSMALL": 32,  # register-histogram bins; the last one means "NSMALL - 1 or more"
        "NCOPY": 8,  # copies of the global histogram
        "PREFETCH": 1,  # load the next tile before computing this one
        # timing diagnostics only: 1 = no ULP histograms (no p99), 2 = no ULP work at all, 3 = the ULP work
        # but no float64 arithmetic, 4 = the loads alone
        "DIAG": 0,
        "WINDOW": 1,  # the exact p99 through a sampled window (0: every distance histogrammed, the old way)
        "NHEAD": 1024,  # window bins kept per program copy; wider windows go to one shared histogram
        "SCOPY": 4,  # copies of the sample's histograms
        "SNSMALL": 64,  # register-histogram bins of the sample kernel
        "window_min": 1 << 20,  # smaller pairs: the old way (the sample would be too small to help)
        "ENGINE": 1,  # 1: the CUDA C kernels (_cuda_kernel.cu, NVRTC) where they apply; 0: Triton only
        # CUDA C: the H200 runs' choice (docs/results/perf-h200.md, "Kernel A/B")
        "cu_blocks_per_sm": 15,  # CUDA C: blocks of 256 threads per multiprocessor (the grid)
        # ... and for pairs of fewer than cu_small_n elements (kernel A/B, docs/results/perf-h200.md: one
        # wave of resident blocks was best on 8192x7168, three on 2**29; equal at 2**27)
        "cu_small_bps": 5,
        "cu_small_n": 1 << 27,
        # CUDA C: __launch_bounds__ minimum resident blocks (caps the registers: 5 -> 51, which ptxas
        # fits in 48 without spilling in the main loop; 4 -> 64; 0: the compiler's choice)
        "cu_minb": 5,
        # float8 pairs keep 64 registers (at 51 their main loop spills), so 4 resident blocks: 12 per SM,
        # 4 under cu_small_n (not measured on float8 separately)
        "cu_minb_8bit": 4,
        "cu_blocks_per_sm_8bit": 12,
        "cu_small_bps_8bit": 4,
        "LAUNCH": 1,  # CUDA C: 1 = launch through the driver with argument storage built once; 0 = torch's launcher
        "LANE": 1,  # CUDA C: 1 = a repeated pair takes the short way from compare_tensors (lane_start); 0 = never
        # CUDA C timing diagnostics only (the kernel's step() leaves a part out): 4 = the loads alone,
        # 6 = no tolerance test, 7 = no max |d|, 9 = no ULP work, 10 = no float64 work, 11 = no sums of products
        "CUDIAG": 0,
    }
)
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


@functools.cache
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
        lo, wn, whead_ptr, wbig_ptr, wsup_ptr, c_below,
        EDGE: tl.constexpr, MASKED: tl.constexpr, ULP_BITS: tl.constexpr, NSMALL: tl.constexpr,
        DIAG: tl.constexpr, WINDOW: tl.constexpr, NHEAD: tl.constexpr,
    ):  # fmt: skip
        """Add one tile of loaded values. EDGE: ``inb`` marks the lanes inside the tensor.

        WINDOW: instead of histogramming every distance, count those below ``lo`` (``c_below``) and
        histogram exactly those in ``[lo, lo + wn)``: the first NHEAD window bins in this program's copy
        at ``whead_ptr``, the others in one shared ``wbig_ptr`` with their ``>> 10`` totals in
        ``wsup_ptr`` (docs/performance.md, "The exact p99")."""
        if DIAG >= 3:  # timing diagnostics: 3 = the ULP work only, 4 = the loads only
            c_pass += (a == b).to(tl.int32)
        if DIAG < 3:
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
        if ULP_BITS > 0 and (DIAG < 2 or DIAG == 3):
            dist = tl.abs(_ordinal(a, ULP_BITS) - _ordinal(b, ULP_BITS))
            if MASKED:
                dist = tl.where(both, dist, 0)
            elif EDGE:
                dist = tl.where(inb, dist, 0)
            m_ulp = tl.maximum(m_ulp, dist)
            if WINDOW:
                u = dist - lo
                if MASKED:
                    c_below += ((u < 0) & both).to(tl.int32)
                    inw = (u >= 0) & (u < wn) & both
                elif EDGE:
                    c_below += ((u < 0) & inb).to(tl.int32)
                    inw = (u >= 0) & (u < wn) & inb
                else:
                    c_below += (u < 0).to(tl.int32)
                    inw = (u >= 0) & (u < wn)
                if DIAG == 0 or DIAG == 3:  # DIAG 1 (timing only): no window histogram, so no p99
                    head = u < NHEAD
                    ui = u.to(tl.int32)
                    tl.atomic_add(whead_ptr + tl.where(head, ui, 0), 1, mask=inw & head, sem="relaxed")
                    tl.atomic_add(wbig_ptr + tl.where(head, 0, ui), 1, mask=inw & (~head), sem="relaxed")
                    tl.atomic_add(wsup_ptr + tl.where(head, 0, ui >> 10), 1, mask=inw & (~head), sem="relaxed")
            elif DIAG == 0:  # DIAG 1 (timing only): no histograms, so no p99
                hist += tl.histogram(tl.minimum(dist, NSMALL - 1).to(tl.int32), NSMALL)
                tail = dist >= NSMALL - 1
                fidx = tl.minimum(dist, 65536).to(tl.int32)
                tl.atomic_add(fine_ptr + hoff + fidx, 1, mask=tail, sem="relaxed")
                if ULP_BITS == 32:
                    cidx = (dist >> 16).to(tl.int32)
                    tl.atomic_add(coarse_ptr + hoff + cidx, 1, mask=dist >= 65536, sem="relaxed")
        return s_aa, s_bb, s_ab, s_dd, s_ad, m_ad, c_pass, m_ulp, c_both, c_nfa, c_nfb, c_mis, hist, c_below

    @triton.jit(do_not_specialize=["n", "nprog"])
    def _compare_kernel(
        a_ptr, b_ptr, n, nprog, tol_ptr, part_ptr, small_ptr, fine_ptr, coarse_ptr,
        win_ptr, whead_ptr, wbig_ptr, wsup_ptr,
        BLOCK: tl.constexpr, MASKED: tl.constexpr, ULP_BITS: tl.constexpr, NSMALL: tl.constexpr,
        NCOPY: tl.constexpr, NPART: tl.constexpr, PREFETCH: tl.constexpr, DIAG: tl.constexpr,
        WINDOW: tl.constexpr, NHEAD: tl.constexpr,
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
        c_below = tl.zeros([BLOCK], tl.int32)
        hist = tl.zeros([NSMALL], tl.int32)
        hoff = (pid % NCOPY) * 65537
        if WINDOW:  # [lo, lo + wn): the window the sample chose (wn = 0: none)
            if ULP_BITS == 32:
                lo = tl.load(win_ptr)
                wn = tl.load(win_ptr + 1)
            else:
                lo = tl.load(win_ptr).to(tl.int32)
                wn = tl.load(win_ptr + 1).to(tl.int32)
        else:
            lo = 0
            wn = 0
        whead = whead_ptr + (pid % NCOPY) * NHEAD
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
                s_aa, s_bb, s_ab, s_dd, s_ad, m_ad, c_pass, m_ulp, c_both, c_nfa, c_nfb, c_mis, hist, c_below = _tile(
                    a, b, offs < BLOCK, atol, rtol, fine_ptr, coarse_ptr, hoff,
                    s_aa, s_bb, s_ab, s_dd, s_ad, m_ad, c_pass, m_ulp, c_both, c_nfa, c_nfb, c_mis, hist,
                    lo, wn, whead, wbig_ptr, wsup_ptr, c_below,
                    False, MASKED, ULP_BITS, NSMALL, DIAG, WINDOW, NHEAD,
                )  # fmt: skip
        else:
            for t in range(pid, n_full, nprog):
                a = tl.load(a_ptr + t * BLOCK + offs)
                b = tl.load(b_ptr + t * BLOCK + offs)
                s_aa, s_bb, s_ab, s_dd, s_ad, m_ad, c_pass, m_ulp, c_both, c_nfa, c_nfb, c_mis, hist, c_below = _tile(
                    a, b, offs < BLOCK, atol, rtol, fine_ptr, coarse_ptr, hoff,
                    s_aa, s_bb, s_ab, s_dd, s_ad, m_ad, c_pass, m_ulp, c_both, c_nfa, c_nfb, c_mis, hist,
                    lo, wn, whead, wbig_ptr, wsup_ptr, c_below,
                    False, MASKED, ULP_BITS, NSMALL, DIAG, WINDOW, NHEAD,
                )  # fmt: skip
        if pid == nprog - 1:
            if n_full * BLOCK < n:
                inb = offs < n - n_full * BLOCK
                a = tl.load(a_ptr + n_full * BLOCK + offs, mask=inb)  # lanes past the end: zeroed in _tile
                b = tl.load(b_ptr + n_full * BLOCK + offs, mask=inb)
                s_aa, s_bb, s_ab, s_dd, s_ad, m_ad, c_pass, m_ulp, c_both, c_nfa, c_nfb, c_mis, hist, c_below = _tile(
                    a, b, inb, atol, rtol, fine_ptr, coarse_ptr, hoff,
                    s_aa, s_bb, s_ab, s_dd, s_ad, m_ad, c_pass, m_ulp, c_both, c_nfa, c_nfb, c_mis, hist,
                    lo, wn, whead, wbig_ptr, wsup_ptr, c_below,
                    True, MASKED, ULP_BITS, NSMALL, DIAG, WINDOW, NHEAD,
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
        if WINDOW:
            tl.store(row + 12, tl.load(row + 12) + tl.sum(c_below.to(tl.int64), 0).to(tl.float64))
        elif ULP_BITS > 0:
            bins = tl.arange(0, NSMALL)
            srow = small_ptr + pid * NSMALL + bins
            tl.store(srow, tl.load(srow) + hist)

    @triton.jit
    def _sample_kernel(
        a_ptr, b_ptr, n, nprog, fine_ptr, sup_ptr, coarse_ptr, csup_ptr,
        BLOCK: tl.constexpr, STRIDE: tl.constexpr, ULP_BITS: tl.constexpr, NSMALL: tl.constexpr,
        SCOPY: tl.constexpr,
    ):  # fmt: skip
        """Exact histograms of the distances of every STRIDE-th full tile (the sample for the window):
        ``fine`` (0..2**16, the last bin counting larger ones) with its ``>> 10`` totals in ``sup``, and
        for float32 ``coarse`` (``distance >> 16``, distances of 2**16 and more only) with its ``>> 10``
        totals in ``csup``; SCOPY copies of each. Non-finite values are binned by their bits: the
        sample only steers the window, it never decides a result."""
        pid = tl.program_id(0)
        offs = tl.arange(0, BLOCK)
        n_tiles = (n // BLOCK + STRIDE - 1) // STRIDE
        hist = tl.zeros([NSMALL], tl.int32)
        fine = fine_ptr + (pid % SCOPY) * 65537
        sup = sup_ptr + (pid % SCOPY) * 128
        coarse = coarse_ptr + (pid % SCOPY) * 65537
        csup = csup_ptr + (pid % SCOPY) * 128
        for t in range(pid, n_tiles, nprog):
            base = t * (STRIDE * BLOCK)
            dist = tl.abs(
                _ordinal(tl.load(a_ptr + base + offs), ULP_BITS) - _ordinal(tl.load(b_ptr + base + offs), ULP_BITS)
            )
            hist += tl.histogram(tl.minimum(dist, NSMALL - 1).to(tl.int32), NSMALL)
            tail = dist >= NSMALL - 1
            fidx = tl.minimum(dist, 65536).to(tl.int32)
            tl.atomic_add(fine + fidx, 1, mask=tail, sem="relaxed")
            tl.atomic_add(sup + (fidx >> 10), 1, mask=tail, sem="relaxed")
            if ULP_BITS == 32:
                big = dist >= 65536
                cidx = (dist >> 16).to(tl.int32)
                tl.atomic_add(coarse + cidx, 1, mask=big, sem="relaxed")
                tl.atomic_add(csup + (cidx >> 10), 1, mask=big, sem="relaxed")
        bins = tl.arange(0, NSMALL)
        low = bins < NSMALL - 1  # bin NSMALL-1 ("that or more") was counted exactly above
        tl.atomic_add(fine + bins, hist, mask=low, sem="relaxed")
        tl.atomic_add(sup, tl.sum(tl.where(low, hist, 0), 0), sem="relaxed")

    @triton.jit
    def _rank_in(hist_ptr, sup_ptr, rank, prior, NCOPY: tl.constexpr, STRIDE_C: tl.constexpr, NSUP: tl.constexpr):
        """Smallest bin whose cumulative count (after ``prior``) reaches ``rank``, in a histogram kept in
        NCOPY copies ``STRIDE_C`` apart with its ``>> 10`` totals (NSUP bins, same copies) at ``sup_ptr``.
        Returns (bin, total count): bin is past the top when the histogram never reaches ``rank``."""
        copies = tl.arange(0, NCOPY)
        sb = tl.arange(0, NSUP)
        sup = tl.sum(tl.load(sup_ptr + copies[:, None] * 128 + sb[None, :]), 0).to(tl.int64)
        total = tl.sum(sup, 0)
        cum = tl.cumsum(sup, 0) + prior
        k = tl.sum((cum < rank).to(tl.int32), 0)
        before = prior + tl.sum(tl.where(sb < k, sup, 0), 0)
        i = tl.arange(0, 1024)
        idx = k * 1024 + i
        blk = tl.load(
            hist_ptr + copies[:, None] * STRIDE_C + idx[None, :], mask=(idx < STRIDE_C)[None, :] & (k < NSUP), other=0
        )
        cum2 = tl.cumsum(tl.sum(blk, 0).to(tl.int64), 0) + before
        return k * 1024 + tl.sum((cum2 < rank).to(tl.int32), 0), total

    @triton.jit(do_not_specialize=["r_lo", "r_hi"])
    def _window_kernel(
        fine_ptr, sup_ptr, coarse_ptr, csup_ptr, win_ptr, r_lo, r_hi,
        SCOPY: tl.constexpr, ULP_BITS: tl.constexpr, WMAX: tl.constexpr,
    ):  # fmt: skip
        """The window ``[lo, lo + wn)`` from the sample's histograms and the sample ranks ``r_lo < r_hi``
        (validator.kernels._finish.p99_window is the same rule, on the host); ``wn = 0`` when it would
        be wider than WMAX."""
        lo, _ = _rank_in(fine_ptr, sup_ptr, r_lo.to(tl.int64), 0, SCOPY, 65537, 128)
        top, n_fine = _rank_in(fine_ptr, sup_ptr, r_hi.to(tl.int64), 0, SCOPY, 65537, 128)
        lo = lo.to(tl.int64)
        top = top.to(tl.int64)
        if ULP_BITS == 32:  # ranks in the overflow bin: the >> 16 buckets of the coarse histogram
            below16 = n_fine - tl.sum(tl.load(fine_ptr + tl.arange(0, SCOPY) * 65537 + 65536), 0).to(tl.int64)
            clo, _ = _rank_in(coarse_ptr, csup_ptr, r_lo.to(tl.int64), below16, SCOPY, 65537, 128)
            chi, _ = _rank_in(coarse_ptr, csup_ptr, r_hi.to(tl.int64), below16, SCOPY, 65537, 128)
            lo = tl.where(lo >= 65536, clo.to(tl.int64) << 16, lo)
            top = tl.where(top >= 65536, (chi.to(tl.int64) + 1) << 16, top)
        wn = top + 1 - lo
        tl.store(win_ptr, lo)
        tl.store(win_ptr + 1, tl.where(wn <= WMAX, wn, 0))

    @triton.jit
    def _row_totals(part_ptr, grid, n_known, MASKED: tl.constexpr, NPART: tl.constexpr, ROWS: tl.constexpr):
        """The per-program rows reduced in a fixed order: sums, except the maxima of columns 5 and 7;
        column 8 = elements finite in both (counted when MASKED, else ``n_known``). Returns (row, n_both)."""
        cols = tl.arange(0, NPART)
        tot = tl.zeros([NPART], tl.float64)
        mx = tl.zeros([NPART], tl.float64)
        for r0 in range(0, grid, ROWS):
            rows = r0 + tl.arange(0, ROWS)
            blk = tl.load(part_ptr + rows[:, None] * NPART + cols[None, :], mask=(rows < grid)[:, None], other=0.0)
            tot += tl.sum(blk, 0)
            mx = tl.maximum(mx, tl.max(blk, 0))
        res = tl.where((cols == 5) | (cols == 7), mx, tot)
        if MASKED:
            n_both = tl.sum(tl.where(cols == 8, tot, 0.0), 0).to(tl.int64)
        else:
            n_both = n_known.to(tl.int64)
            res = tl.where(cols == 8, n_both.to(tl.float64), res)
        return res, n_both

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
        res, n_both = _row_totals(part_ptr, grid, n_known, MASKED, NPART, ROWS)
        if ULP_BITS > 0:
            bins = tl.arange(0, NSMALL)
            hist = tl.zeros([NSMALL], tl.int64)
            for r0 in range(0, grid, ROWS):
                rows = r0 + tl.arange(0, ROWS)
                sb = tl.load(small_ptr + rows[:, None] * NSMALL + bins[None, :], mask=(rows < grid)[:, None], other=0)
                hist += tl.sum(sb.to(tl.int64), 0)
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


if _HAVE_TRITON:

    @triton.jit(do_not_specialize=["grid", "n_known"])
    def _finish_window_kernel(
        part_ptr, grid, n_known, win_ptr, whead_ptr, wbig_ptr, wsup_ptr, out_ptr,
        MASKED: tl.constexpr, NPART: tl.constexpr, ROWS: tl.constexpr, NCOPY: tl.constexpr,
        NHEAD: tl.constexpr, NSUPW: tl.constexpr,
    ):  # fmt: skip
        """One program: the totals of the per-program rows (columns as in the kernel; 8 = elements finite
        in both) and, in column 12, the exact p99 found in the window, or -1 when its rank lies outside
        (13 = the rank, 14 = the count below the window)."""
        cols = tl.arange(0, NPART)
        res, n_both = _row_totals(part_ptr, grid, n_known, MASKED, NPART, ROWS)
        below = tl.sum(tl.where(cols == 12, res, 0.0), 0).to(tl.int64)
        rank = (99 * n_both + 99) // 100
        inside = rank - below  # the p99 is the inside-th smallest distance of the window
        lo = tl.load(win_ptr)
        copies = tl.arange(0, NCOPY)
        hb = tl.arange(0, NHEAD)
        head = tl.sum(tl.load(whead_ptr + copies[:, None] * NHEAD + hb[None, :]), 0).to(tl.int64)
        h_tot = tl.sum(head, 0)
        idx_head = tl.sum((tl.cumsum(head, 0) < inside).to(tl.int64), 0)
        # bins NHEAD and up: the >> 10 totals name the 1024-bin block, then the block itself
        sb = tl.arange(0, NSUPW)
        sup = tl.load(wsup_ptr + sb).to(tl.int64)
        cum = tl.cumsum(sup, 0) + h_tot
        k = tl.sum((cum < inside).to(tl.int64), 0)
        before = h_tot + tl.sum(tl.where(sb < k, sup, 0), 0)
        i = k * 1024 + tl.arange(0, 1024)
        big = tl.load(wbig_ptr + i, mask=i < NSUPW * 1024, other=0).to(tl.int64)
        idx_big = k * 1024 + tl.sum(((tl.cumsum(big, 0) + before) < inside).to(tl.int64), 0)
        w_tot = h_tot + tl.sum(sup, 0)
        found = (n_both > 0) & (inside >= 1) & (inside <= w_tot)
        p99 = tl.where(inside <= h_tot, lo + idx_head, lo + idx_big)
        res = tl.where(cols == 12, tl.where(found, p99, -1).to(tl.float64), res)
        res = tl.where(cols == 13, rank.to(tl.float64), res)
        res = tl.where(cols == 14, below.to(tl.float64), res)
        tl.store(out_ptr + cols, res)


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


_TOL_CACHE: dict[tuple[str, int | None, float, float], torch.Tensor] = {}


def _tolerances(device: torch.device, atol: float, rtol: float) -> torch.Tensor:
    """(atol, rtol) as a float64 device tensor, kept so that repeated calls copy nothing."""
    key = (device.type, device.index, atol, rtol)
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
            ca, cb, n, grid, tol, part, small, fine, coarse, part, small, small, small,
            BLOCK=block, MASKED=masked, ULP_BITS=ulp_bits, NSMALL=nsmall, NCOPY=ncopy, NPART=_NPART,
            PREFETCH=bool(CONFIG.get("PREFETCH", 0)), DIAG=int(CONFIG.get("DIAG", 0)), WINDOW=False, NHEAD=1,
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


_WS_CACHE: dict[tuple[str, tuple[tuple[str, torch.dtype, int], ...]], tuple[torch.Tensor, dict[str, torch.Tensor]]] = {}


_WS_LOCK = threading.Lock()


@contextlib.contextmanager
def _workspace(device: torch.device, layout: list[tuple[str, torch.dtype, int]]) -> Iterator[dict[str, torch.Tensor]]:
    """Zeroed buffers on ``device`` carved from one allocation: cached per layout, one memset per call.

    The buffers are shared, so the lock is held until the caller has read its result back: two threads
    comparing at once (on one stream or on two) must not zero or fill each other's histograms."""
    with _WS_LOCK:
        key = (str(device), tuple(layout))
        got = _WS_CACHE.get(key)
        if got is None:
            if len(_WS_CACHE) > 8:
                _WS_CACHE.clear()
            buf = torch.empty(_ws_bytes(layout), dtype=torch.uint8, device=device)
            got = _WS_CACHE[key] = (buf, _carve(buf, layout))
        got[0].zero_()
        yield got[1]


def _carve(buf: torch.Tensor, layout: list[tuple[str, torch.dtype, int]]) -> dict[str, torch.Tensor]:
    out, off = {}, 0
    for name, dtype, count in layout:
        size = torch.empty((), dtype=dtype).element_size()
        off = -(-off // 16) * 16
        out[name] = buf[off : off + size * count].view(dtype)
        off += size * count
    return out


def _layout(grid_max: int, ulp_bits: int) -> list[tuple[str, torch.dtype, int]]:
    scopy, ncopy, nhead = CONFIG["SCOPY"], CONFIG["NCOPY"], CONFIG["NHEAD"]
    wide = ulp_bits == 32
    return [
        ("part", torch.float64, grid_max * _NPART),
        ("out", torch.float64, _NPART),
        ("win", torch.int64, 2),
        ("sfine", torch.int32, scopy * 65537),
        ("ssup", torch.int32, scopy * 128),
        ("scoarse", torch.int32, scopy * 65537 if wide else 1),
        ("scsup", torch.int32, scopy * 128 if wide else 1),
        ("whead", torch.int32, ncopy * nhead),
        ("wbig", torch.int32, WINDOW_MAX_BINS),
        ("wsup", torch.int32, WINDOW_MAX_BINS >> 10),
    ]


def _ws_bytes(layout: list[tuple[str, torch.dtype, int]]) -> int:
    total = 0
    for _, dtype, count in layout:
        total = -(-total // 16) * 16 + torch.empty((), dtype=dtype).element_size() * count
    return total


def _run_window(
    a: torch.Tensor, b: torch.Tensor, device: torch.device, atol: float, rtol: float, masked: bool, ulp_bits: int
) -> list[float] | None:
    """One pass with the sampled window (docs/performance.md, "The exact p99"): a sample kernel over
    every SAMPLE_STRIDE-th tile, a one-program kernel that turns the sample into ``[lo, lo + wn)``,
    the full pass, and a one-program finish. Column 12 of the result is the exact p99, or -1 when its
    rank fell outside the window. ``None``: the pair is too small for a useful sample."""
    if device.type == "cuda":  # (contiguous: the C engine needs only the pointers)
        cu = _run_cu(a, b, device, atol, rtol, masked)
        if cu is not None:
            return cu
    block = CONFIG["BLOCK"]
    fa, fb = a.reshape(-1), b.reshape(-1)
    n = fa.numel()
    n_full = n // block
    s_tiles = -(-n_full // SAMPLE_STRIDE)
    ranks = window_ranks(s_tiles * block)
    if ranks is None or n > _MAX_LAUNCH:
        return None
    grid_max = _grid_max(device)
    layout = _layout(grid_max, ulp_bits)
    with _workspace(device, layout) as w:
        tol = _tolerances(device, float(atol), float(rtol))
        scopy, ncopy, nhead = CONFIG["SCOPY"], CONFIG["NCOPY"], CONFIG["NHEAD"]
        _sample_kernel[(min(s_tiles, grid_max),)](
            fa, fb, n, min(s_tiles, grid_max), w["sfine"], w["ssup"], w["scoarse"], w["scsup"],
            BLOCK=block, STRIDE=SAMPLE_STRIDE, ULP_BITS=ulp_bits, NSMALL=CONFIG["SNSMALL"], SCOPY=scopy,
            num_warps=CONFIG["num_warps"],
        )  # fmt: skip
        _window_kernel[(1,)](
            w["sfine"], w["ssup"], w["scoarse"], w["scsup"], w["win"], ranks[0], ranks[1],
            SCOPY=scopy, ULP_BITS=ulp_bits, WMAX=WINDOW_MAX_BINS, num_warps=4,
        )  # fmt: skip
        grid = min(-(-n // block), grid_max)
        _compare_kernel[(grid,)](
            fa, fb, n, grid, tol, w["part"], w["whead"], w["whead"], w["whead"],
            w["win"], w["whead"], w["wbig"], w["wsup"],
            BLOCK=block, MASKED=masked, ULP_BITS=ulp_bits, NSMALL=2, NCOPY=ncopy, NPART=_NPART,
            PREFETCH=bool(CONFIG.get("PREFETCH", 0)), DIAG=int(CONFIG.get("DIAG", 0)), WINDOW=True, NHEAD=nhead,
            num_warps=CONFIG["num_warps"], enable_fp_fusion=False,
        )  # fmt: skip
        _finish_window_kernel[(1,)](
            w["part"], grid, n, w["win"], w["whead"], w["wbig"], w["wsup"], w["out"],
            MASKED=masked, NPART=_NPART, ROWS=64, NCOPY=ncopy, NHEAD=nhead, NSUPW=WINDOW_MAX_BINS >> 10,
            num_warps=4, enable_fp_fusion=False,
        )  # fmt: skip
        res: list[float] = w["out"].cpu().tolist()
    return res


# ---------------------------------------------------------------- the CUDA C engine (NVRTC)

_CU_SOURCE = Path(__file__).with_name("_cuda_kernel.cu")
_CU_DT = {torch.float32: 1, torch.float16: 2, torch.bfloat16: 3, torch.float8_e4m3fn: 4, torch.float8_e5m2: 5}
_CU_THREADS = 256
_CU_ERRORS: dict[tuple[Any, ...], str] = {}
_CU_BUILT: dict[tuple[Any, ...], tuple[Any, Any]] = {}  # what was compiled (the benchmark reads attributes)


@functools.cache
def _libcuda() -> ctypes.CDLL:
    lib = ctypes.CDLL("libcuda.so.1")
    lib.cuLaunchKernel.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
    lib.cuLaunchKernel.restype = ctypes.c_int
    lib.cuMemsetD32Async.argtypes = [ctypes.c_void_p, ctypes.c_uint, ctypes.c_size_t, ctypes.c_void_p]
    lib.cuStreamSynchronize.argtypes = [ctypes.c_void_p]
    return lib


class _Launcher:
    """One NVRTC-built kernel launched straight through the driver (``cuLaunchKernel``). torch's
    ``_CudaKernel.__call__`` reopens libcuda and rebuilds every ctypes argument on each call: on the
    H200 host that was most of a small pair's time. ``kinds`` has one letter per kernel parameter:
    ``p`` a pointer (pass a tensor or an address), ``i`` a 32-bit int."""

    def __init__(self, kernel: Any, kinds: str) -> None:
        func = getattr(kernel, "func", None)
        if not isinstance(func, ctypes.c_void_p) or not func.value:
            raise TypeError("this torch's compiled kernel has no driver function handle")
        self.func, self.kinds, self.lib = func, kinds, _libcuda()

    def bind(self, args: list[Any]) -> _Bound:
        """Argument storage filled with ``args``, kept for repeated launches."""
        return _Bound(self, args)

    def __call__(self, grid: int, block: int, stream: int, args: list[Any]) -> None:
        self.bind(args).launch(grid, block, stream)


class _Bound:
    """A kernel's arguments in ctypes storage of their own: a caller changes only the slots that
    differ between calls (``slots[i].value``) and launches. Used under the workspace lock."""

    def __init__(self, launcher: _Launcher, args: list[Any]) -> None:
        self.launcher = launcher
        self.slots: list[Any] = [ctypes.c_void_p() if k == "p" else ctypes.c_int() for k in launcher.kinds]
        for slot, v in zip(self.slots, args, strict=True):
            slot.value = v.data_ptr() if isinstance(v, torch.Tensor) else v
        self.argv = (ctypes.c_void_p * len(self.slots))(*[ctypes.addressof(x) for x in self.slots])

    def launch(self, grid: int, block: int, stream: int) -> None:
        lib = self.launcher.lib
        rc = lib.cuLaunchKernel(self.launcher.func, grid, 1, 1, block, 1, 1, 0, stream, self.argv, None)
        if rc:
            name = ctypes.c_char_p()
            lib.cuGetErrorString(rc, ctypes.byref(name))
            raise RuntimeError(f"cuLaunchKernel failed: {(name.value or b'?').decode()} ({rc})")


class _TorchLaunch:
    """The same call through torch's own ``_CudaKernel`` (where ``_Launcher`` does not apply)."""

    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel

    def __call__(self, grid: int, block: int, stream: int, args: list[Any]) -> None:
        self.kernel(grid=(grid, 1, 1), block=(block, 1, 1), args=args)  # on torch's current stream


_SAMPLE_ARGS = "ppiiipppppppiii"  # vk_sample's parameters (see _cuda_kernel.cu)
_MAIN_ARGS = "ppipppppppppi"  # vk_main's


def _cu_macros(dt: int = 3) -> tuple[tuple[str, int], ...]:
    """The CUDA C build's tuning macros for element type ``dt`` (``_CU_DT``), from CONFIG."""
    minb = CONFIG.get("cu_minb_8bit", 4) if dt >= 4 else CONFIG.get("cu_minb", 0)
    return (("NHEAD", CONFIG["NHEAD"]), ("CUDIAG", CONFIG.get("CUDIAG", 0)), ("MINB", minb))


@functools.cache
def _cu_kernels(
    dt: int, masked: int, device_index: int, macros: tuple[tuple[str, int], ...], launch: int = 1
) -> tuple[Any, Any] | None:
    """vk_sample and vk_main of ``_cuda_kernel.cu`` compiled by NVRTC for one element type, masking
    mode and set of tuning macros, as two launchers; ``None`` when this torch has no
    ``torch.cuda._compile_kernel`` or the build fails (the Triton kernels are used then; the reason is
    kept in ``_CU_ERRORS``)."""
    compile_kernel = getattr(torch.cuda, "_compile_kernel", None)
    if compile_kernel is None:
        _CU_ERRORS[(dt, masked, macros)] = "torch.cuda._compile_kernel is missing"
        return None
    head = "".join(f"#define {k} {v}\n" for k, v in (("DT", dt), ("MASKED", masked), *macros))
    source = head + _CU_SOURCE.read_text()
    try:
        with torch.cuda.device(device_index):
            built = (
                compile_kernel(source, "vk_sample", nvcc_options=["--fmad=false"]),
                compile_kernel(source, "vk_main", nvcc_options=["--fmad=false"]),
            )
        _CU_BUILT[(dt, masked, macros)] = built
    except Exception as exc:  # no NVRTC, an old driver: the Triton path still works
        _CU_ERRORS[(dt, masked, macros)] = f"{type(exc).__name__}: {exc}"[:2000]
        return None
    if launch:
        try:
            return _Launcher(built[0], _SAMPLE_ARGS), _Launcher(built[1], _MAIN_ARGS)
        except (TypeError, OSError, AttributeError):  # another torch's kernel object: its own launcher
            pass
    return _TorchLaunch(built[0]), _TorchLaunch(built[1])


def _cu_layout(grid: int) -> list[tuple[str, torch.dtype, int]]:
    return [
        ("part", torch.float64, grid * _NPART),
        ("win", torch.int64, 2),
        ("done", torch.int32, 4),
        ("sfine", torch.int32, 66 * 1024),
        ("slowc", torch.int32, 8 * 1024),  # LOWC copies of the sample's bins below SMALLS (_cuda_kernel.cu)
        ("ssup", torch.int32, 256),
        ("scoarse", torch.int32, 65 * 1024),
        ("scsup", torch.int32, 256),
        ("whead", torch.int32, 8 * CONFIG["NHEAD"]),  # WHC copies (_cuda_kernel.cu)
        ("wbig", torch.int32, WINDOW_MAX_BINS + 1024),
        ("wsup", torch.int32, 1024),
        ("dout", torch.float64, _NPART),  # the result row on the device, for torch's launcher (_TorchLaunch)
    ]


def sample_tiles(n_full: int, stride: int = SAMPLE_STRIDE) -> list[int]:
    """The tiles the CUDA C sample reads out of ``n_full`` whole tiles: one in each stretch of
    ``stride``, at an offset hashed from the stretch's number (``sample_tile`` in _cuda_kernel.cu)."""
    tiles = []
    for g in range(-(-n_full // stride)):
        h = (g * 0x9E3779B1) & 0xFFFFFFFF
        h ^= h >> 16
        tiles.append(g * stride + h % min(stride, n_full - g * stride))
    return tiles


class _CuPlan:
    """What a CUDA C comparison of one size needs besides the tensors, worked out once: the two
    launchers, the sample's tiles and ranks, the grid and the workspace layout."""

    def __init__(self, kernels: tuple[Any, Any], n: int, esize: int, index: int, grid: int) -> None:
        self.sample, self.main = kernels
        self.n = n
        tile = _CU_THREADS * (16 // esize)  # the sample's tile: one 16-byte vector per thread
        self.n_full = n // tile
        self.s_tiles = -(-self.n_full // SAMPLE_STRIDE)
        self.ranks = window_ranks(self.s_tiles * tile)
        self.index, self.grid, self.layout = index, grid, _cu_layout(grid)
        self.ws_key = (f"cuda:{index}", tuple(self.layout))
        self.driver = isinstance(self.main, _Launcher)


class _CuWorkspace:
    """The CUDA C engine's buffers on one device (one allocation, carved by ``_cu_layout``), the
    pinned host row the main kernel writes its result into (no copy back: the host reads it once the
    stream is done), and the kernels' arguments bound to them per plan. The kernels leave the
    buffers zeroed for the next call (``_cuda_kernel.cu``, vk_main); they are zeroed here only when
    new or after a call that did not finish. Used under ``_WS_LOCK``."""

    def __init__(self, device: torch.device, layout: list[tuple[str, torch.dtype, int]]) -> None:
        self.buf = torch.zeros(_ws_bytes(layout), dtype=torch.uint8, device=device)
        self.w = _carve(self.buf, layout)
        self.out = torch.zeros(_NPART, dtype=torch.float64, pin_memory=True)
        self.out_view = (ctypes.c_double * _NPART).from_address(self.out.data_ptr())
        self.bound: dict[_CuPlan, tuple[_Bound, _Bound]] = {}
        self.dirty = False
        first, last = self.w["sfine"], self.w["scsup"]  # the sample's histograms, one stretch of words
        self.szero = (last.data_ptr() + 4 * last.numel() - first.data_ptr()) // 4

    def args(self, plan: _CuPlan, a: Any, b: Any, tol: Any, out: Any) -> tuple[list[Any], list[Any]]:
        """vk_sample's and vk_main's arguments (``a``, ``b``, ``tol``: tensors, or 0 to bind later; ``out``:
        where the result row goes)."""
        w = self.w
        assert plan.ranks is not None
        return (
            [a, b, plan.s_tiles, SAMPLE_STRIDE, plan.n_full, w["sfine"], w["ssup"], w["scoarse"], w["scsup"], w["slowc"],
             w["win"], w["done"][0:1], plan.ranks[0], plan.ranks[1], WINDOW_MAX_BINS],
            [a, b, plan.n, tol, w["win"], w["part"], w["whead"], w["wbig"], w["wsup"], w["done"], out,
             w["sfine"], self.szero],
        )  # fmt: skip

    def launch(self, plan: _CuPlan, a: torch.Tensor, b: torch.Tensor, tol: torch.Tensor, stream: int) -> None:
        """The two kernels of one comparison queued on ``stream`` (through the driver: ``plan.driver``)."""
        calls = self.bound.get(plan)
        if calls is None:
            if len(self.bound) > 64:
                self.bound.clear()
            sample_args, main_args = self.args(plan, 0, 0, 0, self.out)
            calls = self.bound[plan] = (plan.sample.bind(sample_args), plan.main.bind(main_args))
        sample, main = calls
        pa, pb = a.data_ptr(), b.data_ptr()
        sample.slots[0].value = main.slots[0].value = pa
        sample.slots[1].value = main.slots[1].value = pb
        main.slots[3].value = tol.data_ptr()
        sample.launch(min(plan.s_tiles, plan.grid), _CU_THREADS, stream)
        main.launch(plan.grid, _CU_THREADS, stream)

    def run(self, plan: _CuPlan, a: torch.Tensor, b: torch.Tensor, tol: torch.Tensor, stream: int) -> list[float]:
        """The whole comparison on ``stream``, and its result row."""
        if not plan.driver:  # torch's launcher, on torch's current stream (device tensors only)
            self.buf.zero_()
            sample_args, main_args = self.args(plan, a, b, tol, self.w["dout"])
            plan.sample(min(plan.s_tiles, plan.grid), _CU_THREADS, stream, sample_args)
            plan.main(plan.grid, _CU_THREADS, stream, main_args)
            return list(self.w["dout"].tolist())  # (waits for the stream)
        self.start(plan, a, b, tol, stream)
        return self.wait(stream)

    def start(self, plan: _CuPlan, a: torch.Tensor, b: torch.Tensor, tol: torch.Tensor, stream: int) -> None:
        """The comparison queued on ``stream`` through the driver (``plan.driver``); ``wait`` reads it."""
        lib = _libcuda()
        if not _context_current(lib):
            self.buf.zero_()  # a runtime call binds the device's context to this thread (and zeroes)
        elif self.dirty:
            lib.cuMemsetD32Async(self.buf.data_ptr(), 0, self.buf.numel() // 4, stream)
        self.dirty = True
        try:
            self.launch(plan, a, b, tol, stream)
        except BaseException:
            lib.cuStreamSynchronize(stream)  # what was queued finishes before the lock is released
            raise

    def wait(self, stream: int) -> list[float]:
        """The result row of the comparison ``start`` queued, once ``stream`` is done."""
        rc = _libcuda().cuStreamSynchronize(stream)
        if rc:
            raise RuntimeError(f"CUDA error {rc} in the comparison kernels")
        self.dirty = False
        return self.out_view[:]


_TLS = threading.local()


def _context_current(lib: ctypes.CDLL) -> bool:
    """Whether this thread has a current CUDA context (the driver launches need one; a thread that has
    made no CUDA runtime call yet has none). Checked once per thread: afterwards torch keeps it bound."""
    if getattr(_TLS, "context", False):
        return True
    ctx = ctypes.c_void_p()
    _TLS.context = lib.cuCtxGetCurrent(ctypes.byref(ctx)) == 0 and bool(ctx.value)
    return bool(_TLS.context)


_CU_WS: dict[tuple[str, tuple[Any, ...]], _CuWorkspace] = {}


@functools.lru_cache(maxsize=64)
def _cu_plan(
    dt: int, masked: int, n: int, esize: int, index: int, macros: tuple[tuple[str, int], ...], launch: int, bps: int
) -> _CuPlan | None:
    kernels = _cu_kernels(dt, masked, index, macros, launch)
    if kernels is None:
        return None
    plan = _CuPlan(kernels, n, esize, index, _sm_count(index) * bps)
    return plan if plan.ranks is not None else None


def _cu_bps(n: int, dt: int = 3) -> int:
    """Blocks per multiprocessor in the CUDA C grid for an ``n``-element pair of element type ``dt``."""
    suffix = "_8bit" if dt >= 4 else ""
    small = n < CONFIG.get("cu_small_n", 0)
    return CONFIG.get(("cu_small_bps" if small else "cu_blocks_per_sm") + suffix, 4 if small else 12)


def _on(device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """``device`` made current for the call, when it is not already (entering torch's guard costs)."""
    if device.type != "cuda" or device.index is None or device.index == torch.cuda.current_device():
        return contextlib.nullcontext()
    return torch.cuda.device(device)


_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _raw_stream(index: int) -> int:
    """The current stream of device ``index`` as a driver handle (torch's raw getter where it has one)."""
    if _RAW_STREAM is not None:
        return int(_RAW_STREAM(index))
    return int(torch.cuda.current_stream(index).cuda_stream)


def _run_cu(
    a: torch.Tensor, b: torch.Tensor, device: torch.device, atol: float, rtol: float, masked: bool
) -> list[float] | None:
    """The windowed pass on the CUDA C engine: two launches and a stream sync (no memset, no copy back).
    ``None`` where it does not apply (see ``_compare_on``): the Triton kernels run then."""
    dt = _CU_DT.get(a.dtype)
    n = a.numel()
    if (
        CONFIG.get("ENGINE", 1) != 1
        or dt is None
        or b.dtype != a.dtype
        or n >= 1 << 31
        or a.data_ptr() % 16
        or b.data_ptr() % 16
    ):
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    plan = _cu_plan(
        dt, int(masked), n, a.element_size(), index, _cu_macros(dt), CONFIG.get("LAUNCH", 1), _cu_bps(n, dt)
    )
    if plan is None:
        return None
    with _WS_LOCK:  # the workspace is shared: held until the result is read
        ws = _CU_WS.get(plan.ws_key)
        if ws is None:
            if len(_CU_WS) > 8:
                _CU_WS.clear()
                _LANES.clear()
            ws = _CU_WS[plan.ws_key] = _CuWorkspace(device, plan.layout)
        tol = _tolerances(device, float(atol), float(rtol))
        res = ws.run(plan, a, b, tol, _raw_stream(index))
    WINDOW_STATS["cuda_c"] += 1
    if CONFIG.get("LANE", 1) and plan.driver and not masked and not (CONFIG.get("DIAG") or CONFIG.get("CUDIAG")):
        if len(_LANES) > 64:
            _LANES.clear()
        _LANES[(a.dtype, b.dtype, n, a.device, b.device, atol, rtol)] = _Lane(plan, ws, tol, index, n)
    if CONFIG.get("CUDIAG"):  # timing diagnostics: not a result
        res[12] = -2.0
    return res


def engine_for(a: torch.Tensor, b: torch.Tensor, device: torch.device) -> str:
    """``"cuda-c"`` when the pair takes the CUDA C engine (a large same-dtype contiguous pair with ULP
    metrics, 16-byte aligned, on ``device``, and the engine built or not yet tried), else
    ``"cuda-triton"``."""
    dt = _CU_DT.get(a.dtype)
    ok = (
        dt is not None
        and b.dtype == a.dtype
        and CONFIG.get("ENGINE", 1) == 1
        and CONFIG.get("WINDOW", 1)
        and CONFIG["window_min"] <= a.numel() < 1 << 31
        and a.device == device == b.device
        and a.is_contiguous()
        and b.is_contiguous()
        and a.data_ptr() % 16 == 0
        and b.data_ptr() % 16 == 0
        and hasattr(torch.cuda, "_compile_kernel")
        and not any(k[0] == dt for k in _CU_ERRORS)
    )
    return "cuda-c" if ok else "cuda-triton"


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
    windowed = (
        ulp_bits > 0
        and CONFIG.get("WINDOW", 1)
        and a.numel() >= CONFIG["window_min"]
        and a.device == device
        and b.device == device
        and a.is_contiguous()
        and b.is_contiguous()
    )
    with _on(device):
        if windowed:
            wres = _run_window(a, b, device, atol, rtol, force_masked, ulp_bits)
            if wres is not None:
                got = _from_window(a, b, device, atol, rtol, chunk_elems, wres, force_masked, ulp_bits)
                if got is not None:
                    return got
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
        p99 = -1 if CONFIG.get("DIAG") else _p99_of(res, a, b, device, fine, coarse, n_both, chunk_elems)
        ulp = (int(res[7]), p99)  # timing diagnostics (DIAG) leave the histograms out: no p99
    return metrics_from_totals(a, b, atol, rtol, res[0:5], res[5], counts, ulp)


def _from_window(
    a: torch.Tensor, b: torch.Tensor, device: torch.device, atol: float, rtol: float, chunk_elems: int,
    wres: list[float], masked: bool, ulp_bits: int,
) -> _ref.TensorMetrics | None:  # fmt: skip
    """The metrics from a windowed pass's row ``wres`` (run ``masked`` or not): the pass again with
    masking when an unmasked one met NaN/Inf, and the full histograms when the p99's rank fell outside
    the window. ``None`` when the masked pass did not apply (the caller runs the full pass)."""
    if not masked and not (_finite(wres[0]) and _finite(wres[1])):
        masked = True
        again = _run_window(a, b, device, atol, rtol, True, ulp_bits)
        if again is None:
            return None
        wres = again
    WINDOW_STATS["window"] += 1
    p99 = int(wres[12])
    n_both = int(wres[8])
    diag = bool(CONFIG.get("DIAG") or CONFIG.get("CUDIAG"))
    if diag:  # timing diagnostics: no p99, no second pass
        p99 = -1
    elif p99 < 0 and n_both > 0:  # the rank fell outside the window: the full histograms
        WINDOW_STATS["fallback"] += 1
        full, fine, coarse = _run(a, b, device, atol, rtol, chunk_elems, masked, ulp_bits)
        p99 = _p99_of(full, a, b, device, fine, coarse, n_both, chunk_elems)
    counts = (
        [n_both, int(wres[6]), int(wres[9]), int(wres[10]), int(wres[11])]
        if masked
        else [a.numel(), int(wres[6]), 0, 0, 0]
    )
    return metrics_from_totals(
        a, b, atol, rtol, wres[0:5], wres[5], counts, (int(wres[7]), p99 if diag else max(p99, 0))
    )


class _Lane:
    """A pair seen before on the CUDA C engine (same dtypes, size, devices and tolerances): its plan,
    workspace and tolerance tensor, so that a repeated call goes from ``compare_tensors`` to the
    launches with a few checks (``lane_start``). Made by ``_run_cu``; dropped with any CONFIG change."""

    __slots__ = ("plan", "ws", "tol", "index", "numel")

    def __init__(self, plan: _CuPlan, ws: _CuWorkspace, tol: torch.Tensor, index: int, numel: int) -> None:
        self.plan, self.ws, self.tol, self.index, self.numel = plan, ws, tol, index, numel


_GET_DEVICE = getattr(torch._C, "_cuda_getDevice", None)


def lane_start(a: Any, b: Any, atol: Any, rtol: Any) -> _Pending | None:
    """The comparison of a pair like one the CUDA C engine ran before (same dtypes, size, devices and
    tolerances: a lane), already launched; or ``None`` when there is no such lane or this pair does
    not fit it (then ``compare_tensors`` takes its usual route). ``compare_tensors`` calls this before
    it checks its inputs, so that the checks run while the GPU works; everything the kernels rely on
    is checked here. The caller must ``finish`` or ``cancel`` what it gets: the workspace lock is held
    until then."""
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return None
    lane = _LANES.get((a.dtype, b.dtype, a.numel(), a.device, b.device, atol, rtol))
    if (
        lane is None
        or _GET_DEVICE is None
        or _RAW_STREAM is None
        or a.layout is not torch.strided
        or b.layout is not torch.strided
        or a.shape != b.shape
        or not (a.is_contiguous() and b.is_contiguous())
        or (a.data_ptr() | b.data_ptr()) & 15
        or a.is_neg()
        or b.is_neg()
        or _GET_DEVICE() != lane.index
    ):
        return None
    stream = _RAW_STREAM(lane.index)
    _WS_LOCK.acquire()
    try:
        lane.ws.start(lane.plan, a, b, lane.tol, stream)
    except BaseException:
        _WS_LOCK.release()
        raise
    WINDOW_STATS["cuda_c"] += 1
    return _Pending(lane, a, b, atol, rtol, stream)


class _Pending:
    """A comparison ``lane_start`` launched, holding the workspace lock until ``finish`` or ``cancel``."""

    __slots__ = ("lane", "a", "b", "atol", "rtol", "stream")

    def __init__(self, lane: _Lane, a: torch.Tensor, b: torch.Tensor, atol: float, rtol: float, stream: int) -> None:
        self.lane, self.a, self.b, self.atol, self.rtol, self.stream = lane, a, b, atol, rtol, stream

    def cancel(self) -> None:
        """Wait for the launched kernels (they use the shared workspace) and let the next call go."""
        try:
            self.lane.ws.wait(self.stream)
        finally:
            _WS_LOCK.release()

    def finish(self, chunk_elems: int) -> _ref.TensorMetrics:
        """The metrics: the same kernels and the same result as the usual route, with less Python (on
        a small pair the host's share of a call is as large as the GPU's: docs/performance.md)."""
        try:
            res = self.lane.ws.wait(self.stream)
        finally:
            _WS_LOCK.release()
        a, b, atol, rtol = self.a, self.b, self.atol, self.rtol
        if not (res[12] >= 0 and _finite(res[0]) and _finite(res[1])):  # NaN/Inf, or a window miss
            got = _from_window(a, b, a.device, atol, rtol, chunk_elems, res, False, _TORCH_TO_ULP_BITS[a.dtype])
            return (
                got if got is not None else _compare_on(a, b, a.device, atol=atol, rtol=rtol, chunk_elems=chunk_elems)
            )
        WINDOW_STATS["window"] += 1
        n = self.lane.numel
        return _ref.metrics_from_totals(
            n, a.dtype, b.dtype, atol, rtol, res[0:5], res[5], [n, int(res[6]), 0, 0, 0], (int(res[7]), int(res[12]))
        )


WINDOW_STATS = {"window": 0, "fallback": 0, "cuda_c": 0}  # how often the window path ran, and missed (tests read it)


def _p99_of(
    res: list[float], a: torch.Tensor, b: torch.Tensor, device: torch.device, fine: Any, coarse: Any,
    n_both: int, chunk_elems: int,
) -> int:  # fmt: skip
    """The p99 from the full-histogram pass's totals (``_run``)."""
    if n_both == 0:
        return 0
    nsmall = CONFIG["NSMALL"]
    p99 = int(res[12]) if int(res[12]) < nsmall - 1 else int(res[15])
    if p99 >= FINE_BINS:
        p99 = _p99_beyond_fine(a, b, device, fine, coarse, n_both, chunk_elems)
    return p99


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
