# mypy: disallow-untyped-defs=False, disallow-incomplete-defs=False, disallow-untyped-calls=False
# mypy: disallow-untyped-decorators=False, warn-return-any=False
"""The summary of :mod:`probes.core.summary` as two Triton kernels: one pass over the tensor, one to finish.

Imported only where Triton is installed (``probes.core.summary`` imports it lazily and falls back to plain torch
otherwise). Floating-point tensors (bf16, f16, f32, f64, float8 e4m3fn/e5m2) only; :mod:`probes.core.summary`
routes every other dtype to the torch path.

``_pass_kernel``: each program reads ``TILES`` tiles of ``BLOCK`` elements once (the next tile's load is
issued before the current tile's arithmetic) and keeps per-lane sums: x² and x in float32 (float64 for
float64 input), the largest |x|, and the checksum's weighted words in wrapping int32 (exact modulo 2**32).
No per-element NaN/Inf test: a NaN or inf makes the program's sum of squares non-finite. Such a program,
or one whose largest |x| lies outside [2**-40, 2**60] (squares that float32 would lose), reads its tiles
again in float64, counting NaN and non-finite elements (rare, and only that program). Each program
writes one row of partials: sum x², sum x, max finite |x| (float64), NaN count, non-finite count,
checksum (int64; the counts and checksum bit-cast into the float64 row).

``_finish_kernel`` (one program) adds the rows in a fixed order, so the result is the same bits on every
call, writes the five float64 values into ``out`` (a slot) and, if given, adds 1 to a generation counter
(CUDA graph slots).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable

import torch
import triton
import triton.language as tl

__all__ = ["FUSED_DTYPES", "summarize_fused", "summarize_many_fused", "warm_up"]

_LO, _HI = tl.constexpr(2.0**-40), tl.constexpr(2.0**60)
# BLOCK = TILE_BYTES // element size (2048 bf16, 1024 f32: 16 elements per thread at 4 warps); WPE * BLOCK
# must stay a power of two <= 2**16. A chunk is up to MAX_TILES tiles; at most
# PROGRAMS_PER_SM programs per multiprocessor walk the chunks (grid stride), so the finishing kernel adds a
# few hundred rows. Chosen on an H200 (benchmarks/capture_overhead.md); the results do not depend on
# them beyond float32 rounding inside a chunk.
TILE_BYTES = 4096
MAX_TILES = 16
NUM_WARPS = 4
PROGRAMS_PER_SM = 4
_PROGRAMS: dict[int | None, int] = {}
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


@triton.jit
def _accumulate(x, v_sq, v_sum, v_max, v_ck, w0, lane, WPE: tl.constexpr, F8: tl.constexpr, ACC: tl.constexpr):
    """Add one tile to the per-lane sums. ``w0``: the checksum weight of the tile's first word."""
    if F8 != 0:  # the bits say what is NaN, whatever the decoder does
        v, _nan, _bad = _decode(x, F8, ACC)
    else:
        v = x.to(ACC)
    v_sq += v * v  # NaN or inf here makes the chunk's sum non-finite: counted then
    v_sum += v
    v_max = tl.maximum(v_max, tl.abs(v))
    for j in tl.static_range(WPE):
        v_ck += _words(x, WPE, j, F8) * (w0 + lane * WPE + j)  # int32, wrapping: exact mod 2**32
    return v_sq, v_sum, v_max, v_ck


@triton.jit
def _pass_program(
    x_ptr, n, tiles, nchunks, pid, nprog, row,
    BLOCK: tl.constexpr, WPE: tl.constexpr, F8: tl.constexpr, ACC: tl.constexpr, WIDE: tl.constexpr,
):  # fmt: skip
    """Program ``pid`` of ``nprog``: chunks ``pid, pid + nprog, ...`` of ``x``; its 6 partials at ``row``."""
    lane = tl.arange(0, BLOCK)
    span = tiles * BLOCK
    sq = tl.cast(0.0, tl.float64)
    total = tl.cast(0.0, tl.float64)
    top = tl.cast(0.0, tl.float64)
    nans = tl.cast(0, tl.int64)
    bads = tl.cast(0, tl.int64)
    ck = tl.cast(0, tl.int64)
    for c in range(pid, nchunks, nprog):  # chunk c: tiles [c * tiles, (c + 1) * tiles)
        start = tl.cast(c, tl.int64) * span
        base = x_ptr + start
        left = tl.minimum(n - start, span).to(tl.int32)
        v_sq = tl.zeros([BLOCK], dtype=ACC)
        v_sum = tl.zeros([BLOCK], dtype=ACC)
        v_max = tl.zeros([BLOCK], dtype=ACC)
        v_ck = tl.zeros([BLOCK], dtype=tl.int32)
        # checksum: word k of the tensor weighs (k mod 2**16) + 1; a tile's first word is a multiple of
        # WPE * BLOCK (a power of two <= 2**16), so the weights of its words are w0 + WPE * lane + j
        if left == span:  # a whole chunk: unmasked (vectorised) loads, the next tile's load issued early
            x_next = tl.load(base + lane)
            for t in tl.range(tiles):
                x = x_next
                if t + 1 < tiles:
                    x_next = tl.load(base + (t + 1) * BLOCK + lane)
                w0 = (((start + t * BLOCK) * WPE) & 0xFFFF).to(tl.int32) + 1
                v_sq, v_sum, v_max, v_ck = _accumulate(x, v_sq, v_sum, v_max, v_ck, w0, lane, WPE, F8, ACC)
        else:  # the tensor's last, partial chunk
            for t in tl.range(tiles):
                offs = t * BLOCK + lane
                x = tl.load(base + offs, mask=offs < left, other=0.0)
                w0 = (((start + t * BLOCK) * WPE) & 0xFFFF).to(tl.int32) + 1
                v_sq, v_sum, v_max, v_ck = _accumulate(x, v_sq, v_sum, v_max, v_ck, w0, lane, WPE, F8, ACC)
        q = tl.sum(v_sq.to(tl.float64))
        s = tl.sum(v_sum.to(tl.float64))
        m = tl.max(v_max).to(tl.float64)
        # squares all finite and inside float32's comfortable range: no NaN/inf in the chunk, sums exact
        # enough. Else (rare) read the chunk again in float64, tile by tile, counting NaN and inf
        dirty = (q != q) | (q == float("inf"))
        if not WIDE:
            dirty = dirty | ((m != 0) & ((m < _LO) | (m > _HI)))
        if dirty:
            q = tl.cast(0.0, tl.float64)
            s = tl.cast(0.0, tl.float64)
            m = tl.cast(0.0, tl.float64)
            for t2 in tl.range(tiles):
                offs2 = t2 * BLOCK + lane
                x2 = tl.load(base + offs2, mask=offs2 < left, other=0.0)
                v2, nan, bad = _decode(x2, F8, ACC)
                v64 = v2.to(tl.float64)
                q += tl.sum(v64 * v64)
                s += tl.sum(v64)
                m = tl.maximum(m, tl.max(tl.where(bad, 0.0, tl.abs(v64))))
                nans += tl.sum(nan.to(tl.int32)).to(tl.int64)
                bads += tl.sum(bad.to(tl.int32)).to(tl.int64)
        sq += q
        total += s
        top = tl.maximum(top, m)
        ck += tl.sum(v_ck.to(tl.int64))
    tl.store(row + 0, sq)
    tl.store(row + 1, total)
    tl.store(row + 2, top)
    tl.store(row + 3, nans.to(tl.float64, bitcast=True))
    tl.store(row + 4, bads.to(tl.float64, bitcast=True))
    tl.store(row + 5, ck.to(tl.float64, bitcast=True))


@triton.jit(do_not_specialize=["n", "tiles", "nchunks"])
def _pass_kernel(
    x_ptr, n, tiles, nchunks, part_ptr,
    BLOCK: tl.constexpr, WPE: tl.constexpr, F8: tl.constexpr, ACC: tl.constexpr, WIDE: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    _pass_program(
        x_ptr, n, tiles, nchunks, pid, tl.num_programs(0), part_ptr + pid.to(tl.int64) * 6, BLOCK, WPE, F8, ACC, WIDE
    )


@triton.jit(do_not_specialize=["ntensors", "row0"])
def _pass_many_kernel(
    group_ptr, ntensors, row0, part_ptr,
    DT: tl.constexpr, BLOCK: tl.constexpr, WPE: tl.constexpr, F8: tl.constexpr, ACC: tl.constexpr,
    WIDE: tl.constexpr, ALIGNED: tl.constexpr,
):  # fmt: skip
    """Partial row ``row0 + program_id`` of ``ntensors`` tensors of one dtype whose programs own consecutive
    partial rows. Per tensor, int64: (address, n, tiles, nchunks, programs, its first partial row), in
    ascending row order. ``ALIGNED``: every address is a multiple of 16 bytes, which ``_pass_kernel``
    learns from its argument; told so, the compiler lays out the loads (and so orders the sums) as there."""
    row = row0 + tl.program_id(0).to(tl.int64)
    owner = tl.cast(0, tl.int64)
    for j in range(ntensors):  # the last tensor whose first row is <= row
        owner = tl.where(tl.load(group_ptr + j * 6 + 5) <= row, j, owner)
    entry = group_ptr + owner * 6
    first = tl.load(entry + 5)
    x_ptr = tl.load(entry + 0).to(tl.pointer_type(DT))
    if ALIGNED:
        x_ptr = tl.multiple_of(x_ptr, 16)
    _pass_program(
        x_ptr,
        tl.load(entry + 1),
        tl.load(entry + 2).to(tl.int32),
        tl.load(entry + 3).to(tl.int32),
        (row - first).to(tl.int32),
        tl.load(entry + 4).to(tl.int32),
        part_ptr + row * 6,
        BLOCK,
        WPE,
        F8,
        ACC,
        WIDE,
    )


@triton.jit
def _finish_program(part_ptr, rows, n, out_ptr, gen_ptr, HAS_GEN: tl.constexpr, CHUNK: tl.constexpr):
    """Add ``rows`` rows of partials at ``part_ptr`` in a fixed order; the five values into ``out_ptr``."""
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
    tl.store(out_ptr + 4, (tl.sum(ck) & 0xFFFFFFFF).to(tl.float64))
    if HAS_GEN:
        tl.store(gen_ptr, tl.load(gen_ptr) + 1)


@triton.jit(do_not_specialize=["rows", "n", "out_ptr", "gen_ptr"])
def _finish_kernel(part_ptr, rows, n, out_ptr, gen_ptr, HAS_GEN: tl.constexpr, CHUNK: tl.constexpr):
    _finish_program(part_ptr, rows, n, out_ptr, gen_ptr, HAS_GEN, CHUNK)


@triton.jit
def _finish_many_kernel(tensors_ptr, part_ptr, out_ptr, CHUNK: tl.constexpr):
    """One program per tensor: (first partial row, rows, n, row of ``out``), int64."""
    entry = tensors_ptr + tl.program_id(0).to(tl.int64) * 4
    _finish_program(
        part_ptr + tl.load(entry) * 6,
        tl.load(entry + 1),
        tl.load(entry + 2),
        out_ptr + tl.load(entry + 3) * 5,
        out_ptr,
        False,
        CHUNK,
    )


def _max_programs(device: torch.device) -> int:
    if device.type != "cuda":
        return 8  # Triton's interpreter: a few programs, each with several chunks
    count = _PROGRAMS.get(device.index)
    if count is None:
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        count = _PROGRAMS[device.index] = PROGRAMS_PER_SM * sms
    return count


def _plan(x: torch.Tensor) -> tuple[int, int, int, int]:
    """(elements per tile, tiles per chunk, chunks, programs) of ``x``'s pass; the same for one tensor alone
    or among many, so both give the same bits."""
    return _plan_of(x.numel(), x.element_size(), _max_programs(x.device))


@functools.lru_cache(maxsize=4096)
def _plan_of(n: int, itemsize: int, most: int) -> tuple[int, int, int, int]:
    block = TILE_BYTES // itemsize
    ntiles = triton.cdiv(n, block)
    tiles = max(1, min(MAX_TILES, ntiles // (2 * most)))  # long chunks only where there are plenty
    nchunks = triton.cdiv(ntiles, tiles)
    return block, tiles, nchunks, min(nchunks, most)


def _acc(dtype: torch.dtype) -> tl.dtype:
    return tl.float64 if dtype == torch.float64 else tl.float32


def _on(device: torch.device) -> contextlib.AbstractContextManager[object]:
    """``device`` made current while Triton launches (it launches on the current device), if it is not."""
    if device.type == "cuda" and device.index != torch.cuda.current_device():
        return torch.cuda.device(device)
    return contextlib.nullcontext()


def summarize_fused(x: torch.Tensor, out: torch.Tensor, counter: torch.Tensor | None = None) -> None:
    """Write the summary of ``x`` (contiguous, a dtype of :data:`FUSED_DTYPES`) into ``out`` (float64 [5]);
    add 1 to ``counter`` (int64 [1]) if given. Two kernel launches on the current stream; no host sync."""
    wpe, f8 = FUSED_DTYPES[x.dtype]
    n = x.numel()
    block, tiles, nchunks, programs = _plan(x)
    part = torch.empty(max(programs, 1), 6, dtype=torch.float64, device=x.device)
    gen = counter if counter is not None else out
    with _on(x.device):
        if programs:
            _pass_kernel[(programs,)](
                x, n, tiles, nchunks, part, BLOCK=block, WPE=wpe, F8=f8, ACC=_acc(x.dtype),
                WIDE=x.dtype == torch.float64, num_warps=NUM_WARPS, enable_fp_fusion=True,
            )  # fmt: skip
        _finish_kernel[(1,)](
            part, programs, n, out, gen, HAS_GEN=counter is not None, CHUNK=256, num_warps=4, enable_fp_fusion=True
        )


_TL_DTYPES = {
    torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32, torch.float64: tl.float64,
    torch.float8_e4m3fn: tl.float8e4nv, torch.float8_e5m2: tl.float8e5,
}  # fmt: skip


def summarize_many_fused(
    xs: list[torch.Tensor], out: torch.Tensor, out_rows: list[int],
    host_buffer: Callable[[int], torch.Tensor] | None = None,
) -> None:  # fmt: skip
    """The summaries of ``xs`` (contiguous, dtypes of :data:`FUSED_DTYPES`, all on ``out``'s device) into rows
    ``out_rows`` of ``out`` (float64 [rows, 5]), the same bits as :func:`summarize_fused` of each alone.

    One small table (a few integers per tensor) goes to the device, one copy from pinned memory; then one
    pass kernel per dtype present (and alignment), whose programs find their tensor in the table, and one
    finishing kernel for all: a few launches for the whole list instead of two per tensor.
    No host sync. The tensors must stay unchanged until the kernels have run on the current stream.
    ``host_buffer(nbytes)``: a pinned uint8 buffer of at least ``nbytes`` for the table, which the caller
    keeps until the copy has run (default: a new pinned tensor from torch's caching host allocator).
    """
    groups: dict[tuple[torch.dtype, bool], list[tuple[int, int, int, int, int, int]]] = {}
    for x, out_row in zip(xs, out_rows, strict=True):
        _block, tiles, nchunks, programs = _plan(x)
        address = x.data_ptr()
        groups.setdefault((x.dtype, address % 16 == 0), []).append(
            (address, x.numel(), tiles, nchunks, programs, out_row)
        )
    # the table: per tensor (first partial row, rows, n, row of out), then per group its tensors' entries
    finish: list[int] = []
    entries: list[int] = []
    launches = []
    rows = 0
    for (dtype, aligned), members in groups.items():
        launches.append((dtype, aligned, len(members), rows, 4 * len(xs) + len(entries)))
        for address, n, tiles, nchunks, programs, out_row in members:
            entries += (address, n, tiles, nchunks, programs, rows)
            finish += (rows, programs, n, out_row)
            rows += programs
    table = finish + entries
    device = out.device
    if host_buffer is not None:
        host = host_buffer(8 * len(table))[: 8 * len(table)].view(torch.int64)
        host.numpy()[:] = table
    else:
        host = torch.tensor(table, dtype=torch.int64)
        if device.type == "cuda":
            host = host.pin_memory()
    dev = host.to(device, non_blocking=True)
    part = torch.empty(max(rows, 1), 6, dtype=torch.float64, device=device)
    with _on(device):
        _launch_many(launches, rows, dev, part, out, len(xs))


def _launch_many(
    launches: list[tuple[torch.dtype, bool, int, int, int]],
    rows: int,
    dev: torch.Tensor,
    part: torch.Tensor,
    out: torch.Tensor,
    count_all: int,
) -> None:
    for i, (dtype, aligned, count, row0, offset) in enumerate(launches):
        programs = (launches[i + 1][3] if i + 1 < len(launches) else rows) - row0
        if programs:
            wpe, f8 = FUSED_DTYPES[dtype]
            _pass_many_kernel[(programs,)](
                dev[offset:], count, row0, part, DT=_TL_DTYPES[dtype], BLOCK=TILE_BYTES // dtype.itemsize, WPE=wpe,
                F8=f8, ACC=_acc(dtype), WIDE=dtype == torch.float64, ALIGNED=aligned, num_warps=NUM_WARPS,
                enable_fp_fusion=True,
            )  # fmt: skip
    if count_all:
        _finish_many_kernel[(count_all,)](dev, part, out, CHUNK=256, num_warps=4, enable_fp_fusion=True)


def warm_up(device: torch.device) -> None:
    """Compile the kernels for the common dtypes now (before CUDA graph capture)."""
    out = torch.empty(5, dtype=torch.float64, device=device)
    gen = torch.zeros(1, dtype=torch.int64, device=device)
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        x = torch.zeros(64, dtype=dtype, device=device)
        summarize_fused(x, out)
        summarize_fused(x, out, gen)
        summarize_many_fused([x], out.view(1, 5), [0])
        summarize_many_fused([x[1:]], out.view(1, 5), [0])  # not 16-byte aligned: the other variant
