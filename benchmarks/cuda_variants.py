"""Versions of validator/numerics/backends/cuda.py side by side on one GPU: checked against one another and the
float64 reference, then timed interleaved in one process.

    PYTHONPATH=$PWD python3 benchmarks/cuda_variants.py --out DIR \
        --variants base=validator/numerics/backends/cuda.py,other=/tmp/other_cuda.py [--no-big]

``--variants``: ``NAME=PATH`` entries, each a cuda.py file (a version of this checkout's, importing from its
``validator.numerics.backends``); the one named ``base`` is what the others are checked against.

1. Every variant's module is loaded by path as a module of its own (``benchmarks.engine_ab.load_module``); one
   process per variant first fills Triton's on-disk cache (``--warm``), each on small pairs of every kind of launch
   used below.
2. Correctness: on every class of ``benchmarks.engine_bench.CLASSES`` at 8192x7168 and at 1 GiB per tensor (a flat
   pair, as engine_bench sizes it), and on edge cases, each variant's ``cuda_totals`` (with the edges and piece
   size that ``floors.measure_blocks`` gives the backend) against ``base``'s: the exact fields (numel, counts,
   max_abs, max_ulp, NaN/Inf counts) equal, sums and block sums within 1e-6 relative, and whether the Totals are
   equal bit for bit; and against the float64 reference (``reference_totals``, run on the host in pieces on
   threads): the metrics to the tests' tolerances (``tests...test_metrics._assert_matches``), the block sums to
   1e-6 (1e-12 with a float64 side), the NaN/Inf counts exact.
3. Timing (after ``--tests-done`` appears, or ``--wait-max`` seconds, where given): per class and size,
   ``floors.measure_blocks`` on each variant (``engine_bench.on_backend`` swaps the module in), 16 rounds of 4
   calls per variant, the order of the variants reversed every other round, two warm-up calls each first; median
   µs per call and GB/s (both tensors' bytes over that median).

``--smoke`` (with ``TRITON_INTERPRET=1``, on the CPU, small pairs) checks this script alone.
"""

from __future__ import annotations

import argparse
import bisect
import dataclasses
import json
import math
import os
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from benchmarks.engine_ab import load_module
from benchmarks.engine_bench import CLASSES, on_backend
from validator.numerics import floors
from validator.numerics.backends import Totals
from validator.numerics.backends.reference import reference_totals
from validator.numerics.metrics import metrics_from_totals

PATHS: dict[str, str] = {}  # variant name -> its cuda.py (--variants)
ATOL, RTOL, CHUNK = 1e-5, 1e-3, 1 << 22  # what metrics.measure gives the backend
WIDE = (8192, 7168)
BIG = 1 << 29  # elements of a 1 GiB bf16 tensor (engine_bench: int(gib * (1 << 29)))
PROG = 57344  # elements of a program of a 8192x7168 pair: 64 blocks of 128 rows, 16 programs each
DEVICE = "cuda"  # (--smoke: "cpu", under Triton's interpreter, small pairs: a check of this script alone)


def module(name: str) -> Any:
    return load_module(PATHS[name], f"variant_{name}")


def parse_variants(text: str, base: bool = True) -> list[str]:
    """``NAME=PATH,...`` into :data:`PATHS`; the names, in order."""
    for entry in text.split(","):
        name, _, path = entry.partition("=")
        if not path or not Path(path).is_file():
            raise SystemExit(f"--variants: {entry!r} is not NAME=PATH of a cuda.py file")
        PATHS[name] = str(Path(path).resolve())
    if base and "base" not in PATHS:
        raise SystemExit("--variants: one variant must be named base")
    return list(PATHS)


# ------------------------------------------------------------------ pairs


def _drift(n: int, seed: int, dtype: torch.dtype = torch.bfloat16, noise: float = 1e-2) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    a = torch.randn(n, generator=g, device=DEVICE)
    b = a * (1 + noise * torch.randn(n, generator=g, device=DEVICE))
    return a.to(dtype), b.to(dtype)


def _spots(n: int, k: int, seed: int) -> torch.Tensor:
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:k].to(DEVICE)


def edge_nan_b_only() -> tuple[torch.Tensor, torch.Tensor]:
    a, b = _drift(math.prod(WIDE), 11)
    b[_spots(a.numel(), 64, 1)] = math.nan
    return a.view(WIDE), b.view(WIDE)


def edge_inf_signs() -> tuple[torch.Tensor, torch.Tensor]:
    a, b = _drift(math.prod(WIDE), 12)
    at = _spots(a.numel(), 96, 2)
    a[at[:16]], b[at[:16]] = math.inf, -math.inf  # mismatched
    a[at[16:32]], b[at[16:32]] = -math.inf, math.inf
    a[at[32:48]], b[at[32:48]] = math.inf, math.inf  # the same infinity
    a[at[48:64]], b[at[48:64]] = -math.inf, -math.inf
    a[at[64:80]] = math.inf  # one side only
    b[at[80:]] = -math.inf
    return a.view(WIDE), b.view(WIDE)


def edge_nan_rows() -> tuple[torch.Tensor, torch.Tensor]:
    a, b = _drift(math.prod(WIDE), 13)
    a, b = a.view(WIDE), b.view(WIDE)
    r = WIDE[0]  # (8192)
    a[[3, r // 8, r * 5 // 8]], b[[3, r // 8, r * 5 // 8]] = math.nan, math.nan  # whole rows: every lane of their tiles
    a[r * 7 // 8] = math.nan
    a[r * 7 // 8 + 1], b[r * 7 // 8 + 1] = math.inf, math.inf
    b[r - 1] = -math.inf  # the last row
    return a, b


def edge_columns() -> tuple[torch.Tensor, torch.Tensor]:
    """NaN/Inf placed by lane: 8 lanes of one program's group (lanes.py's _COLUMNS), 9 lanes of another, one lane
    in 3 tiles, NaN in a and Inf in b in one lane, the last tile of a program, and both sides' NaN in one place."""
    a, b = _drift(math.prod(WIDE), 14)
    for k in range(8):
        a[0 * PROG + k * 1024 + 100 + 37 * k] = math.nan
    for k in range(9):
        b[3 * PROG + k * 1024 + 5 + 101 * k] = math.inf
    for t in (0, 20, 55):
        a[6 * PROG + t * 1024 + 5] = -math.inf
    a[9 * PROG + 3 * 1024 + 7], b[9 * PROG + 40 * 1024 + 7] = math.nan, math.inf
    a[12 * PROG + 55 * 1024 + 1023], b[12 * PROG + 55 * 1024 + 1023] = math.inf, math.inf
    a[15 * PROG + 1], b[15 * PROG + 1] = math.nan, math.nan
    return a.view(WIDE), b.view(WIDE)


def edge_fp32_nan() -> tuple[torch.Tensor, torch.Tensor]:
    a, b = _drift(math.prod(WIDE), 15, torch.float32)
    at = _spots(a.numel(), 64, 3)
    a[at[:16]], b[at[:16]] = math.nan, math.nan
    a[at[16:32]], b[at[16:32]] = math.inf, math.inf
    b[at[32:48]] = math.nan
    a[at[48:]], b[at[48:]] = -math.inf, math.inf
    return a.view(WIDE), b.view(WIDE)


def edge_fp32_large() -> tuple[torch.Tensor, torch.Tensor]:
    """Squares past float32's range: in a few lanes of one program, and in many lanes of another."""
    a, b = _drift(math.prod(WIDE), 16, torch.float32)
    a[2 * PROG + 5 * 1024 + 17], b[2 * PROG + 9 * 1024 + 400] = 3e20, -2e21
    a[20 * PROG : 20 * PROG + 64] *= 1e21
    a[30 * PROG + 7] = math.nan  # and a NaN in another row
    return a.view(WIDE), b.view(WIDE)


def edge_fp64_side_nan() -> tuple[torch.Tensor, torch.Tensor]:
    a, b = _drift(math.prod(WIDE), 17)
    a = a.double() * (1 + 1e-9)
    at = _spots(a.numel(), 64, 4)
    a[at[:16]] = math.nan
    b[at[16:32]] = math.inf
    a[at[32:48]], b[at[32:48]] = math.nan, math.nan
    a[at[48:]], b[at[48:]] = -math.inf, -math.inf
    return a.view(WIDE), b.view(WIDE)


def edge_fp64_huge() -> tuple[torch.Tensor, torch.Tensor]:
    """float64 squares past float64's range in a few lanes: sums of inf, as the reference gives."""
    a, b = _drift(1 << 22 if DEVICE == "cuda" else 1 << 15, 18, torch.float64)
    at = [5, 7_000, a.numel() - 9]
    a[at] *= 1e160
    b[at] *= 1e160
    return a, b


def edge_fp8_nan() -> tuple[torch.Tensor, torch.Tensor]:
    a, b = _drift(math.prod(WIDE), 19, torch.float32, noise=5e-2)
    at = _spots(a.numel(), 48, 5)
    a[at[:16]], b[at[:16]] = math.nan, math.nan
    b[at[16:32]] = math.nan
    a[at[32:]] = math.nan
    return a.to(torch.float8_e4m3fn).view(WIDE), b.to(torch.float8_e4m3fn).view(WIDE)


def edge_all_nan() -> tuple[torch.Tensor, torch.Tensor]:
    a = torch.full((1 << 21 if DEVICE == "cuda" else 1 << 12,), math.nan, device=DEVICE, dtype=torch.bfloat16)
    return a, a.clone()


def _unaligned() -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    a, b = _drift(4_000_003 if DEVICE == "cuda" else 40_003, 20)
    n = a.numel()
    at = sorted({0, n, *(n * i // 97 for i in range(1, 97))})
    for k, e in enumerate(at[1:-1:7]):  # NaN/Inf next to block edges and at the pair's end
        a[e - 1], b[e] = math.nan, math.inf if k % 2 else -math.inf
    a[n - 1], b[n - 2], a[n - 3], b[n - 3] = math.nan, math.nan, math.inf, math.inf
    a[_spots(n, 16, 6)] = math.nan
    return a, b, at


EDGES: dict[str, Callable[[], tuple[torch.Tensor, torch.Tensor]]] = {
    "NaN in b only": edge_nan_b_only,
    "+Inf vs -Inf": edge_inf_signs,
    "all-NaN rows": edge_nan_rows,
    "lanes 8/9/3 tiles": edge_columns,
    "fp32 NaN/Inf": edge_fp32_nan,
    "fp32 squares past range": edge_fp32_large,
    "fp64 side NaN/Inf": edge_fp64_side_nan,
    "fp64 squares past range": edge_fp64_huge,
    "fp8 e4m3 NaN": edge_fp8_nan,
    "all NaN": edge_all_nan,
}


def pairs(with_big: bool) -> list[tuple[str, Callable[[], tuple[torch.Tensor, torch.Tensor, list[int], Any, int]]]]:
    """(name, build): build gives a, b, edges, b as given to the backend (the device's, or the host's for pieces),
    and chunk_elems."""
    out: list[tuple[str, Callable[[], Any]]] = []
    sizes = [("8192x7168", WIDE)] + ([("1 GiB", (BIG,))] if with_big else [])
    for label, shape in sizes:
        for cls in CLASSES:

            def build(cls: str = cls, shape: tuple[int, ...] = shape) -> Any:
                a, b = CLASSES[cls](math.prod(shape), DEVICE)
                a, b = a.view(shape), b.view(shape)
                return a, b, list(floors._edges(shape)), b, CHUNK

            out.append((f"{label} {cls}", build))
    for name, make in EDGES.items():

        def build_edge(make: Callable[[], Any] = make) -> Any:
            a, b = make()
            return a, b, list(floors._edges(tuple(a.shape))), b, CHUNK

        out.append((name, build_edge))

    def unaligned() -> Any:
        a, b, at = _unaligned()
        return a, b, at, b, CHUNK

    def pieces() -> Any:
        a, b, at = _unaligned()
        return a, b, at, b.cpu(), 999_999  # b copied over in pieces, each piece a launch

    out += [("97 uneven blocks, unaligned", unaligned), ("97 uneven blocks, b in pieces", pieces)]
    return out


# ------------------------------------------------------------------ checks


def reference(a: torch.Tensor, b: torch.Tensor, edges: list[int], workers: int = 12) -> Totals:
    """``reference_totals`` of the pair, in spans (cut at every edge) on threads, added up."""
    x, y = a.reshape(-1).cpu(), b.reshape(-1).cpu()
    n = x.numel()
    step = max(1 << 19, -(-n // (4 * workers)))
    cuts = sorted(set(edges) | set(range(0, n, step)) | {n})
    spans = [(lo, hi) for lo, hi in zip(cuts, cuts[1:]) if hi > lo]
    with ThreadPoolExecutor(workers) as ex:
        parts = list(ex.map(lambda s: reference_totals(x[s[0] : s[1]], y[s[0] : s[1]], ATOL, RTOL, 1 << 19), spans))
    nb = len(edges) - 1
    d2, a2 = [0.0] * nb, [0.0] * nb
    for (lo, _), t in zip(spans, parts):
        j = bisect.bisect_right(edges, lo) - 1
        d2[j] += t.sums[2]
        a2[j] += t.sums[0]
    ulps = [t.max_ulp for t in parts]
    return Totals(
        n,
        tuple(sum(t.sums[i] for t in parts) for i in range(5)),  # type: ignore[arg-type]
        max(t.max_abs for t in parts),
        tuple(sum(t.counts[i] for t in parts) for i in range(5)),  # type: ignore[arg-type]
        None if ulps[0] is None else max(ulps),  # type: ignore[type-var]
        tuple(d2),
        tuple(a2),
        tuple(sum(t.nonfinite[i] for t in parts) for i in range(3)),  # type: ignore[arg-type]
    )


def _close(x: float, y: float, rel: float) -> bool:
    if math.isnan(x) or math.isnan(y):
        return math.isnan(x) and math.isnan(y)
    return x == y or math.isclose(x, y, rel_tol=rel, abs_tol=1e-300)


def exact_fields(t: Totals) -> tuple[Any, ...]:
    return t.numel, t.counts, t.max_abs, t.max_ulp, t.nonfinite, len(t.block_d2)


def against_base(t: Totals, base: Totals) -> str | None:
    if exact_fields(t) != exact_fields(base):
        return f"exact fields {exact_fields(t)} != base {exact_fields(base)}"
    for name, xs, ys in (("sums", t.sums, base.sums), ("block_d2", t.block_d2, base.block_d2), ("block_a2", t.block_a2, base.block_a2)):
        bad = [(i, x, y) for i, (x, y) in enumerate(zip(xs, ys)) if not _close(x, y, 1e-6)]
        if bad:
            return f"{name} differ from base at {bad[:3]}"
    return None


def against_reference(t: Totals, ref: Totals, a: torch.Tensor, b: torch.Tensor) -> str | None:
    from tests.validator.numerics.test_metrics import _assert_matches

    try:
        want = dataclasses.asdict(metrics_from_totals(ref, a.dtype, b.dtype, ATOL, RTOL))  # (not to_dict: "nan")
        _assert_matches(metrics_from_totals(t, a.dtype, b.dtype, ATOL, RTOL), want)
    except AssertionError as exc:
        return f"metrics: {exc}"
    if (t.counts, t.max_abs, t.max_ulp, t.nonfinite) != (ref.counts, ref.max_abs, ref.max_ulp, ref.nonfinite):
        return f"counts/max/ulp/nonfinite {(t.counts, t.max_abs, t.max_ulp, t.nonfinite)} != {(ref.counts, ref.max_abs, ref.max_ulp, ref.nonfinite)}"
    rel = 1e-12 if torch.float64 in (a.dtype, b.dtype) else 1e-6
    for name, xs, ys in (("block_d2", t.block_d2, ref.block_d2), ("block_a2", t.block_a2, ref.block_a2)):
        bad = [(i, x, y) for i, (x, y) in enumerate(zip(xs, ys)) if not _close(x, y, rel)]
        if bad:
            return f"{name} differ from the reference at {bad[:3]}"
    return None


def check(
    modules: dict[str, Any], with_big: bool, log: Callable[[str], None], until: float, only: list[str]
) -> list[dict[str, Any]]:
    """The checks of every pair (the 1 GiB ones last; those named in ``only``), as long as time.time() < until."""
    rows = []
    for name, build in sorted(pairs(with_big), key=lambda p: p[0].startswith("1 GiB")):
        if only and not any(s in name for s in only):
            continue
        if time.time() > until:
            log(f"check {name}: skipped (out of time)")
            rows.append({"pair": name, "variant": "*", "skipped": True})
            continue
        t0 = time.perf_counter()
        try:
            a, b, edges, b_given, chunk = build()
            got: dict[str, Totals] = {}
            for v, m in modules.items():
                got[v] = m.cuda_totals(a, b_given, atol=ATOL, rtol=RTOL, chunk_elems=chunk, edges=edges)
                again = m.cuda_totals(a, b_given, atol=ATOL, rtol=RTOL, chunk_elems=chunk, edges=edges)
                if str(again) != str(got[v]):  # (str: NaN sums compare equal)
                    rows.append({"pair": name, "variant": v, "error": "a second call gave other bits"})
            ref = reference(a, b, edges)
            for v, t in got.items():
                row = {
                    "pair": name,
                    "variant": v,
                    "bitwise_base": str(t) == str(got["base"]),  # (str: NaN sums compare equal)
                    "vs_base": against_base(t, got["base"]),
                    "vs_reference": against_reference(t, ref, a, b),
                }
                rows.append(row)
            summary = " ".join(
                f"{r['variant']}:{'=' if r['bitwise_base'] else '~'}{'ok' if not (r['vs_base'] or r['vs_reference']) else 'FAIL'}"
                for r in rows[-len(got) :]
            )
            log(f"check {name:<32} {summary}  counts {ref.counts} nonfinite {ref.nonfinite} ({time.perf_counter() - t0:.1f} s)")
            for r in rows[-len(got) :]:
                if r["vs_base"] or r["vs_reference"]:
                    log(f"   {r['variant']}: base: {r['vs_base']}; reference: {r['vs_reference']}")
            del a, b, b_given
            if DEVICE == "cuda":
                torch.cuda.empty_cache()
        except Exception:
            log(f"check {name}: ERROR\n{traceback.format_exc()}")
            rows.append({"pair": name, "variant": "*", "error": traceback.format_exc()})
    return rows


# ------------------------------------------------------------------ timing


def timing(modules: dict[str, Any], rounds: int, calls: int, log: Callable[[str], None]) -> list[dict[str, Any]]:
    out = []
    for label, shape in (("8192x7168", WIDE), ("1 GiB", (BIG,))):
        for cls in CLASSES:
            a, b = CLASSES[cls](math.prod(shape), DEVICE)
            a, b = a.view(shape), b.view(shape)
            nbytes = a.numel() * (a.element_size() + b.element_size())
            fns = {v: on_backend(m, lambda a=a, b=b: floors.measure_blocks(a, b)) for v, m in modules.items()}
            for fn in fns.values():
                fn()
                fn()
            times: dict[str, list[float]] = {v: [] for v in fns}
            order = list(fns)
            for r in range(rounds):
                for v in order if r % 2 == 0 else order[::-1]:
                    fn = fns[v]
                    for _ in range(calls):
                        t = time.perf_counter()
                        fn()
                        times[v].append(time.perf_counter() - t)
            cells = []
            for v, ts in times.items():
                med = statistics.median(ts)
                out.append({"pair": f"{label} {cls}", "variant": v, "us": med * 1e6, "gbps": nbytes / med / 1e9,
                            "min_us": min(ts) * 1e6, "n": len(ts)})  # fmt: skip
                cells.append(f"{v} {nbytes / med / 1e9:,.0f} ({med * 1e6:.0f})")
            log(f"time {label} {cls:<13} " + " | ".join(cells))
            del a, b, fns
            if DEVICE == "cuda":
                torch.cuda.empty_cache()
    return out


def table(rows: list[dict[str, Any]], variants: list[str]) -> str:
    pairs_ = list(dict.fromkeys(r["pair"] for r in rows))
    by = {(r["pair"], r["variant"]): r for r in rows}
    lines = ["| pair | " + " | ".join(variants) + " |", "| --- " * (len(variants) + 1) + "|"]
    for p in pairs_:
        cells = [f"{by[(p, v)]['gbps']:,.0f} ({by[(p, v)]['us']:.0f})" if (p, v) in by else "" for v in variants]
        lines.append(f"| {p} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ------------------------------------------------------------------ warm-up


def warm(name: str) -> None:
    """Every kind of launch used here, on small pairs, so that Triton's on-disk cache holds the binaries."""
    m = module(name)
    kinds = [
        (torch.bfloat16, torch.bfloat16, 1 << 16), (torch.bfloat16, torch.bfloat16, (1 << 16) + 3),
        (torch.float32, torch.bfloat16, 1 << 16), (torch.float64, torch.bfloat16, 1 << 16),
        (torch.float32, torch.float32, 1 << 16), (torch.float8_e4m3fn, torch.float8_e4m3fn, 1 << 16),
        (torch.float64, torch.float64, 1 << 16),
    ]  # fmt: skip
    for da, db, n in kinds:
        a, b = _drift(n, 0, torch.float32)
        m.cuda_totals(a.to(da), b.to(db), atol=ATOL, rtol=RTOL, chunk_elems=CHUNK, edges=[0, n])
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--warm", help="fill Triton's cache for this variant (NAME=PATH), then exit")
    p.add_argument("--out", type=Path, default=Path("cuda_variants_out"))
    p.add_argument("--variants", help="NAME=PATH,... (one named base)")
    p.add_argument("--no-big", action="store_true", help="leave the 1 GiB pairs out of the check")
    p.add_argument("--no-check", action="store_true")
    p.add_argument("--only", help="check only the pairs whose names hold one of these (comma-separated)")
    p.add_argument("--no-time", action="store_true")
    p.add_argument("--rounds", type=int, default=16)
    p.add_argument("--calls", type=int, default=4)
    p.add_argument("--tests-done", type=Path, help="time only once this file exists (or --wait-max has passed)")
    p.add_argument("--wait-max", type=float, default=300.0, help="seconds since the start")
    p.add_argument("--wait-before-check", action="store_true", help="check only once --tests-done exists (GPU memory)")
    p.add_argument("--check-until", type=float, default=330.0, help="seconds since the start: no check begins later")
    p.add_argument("--smoke", action="store_true", help="TRITON_INTERPRET=1 on the CPU, small pairs: this script's check")
    args = p.parse_args()
    if args.smoke:
        global DEVICE, WIDE, BIG
        DEVICE, WIDE, BIG = "cpu", (256, 7168), 1 << 16
    if args.warm:
        warm(parse_variants(args.warm, base=False)[0])
        return
    if not args.variants:
        p.error("--variants is required")
    start = time.time()
    args.out.mkdir(parents=True, exist_ok=True)
    logf = open(args.out / "ab.log", "a")

    def log(msg: str) -> None:
        line = f"[{time.time() - start:6.1f}s] {msg}"
        print(line, flush=True)
        logf.write(line + "\n")
        logf.flush()

    variants = parse_variants(args.variants)
    import triton

    gpu = torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu (Triton's interpreter)"
    log(f"{gpu}, torch {torch.__version__}, triton {triton.__version__}, variants {variants}")
    if DEVICE == "cuda":
        procs = [subprocess.Popen([sys.executable, __file__, "--warm", f"{v}={PATHS[v]}"], env=os.environ) for v in variants]
        codes = [pr.wait() for pr in procs]
        log(f"warm-up done: exit codes {dict(zip(variants, codes))}")
    modules = {v: module(v) for v in variants}
    result: dict[str, Any] = {"device": gpu, "torch": torch.__version__, "triton": triton.__version__}
    if args.tests_done and args.wait_before_check:
        while not args.tests_done.exists() and time.time() - start < args.wait_max:
            time.sleep(1)
        log(f"tests done before the check: {args.tests_done.exists()}")
    if not args.no_check:
        result["check"] = check(modules, not args.no_big, log, start + args.check_until, args.only.split(",") if args.only else [])
        bad = [r for r in result["check"] if r.get("error") or r.get("vs_base") or r.get("vs_reference")]
        log(f"check: {len(result['check'])} rows, {len(bad)} failing")
        for v in variants:
            mine = [r for r in result["check"] if r["variant"] == v and "bitwise_base" in r]
            log(
                f"  {v:<12} bitwise equal to base on {sum(bool(r.get('bitwise_base')) for r in mine)}/{len(mine)} pairs; "
                f"failing {[r['pair'] for r in mine if r.get('error') or r.get('vs_base') or r.get('vs_reference')]}"
            )
        (args.out / "results.json").write_text(json.dumps(result, indent=1))
    if not args.no_time:
        if args.tests_done:
            while not args.tests_done.exists() and time.time() - start < args.wait_max:
                time.sleep(1)
            log(f"tests done: {args.tests_done.exists()}")
        result["time"] = timing(modules, args.rounds, args.calls, log)
        md = table(result["time"], variants)
        log("GB/s (median µs per call), floors.measure_blocks, interleaved\n" + md)
        (args.out / "results.json").write_text(json.dumps(result, indent=1))
    log("end")


if __name__ == "__main__":
    main()
