"""The comparison engine against plain alternatives, side by side in one run: GB/s per call.

    python benchmarks/engine_bench.py                 # CPU section here, GPU section too on a CUDA machine
    python benchmarks/engine_bench.py --sections gpu --json out.json

For each bf16 pair (GPU: 8192x7168 and ``--gib`` GiB per tensor; CPU: ``--cpu-elems`` elements per
tensor, 16 Mi and 64 Mi by default), the median time of one call, as a caller sees it (result on the
host), of:

- ``engine``: ``validator.numerics.metrics.compare_tensors(a, b)``, every field, the p99 ULP exact;
- ``engine, 64 row blocks``: ``validator.numerics.floors.measure_blocks(a, b)``, the same and the row blocks'
  sums in the same pass: what a comparison runs for each pair;
- ``engine, p99=False``: ``validator.numerics.backends.compare(..., p99=False)``, every field but the p99;
- ``torch float64``: norms, dot, max |d|, mean |d| and the tolerance count in plain float64 torch;
- ``torch.compile``: the same function compiled by ``torch.compile`` (one fused pass where it can);
- ``SGLang rel_diff``: SGLang 0.5.9's comparator math, ``1 - 2<a,b>/(|a|^2+|b|^2)`` in float64 torch.

GB/s counts the bytes of both tensors. The pair is ``b = bf16(a * (1 + 1e-3 N(0,1)))``.
The CPU section also times the engine's first call in a fresh process (``first call``: numba loads
its compiled pass from its cache) and, with an empty numba cache, the compile (``first call, cold``).
``--sweep`` also times the GPU kernel's tile constants (``validator.numerics.backends.cuda``) on both GPU pairs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from validator.numerics import backends as kernels  # noqa: E402
from validator.numerics.floors import measure_blocks  # noqa: E402
from validator.numerics.metrics import compare_tensors  # noqa: E402


def torch_f64(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    x, y = a.double(), b.double()
    d = y - x
    ad = d.abs()
    return torch.stack(
        [(x * x).sum(), (y * y).sum(), (x * y).sum(), ad.max(), ad.mean(), (ad <= 1e-5 + 1e-3 * x.abs()).sum()]
    )


def sglang_rel_diff(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    x, y = a.double(), b.double()
    return 1 - 2 * (x * y).sum() / ((x * x).sum() + (y * y).sum())


def make_pair(n: int, device: str, seed: int = 0, noise: float = 1e-3) -> tuple[torch.Tensor, torch.Tensor]:
    """A bf16 pair of n normal values, b = a * (1 + noise * normal) (1e-3: ULP distances 0-2)."""
    g = torch.Generator(device=device).manual_seed(seed)
    a = torch.randn(n, generator=g, device=device)
    b = (a * (1 + noise * torch.randn(n, generator=g, device=device))).to(torch.bfloat16)
    return a.to(torch.bfloat16), b


def timed(fn: Callable[[], object], reps: int, device: str) -> float:
    """Median seconds per call; each call ends with its result on the host."""

    def call() -> None:
        out = fn()
        if isinstance(out, torch.Tensor):
            out.cpu()
        elif device == "cuda":
            torch.cuda.synchronize()

    call()
    call()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        call()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def section(device: str, shapes: list[tuple[str, tuple[int, ...]]], reps: int, compiled: bool) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    fused = torch.compile(torch_f64) if compiled else None
    for label, shape in shapes:
        n = 1
        for s in shape:
            n *= s
        a, b = make_pair(n, device)
        a, b = a.view(shape), b.view(shape)
        nbytes = 2 * n * a.element_size()
        m = compare_tensors(a, b)
        impls: list[tuple[str, Callable[[], object], int]] = [
            ("engine", lambda: compare_tensors(a, b), reps),
            ("engine, 64 row blocks", lambda: measure_blocks(a, b), reps),
            ("engine, p99=False", lambda: kernels.compare(a, b, atol=1e-5, rtol=1e-3, chunk_elems=1 << 22, p99=False), reps),
            ("torch float64", lambda: torch_f64(a, b), max(3, reps // 4)),
            ("SGLang rel_diff", lambda: sglang_rel_diff(a, b), max(3, reps // 4)),
        ]
        if fused is not None:
            impls.insert(3, ("torch.compile", lambda: fused(a, b), max(3, reps // 4)))
        for name, fn, r in impls:
            try:
                sec = timed(fn, r, device)
            except Exception as exc:  # torch.compile needs a working toolchain; say so and go on
                print(f"  {label:>22} {name:<20} failed: {type(exc).__name__}: {str(exc)[:120]}")
                continue
            row = {"device": device, "pair": label, "impl": name, "ms": sec * 1e3, "gbps": nbytes / sec / 1e9}
            rows.append(row)
            print(f"  {label:>22} {name:<20} {sec * 1e3:10.3f} ms  {row['gbps']:9.1f} GB/s", flush=True)
        print(f"  {label:>22} result: rel_l2 {m.rel_l2:.6g}  max_ulp {m.max_ulp}  p99_ulp {m.p99_ulp}", flush=True)
    return rows


_FIRST_CALL = """
import sys, time
sys.path.insert(0, {root!r})
import torch
from benchmarks.engine_bench import make_pair
a, b = make_pair({n}, "cpu")
t = time.perf_counter()
from validator.numerics.metrics import compare_tensors
compare_tensors(a, b)
print(time.perf_counter() - t)
"""


def first_call(n: int, cold: bool) -> float:
    """Seconds of the first compare_tensors in a fresh process, import of the engine included; cold:
    with an empty numba cache (NUMBA_CACHE_DIR, read by numba alone), so the pass is compiled."""
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, **({"NUMBA_CACHE_DIR": cache} if cold else {})}
        code = _FIRST_CALL.format(root=str(ROOT), n=n)
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return float(out.stdout.split()[-1])


def first_calls(elems: list[int]) -> list[dict[str, Any]]:
    rows = []
    first_call(1 << 10, cold=False)  # the cache filled
    for n in elems:
        for name, cold in (("first call", False), ("first call, cold", True)):
            sec = first_call(n, cold)
            rows.append({"device": "cpu", "pair": f"{n} elements", "impl": name, "ms": sec * 1e3, "gbps": 4 * n / sec / 1e9})
            print(f"  {n:>13} elements {name:<20} {sec * 1e3:10.1f} ms  {rows[-1]['gbps']:9.2f} GB/s", flush=True)
    return rows


def sweep(shapes: list[tuple[str, tuple[int, ...]]], reps: int) -> list[dict[str, Any]]:
    from validator.numerics.backends import cuda

    names = ("BLOCK", "PROGRAMS", "NUM_WARPS", "STAGES", "FLUSH")
    saved = tuple(getattr(cuda, k) for k in names)
    rows = []
    configs = [(1024, 2048, 4, 3, 64), (1024, 1024, 4, 3, 64), (1024, 4096, 4, 3, 64), (1024, 2048, 4, 3, 32), (1024, 2048, 4, 4, 64)]
    try:
        for label, shape in shapes:
            n = 1
            for s in shape:
                n *= s
            a, b = make_pair(n, "cuda")
            for config in configs:
                for k, v in zip(names, config):
                    setattr(cuda, k, v)
                cuda._plan.cache_clear()  # the programs per pair follow BLOCK and PROGRAMS
                cuda._constants.cache_clear()  # and the kernels' compile-time arguments the rest
                for p99 in (True, False):
                    sec = timed(lambda: kernels.compare(a, b, atol=1e-5, rtol=1e-3, chunk_elems=1 << 22, p99=p99), reps, "cuda")
                    row = {"pair": label, **dict(zip(names, config)), "p99": p99, "gbps": 2 * n * 2 / sec / 1e9}
                    rows.append(row)
                    print(f"  sweep {label:>22} {dict(zip(names, config))} p99={p99}: {row['gbps']:8.1f} GB/s", flush=True)
    finally:
        for k, v in zip(names, saved):
            setattr(cuda, k, v)
        cuda._plan.cache_clear()
        cuda._constants.cache_clear()
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sections", default="cpu,gpu", help="comma-separated: cpu, gpu")
    p.add_argument("--gib", type=float, default=1.0, help="GiB per tensor of the large GPU pair")
    p.add_argument("--cpu-elems", default=f"{1 << 24},{1 << 26}", help="elements per tensor of the CPU pairs (comma-separated)")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--no-compile", action="store_true", help="leave torch.compile out")
    p.add_argument("--sweep", action="store_true")
    p.add_argument("--threads", type=int, help="torch and numba CPU threads (default: theirs)")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    sections = args.sections.split(",")
    if args.threads:
        import numba

        torch.set_num_threads(args.threads)
        numba.set_num_threads(args.threads)
    out: dict[str, Any] = {
        "torch": torch.__version__,
        "machine": platform.processor() or platform.machine(),
        "cpu_threads": torch.get_num_threads(),
        "engine": kernels.info(),
        "rows": [],
    }
    if "gpu" in sections and torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name()
        print(f"== GPU: {out['gpu']}, torch {torch.__version__}, triton {out['engine']['triton']}", flush=True)
        big = int(args.gib * (1 << 29))
        shapes = [("8192x7168", (8192, 7168)), (f"{args.gib:g} GiB per tensor", (big,))]
        out["rows"] += section("cuda", shapes, args.reps, not args.no_compile)
        if args.sweep:
            out["sweep"] = sweep(shapes, args.reps)
    if "cpu" in sections:
        import numba

        out["numba"] = numba.__version__
        print(f"== CPU: {out['machine']}, {out['cpu_threads']} torch threads, numba {numba.__version__} "
              f"({out['engine']['cpu_threads']} threads), torch {torch.__version__}", flush=True)
        elems = [int(e) for e in args.cpu_elems.split(",")]
        shapes = [(f"{n} elements", (n,)) for n in elems]
        out["rows"] += section("cpu", shapes, max(3, args.reps // 4), not args.no_compile)
        out["rows"] += first_calls(elems)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
