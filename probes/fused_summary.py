# mypy: disallow-untyped-defs=False, disallow-incomplete-defs=False, disallow-untyped-calls=False
# mypy: disallow-untyped-decorators=False, warn-return-any=False
"""The summary of :mod:`probes.summary` as two Triton kernels: one pass over the tensor, one to finish.

Imported only where Triton is installed (``probes.summary`` imports it lazily and falls back to plain torch
otherwise). Floating-point tensors (bf16, f16, f32, f64, float8 e4m3fn/e5m2) only; :mod:`probes.summary`
routes every other dtype to the torch path.

``_pass_kernel``: each program reads ``TILES`` tiles of ``BLOCK`` elements once and keeps per-lane sums:
x and x² in float32 (float64 for float64 input), the largest finite |x|, the NaN and non-finite counts and
the checksum's weighted 16-bit (8-bit) words in int64. If the program's largest finite |x| lies outside
[2**-40, 2**60] (squares that float32 would lose), it reads its tiles again and sums in float64. It
writes one row of partials: sum x², sum x, max |x| (float64), NaN count, non-finite count, checksum
(int64, bit-cast into the float64 row).

``_finish_kernel`` (one program) adds the rows in a fixed order, so the result is the same bits on every
call, writes the five float64 values into ``out`` (a slot) and, if given, adds 1 to a generation counter
(CUDA graph slots). Integer sums wrap modulo 2**64, which keeps them exact modulo 2**48.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["FUSED_DTYPES", "summarize_fused", "warm_up"]

PERIOD = tl.constexpr(65521)
_LO, _HI = tl.constexpr(2.0**-40), tl.constexpr(2.0**60)
TILES = 8
NUM_WARPS = 4
TILE_BYTES = 4096  # BLOCK = TILE_BYTES // element size: 2048 bf16, 1024 f32
# dtype -> (words per element, float8 kind: 0 none, 1 e4m3fn, 2 e5m2)
FUSED_DTYPES: dict[torch.dtype, tuple[int, int]] = {
    torch.bfloat16: (1, 0),
    torch.float16: (1, 0),
    torch.float32: (2, 0),
    torch.float64: (4, 0),
    torch.float8_e4m3fn: (1, 1),
    torch.float8_e5m2: (1, 2),
}


@triton.jit
def _decode(x, F8: tl.constexpr, ACC: tl.constexpr):
    """(x in ACC, exactly; NaN positions; non-finite positions). For float8 the bits decide what is NaN
    or Inf, whatever the decoder does."""
    v = x.to(ACC)
    if F8 == 1:  # e4m3fn: no Inf; NaN is S.1111.111
        bits = x.to(tl.int8, bitcast=True) & 0x7F
        nan = bits == 0x7F
        bad = nan
    elif F8 == 2:  # e5m2: exponent 11111 is Inf (fraction 0) or NaN
        bits = x.to(tl.int8, bitcast=True) & 0x7F
        nan = bits > 0x7C
        bad = bits >= 0x7C
    else:
        nan = v != v
        bad = ~(tl.abs(v) < float("inf"))
    if F8 != 0:
        v = tl.where(nan, float("nan"), v)
    return v, nan, bad


@triton.jit
def _words(x, WPE: tl.constexpr, J: tl.constexpr, F8: tl.constexpr):
    """Word J (little-endian) of each element's bits, sign-extended to int32 (bytes for 1-byte dtypes)."""
    if WPE == 4:
        b = x.to(tl.int64, bitcast=True)
        return ((b << (48 - 16 * J)) >> 48).to(tl.int32)
    elif WPE == 2:
        b = x.to(tl.int32, bitcast=True)
        return (b << (16 - 16 * J)) >> 16
    elif F8 != 0:
        return x.to(tl.int8, bitcast=True).to(tl.int32)
    else:
        return x.to(tl.int16, bitcast=True).to(tl.int32)


@triton.jit(do_not_specialize=["n"])
def _pass_kernel(
    x_ptr, n, part_ptr,
    BLOCK: tl.constexpr, TILES: tl.constexpr, WPE: tl.constexpr, F8: tl.constexpr, ACC: tl.constexpr,
    WIDE: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    start = pid.to(tl.int64) * (BLOCK * TILES)
    lane = tl.arange(0, BLOCK)
    left = tl.minimum(n - start, BLOCK * TILES).to(tl.int32)
    v_sq = tl.zeros([BLOCK], dtype=ACC)
    v_sum = tl.zeros([BLOCK], dtype=ACC)
    v_max = tl.zeros([BLOCK], dtype=ACC)
    v_nan = tl.zeros([BLOCK], dtype=tl.int32)
    v_bad = tl.zeros([BLOCK], dtype=tl.int32)
    v_ck = tl.zeros([BLOCK], dtype=tl.int64)
    for t in tl.range(TILES):
        offs = t * BLOCK + lane
        inb = offs < left
        x = tl.load(x_ptr + start + offs, mask=inb, other=0.0)
        v, nan, bad = _decode(x, F8, ACC)
        v_sq += v * v
        v_sum += v
        v_max = tl.maximum(v_max, tl.where(bad, 0.0, tl.abs(v)))
        v_nan += nan.to(tl.int32)
        v_bad += bad.to(tl.int32)
        # checksum: word k (k = WPE * element + j) weighted by (k mod PERIOD) + 1; one subtraction keeps
        # the residue in range because WPE * BLOCK < PERIOD
        r0 = ((start + t * BLOCK) * WPE % PERIOD).to(tl.int32)
        for j in tl.static_range(WPE):
            r = r0 + lane * WPE + j
            r = tl.where(r >= PERIOD, r - PERIOD, r)
            v_ck += (_words(x, WPE, j, F8) * (r + 1)).to(tl.int64)  # |word * weight| < 2**31; padding is 0
    top = tl.max(v_max).to(tl.float64)
    sq = tl.sum(v_sq.to(tl.float64))
    total = tl.sum(v_sum.to(tl.float64))
    if not WIDE:
        if (top > 0) & ((top < _LO) | (top > _HI)):  # float32 squares would underflow or overflow: float64
            w_sq = tl.zeros([BLOCK], dtype=tl.float64)
            w_sum = tl.zeros([BLOCK], dtype=tl.float64)
            for t in tl.range(TILES):
                offs = t * BLOCK + lane
                x = tl.load(x_ptr + start + offs, mask=offs < left, other=0.0)
                v = _decode(x, F8, tl.float32)[0].to(tl.float64)
                w_sq += v * v
                w_sum += v
            sq = tl.sum(w_sq)
            total = tl.sum(w_sum)
    row = part_ptr + pid.to(tl.int64) * 6
    tl.store(row + 0, sq)
    tl.store(row + 1, total)
    tl.store(row + 2, top)
    tl.store(row + 3, tl.sum(v_nan).to(tl.int64).to(tl.float64, bitcast=True))
    tl.store(row + 4, tl.sum(v_bad).to(tl.int64).to(tl.float64, bitcast=True))
    tl.store(row + 5, tl.sum(v_ck).to(tl.float64, bitcast=True))


@triton.jit(do_not_specialize=["rows", "n", "out_ptr", "gen_ptr"])
def _finish_kernel(part_ptr, rows, n, out_ptr, gen_ptr, HAS_GEN: tl.constexpr, CHUNK: tl.constexpr):
    lane = tl.arange(0, CHUNK)
    sq = tl.zeros([CHUNK], dtype=tl.float64)
    total = tl.zeros([CHUNK], dtype=tl.float64)
    top = tl.zeros([CHUNK], dtype=tl.float64)
    nan = tl.zeros([CHUNK], dtype=tl.int64)
    bad = tl.zeros([CHUNK], dtype=tl.int64)
    ck = tl.zeros([CHUNK], dtype=tl.int64)
    for r in range(0, rows, CHUNK):
        idx = r + lane
        m = idx < rows
        row = part_ptr + idx.to(tl.int64) * 6
        sq += tl.load(row + 0, mask=m, other=0.0)
        total += tl.load(row + 1, mask=m, other=0.0)
        top = tl.maximum(top, tl.load(row + 2, mask=m, other=0.0))
        nan += tl.load(row + 3, mask=m, other=0.0).to(tl.int64, bitcast=True)
        bad += tl.load(row + 4, mask=m, other=0.0).to(tl.int64, bitcast=True)
        ck += tl.load(row + 5, mask=m, other=0.0).to(tl.int64, bitcast=True)
    nans, bads = tl.sum(nan), tl.sum(bad)
    tl.store(out_ptr + 0, tl.sqrt(tl.sum(sq)))
    tl.store(out_ptr + 1, tl.where(nans > 0, float("nan"), tl.where(bads > 0, float("inf"), tl.max(top))))
    tl.store(out_ptr + 2, tl.sum(total) / n.to(tl.float64))
    tl.store(out_ptr + 3, bads.to(tl.float64))
    tl.store(out_ptr + 4, (tl.sum(ck) & 0xFFFFFFFFFFFF).to(tl.float64))
    if HAS_GEN:
        tl.store(gen_ptr, tl.load(gen_ptr) + 1)


def summarize_fused(x: torch.Tensor, out: torch.Tensor, counter: torch.Tensor | None = None) -> None:
    """Write the summary of ``x`` (contiguous, a dtype of :data:`FUSED_DTYPES`) into ``out`` (float64 [5]);
    add 1 to ``counter`` (int64 [1]) if given. Two kernel launches on the current stream; no host sync."""
    wpe, f8 = FUSED_DTYPES[x.dtype]
    n = x.numel()
    block = TILE_BYTES // x.element_size()
    programs = triton.cdiv(n, block * TILES)
    part = torch.empty(max(programs, 1), 6, dtype=torch.float64, device=x.device)
    if programs:
        wide = x.dtype == torch.float64
        _pass_kernel[(programs,)](
            x, n, part, BLOCK=block, TILES=TILES, WPE=wpe, F8=f8, ACC=tl.float64 if wide else tl.float32, WIDE=wide,
            num_warps=NUM_WARPS,
        )  # fmt: skip
    gen = counter if counter is not None else out
    _finish_kernel[(1,)](part, programs, n, out, gen, HAS_GEN=counter is not None, CHUNK=256, num_warps=4)


def warm_up(device: torch.device) -> None:
    """Compile the kernels for the common dtypes now (before CUDA graph capture)."""
    out = torch.empty(5, dtype=torch.float64, device=device)
    gen = torch.zeros(1, dtype=torch.int64, device=device)
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        x = torch.zeros(64, dtype=dtype, device=device)
        summarize_fused(x, out)
        summarize_fused(x, out, gen)
