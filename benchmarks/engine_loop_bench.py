"""Where the GPU pass's time goes: its main loop's arithmetic piece by piece, kernel time only.

    python3 benchmarks/engine_loop_bench.py out.json

A bare read of both tensors (``readonly``: one float32 dot product), then one loop with the pass's arithmetic
switched on in steps (SUMS: 3 or 5 float32 sums; BAND: 0, 1 or 2 tolerance counts, 3 packed in one int;
ULP: 1 the largest distance, 2 with its two moments, 3 the moments packed; ORD: the ordinal by select or by
xor), over tile shapes (BLOCK, TILES, warps, stages) and, last, fewer and longer programs. bf16 pairs of
8192x7168 and 1 GiB per tensor; the smaller of two ``triton.testing.do_bench`` medians; registers and spills
of each compiled variant. These kernels are measurements, not the engine (``validator.numerics.backends.cuda``).
"""

import json
import sys

import torch
import triton
import triton.language as tl
from triton.testing import do_bench


@triton.jit
def _ord16(x):
    s = x.to(tl.int16, bitcast=True).to(tl.int32)
    return tl.where(s < 0, -(s & 0x7FFF), s)


@triton.jit
def _ord16b(x):
    s = x.to(tl.int16, bitcast=True).to(tl.int32)
    neg = s >> 31
    return (s ^ (neg & 0x7FFF)) - neg


@triton.jit
def kern(a_ptr, b_ptr, n, per_prog, out_ptr, BLOCK: tl.constexpr, TILES: tl.constexpr, SUMS: tl.constexpr,
         BAND: tl.constexpr, ULP: tl.constexpr, STAGES: tl.constexpr, ORD: tl.constexpr, PERSIST: tl.constexpr):
    pid = tl.program_id(0)
    start = tl.multiple_of(pid.to(tl.int64) * per_prog, 16)
    end = tl.minimum(start + per_prog, n)
    ntiles = tl.cdiv(end - start, BLOCK) if PERSIST else TILES
    v_a2 = tl.zeros([BLOCK], dtype=tl.float32)
    v_b2, v_d2, v_abs, v_ad, v_top = v_a2, v_a2, v_a2, v_a2, v_a2
    v_lo = tl.zeros([BLOCK], dtype=tl.int32)
    v_hi, v_m1, v_m2, v_ulp = v_lo, v_lo, v_lo, v_lo
    r_lo, a_lo, r_hi, a_hi = 1e-3 * (1 - 2**-18), 1e-5 * (1 - 2**-18), 1e-3 * (1 + 2**-18), 1e-5 * (1 + 2**-18)
    lim = (end - start).to(tl.int32)
    for t in tl.range(ntiles, num_stages=STAGES):
        offs = t * BLOCK + tl.arange(0, BLOCK)
        inb = offs < lim
        a = tl.load(a_ptr + start + offs, mask=inb, other=0.0)
        b = tl.load(b_ptr + start + offs, mask=inb, other=0.0)
        xa, xb = a.to(tl.float32), b.to(tl.float32)
        d = xb - xa
        ad = tl.abs(d)
        v_a2 += xa * xa
        v_b2 += xb * xb
        v_d2 += d * d
        if SUMS == 5:
            v_abs += ad
            v_ad += xa * d
        v_top = tl.maximum(v_top, ad)
        aa = tl.abs(xa)
        if BAND == 1:
            v_lo += (inb & (ad <= aa * r_lo + a_lo)).to(tl.int32)
        if BAND == 2:
            v_lo += (inb & (ad <= aa * r_lo + a_lo)).to(tl.int32)
            v_hi += (inb & (ad <= aa * r_hi + a_hi)).to(tl.int32)
        if BAND == 3:  # packed, no inb (padding counted on host)
            v_lo += tl.where(ad <= aa * r_lo + a_lo, 1, 0) + tl.where(ad <= aa * r_hi + a_hi, 65536, 0)
        if ULP >= 1:
            if ORD == 1:
                dist = tl.abs(_ord16b(a) - _ord16b(b))
            else:
                dist = tl.abs(_ord16(a) - _ord16(b))
            v_ulp = tl.maximum(v_ulp, dist)
            if ULP == 2:
                v_m1 += dist
                v_m2 += dist * dist
            if ULP == 3:
                v_m1 += dist + (dist * dist << 12)
    row = out_ptr + pid * 16
    tl.store(row + 0, tl.sum(v_a2).to(tl.float64))
    tl.store(row + 1, tl.sum(v_b2).to(tl.float64))
    tl.store(row + 2, tl.sum(v_d2).to(tl.float64))
    tl.store(row + 3, tl.sum(v_abs).to(tl.float64))
    tl.store(row + 4, tl.sum(v_ad).to(tl.float64))
    tl.store(row + 5, tl.max(v_top).to(tl.float64))
    tl.store(row + 6, tl.sum(v_lo).to(tl.float64))
    tl.store(row + 7, tl.sum(v_hi).to(tl.float64))
    tl.store(row + 8, tl.max(v_ulp).to(tl.float64))
    tl.store(row + 9, tl.sum(v_m1).to(tl.float64))
    tl.store(row + 10, tl.sum(v_m2).to(tl.float64))


@triton.jit
def readonly(a_ptr, b_ptr, n, per_prog, out_ptr, BLOCK: tl.constexpr, TILES: tl.constexpr, STAGES: tl.constexpr):
    pid = tl.program_id(0)
    start = tl.multiple_of(pid.to(tl.int64) * per_prog, 16)
    lim = (tl.minimum(start + per_prog, n) - start).to(tl.int32)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for t in tl.range(TILES, num_stages=STAGES):
        offs = t * BLOCK + tl.arange(0, BLOCK)
        inb = offs < lim
        acc += tl.load(a_ptr + start + offs, mask=inb, other=0.0).to(tl.float32) * tl.load(b_ptr + start + offs, mask=inb, other=0.0).to(tl.float32)
    tl.store(out_ptr + pid * 16, tl.sum(acc).to(tl.float64))


def run():
    dev = "cuda"
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    res = []
    g = torch.Generator(device=dev).manual_seed(0)
    for name, n in [("8192x7168", 8192 * 7168), ("1GiB", 1 << 29)]:
        a = torch.randn(n, generator=g, device=dev)
        b = (a * (1 + 1e-3 * torch.randn(n, generator=g, device=dev))).to(torch.bfloat16)
        a = a.to(torch.bfloat16)
        nbytes = 4 * n
        out = torch.empty(200000, 16, dtype=torch.float64, device=dev)

        def bench(label, fn):
            ms = do_bench(fn, warmup=50, rep=300, return_mode="median")
            ms2 = do_bench(fn, warmup=10, rep=300, return_mode="median")
            ms = min(ms, ms2)
            print(f"{name:10s} {label:55s} {ms*1e3:8.1f} us {nbytes/ms/1e6:7.0f} GB/s", flush=True)
            res.append((name, label, ms))

        for BLOCK, TILES, W, ST in [(512, 32, 4, 3), (1024, 16, 4, 3), (1024, 16, 8, 3), (2048, 8, 8, 3), (1024, 32, 8, 4)]:
            per = BLOCK * TILES
            grid = (triton.cdiv(n, per),)
            bench(f"readonly B{BLOCK} T{TILES} W{W} S{ST}", lambda: readonly[grid](a, b, n, per, out, BLOCK=BLOCK, TILES=TILES, STAGES=ST, num_warps=W))
        cfgs = [
            dict(SUMS=3, BAND=0, ULP=0), dict(SUMS=5, BAND=0, ULP=0), dict(SUMS=5, BAND=2, ULP=0),
            dict(SUMS=5, BAND=3, ULP=0), dict(SUMS=5, BAND=2, ULP=1), dict(SUMS=5, BAND=2, ULP=2),
            dict(SUMS=5, BAND=3, ULP=3), dict(SUMS=5, BAND=3, ULP=3, ORD=1), dict(SUMS=5, BAND=0, ULP=1),
        ]
        for BLOCK, TILES, W, ST in [(512, 32, 4, 3), (1024, 16, 4, 3), (1024, 16, 8, 3), (2048, 8, 8, 3)]:
            per = BLOCK * TILES
            grid = (triton.cdiv(n, per),)
            for c in cfgs:
                c = {"ORD": 0, **c}
                k = kern[grid](a, b, n, per, out, BLOCK=BLOCK, TILES=TILES, STAGES=ST, PERSIST=False, num_warps=W, **c)
                bench(f"B{BLOCK} T{TILES} W{W} {c} r{k.n_regs} s{k.n_spills}", lambda: kern[grid](a, b, n, per, out, BLOCK=BLOCK, TILES=TILES, STAGES=ST, PERSIST=False, num_warps=W, **c))
        # persistent-ish: fewer, larger programs (multiple of SMs)
        for mult in (2, 4, 8, 16):
            for BLOCK, W in [(1024, 4), (1024, 8)]:
                progs = sms * mult
                per = triton.cdiv(triton.cdiv(n, progs), 1024) * 1024
                grid = (triton.cdiv(n, per),)
                c = dict(SUMS=5, BAND=3, ULP=3, ORD=1)
                bench(f"persist {mult}xSM B{BLOCK} W{W} {c}", lambda: kern[grid](a, b, n, per, out, BLOCK=BLOCK, TILES=1, STAGES=3, PERSIST=True, num_warps=W, **c))
        torch.cuda.empty_cache()
    json.dump(res, open(sys.argv[1], "w"))


if __name__ == "__main__":
    run()
