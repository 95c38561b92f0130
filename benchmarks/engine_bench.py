"""The comparison engine against plain alternatives, on every class of pair, side by side in one run.

    python benchmarks/engine_bench.py                 # CPU section here, GPU section too on a CUDA machine
    python benchmarks/engine_bench.py --sections gpu --json out.json
    python benchmarks/engine_bench.py --sections gpu --other-cuda /tmp/old_cuda.py   # and another cuda.py beside it

Pair classes (``CLASSES``; a = reference, b = candidate, the sizes below per tensor):

- ``near 1e-3``: bf16, b = bf16(a * (1 + 1e-3 N(0,1))): ULP distances 0-2, a port that rounds alike;
- ``drift 1e-2``, ``drift 5e-2``: bf16, relative noise 1e-2 and 5e-2: pairs that drift like a real port's;
- ``nonfinite``: ``drift 1e-2`` with 16 NaN and 16 +Inf at the same positions on both sides and 16 NaN in
  b only, scattered;
- ``masked``: ``drift 1e-2`` with -inf at the same 30% of the positions on both sides, in every row: logits
  under a mask (a vocabulary or grammar mask, top-k), where NaN/Inf are not rare but everywhere;
- ``bf16 vs fp32``: a float32, b = bf16(a * (1 + 2e-2 N)): the dtypes and drift (rel_l2 ~2e-2) of the
  transformers engine's bf16 capture against its float32 one;
- ``projection``: the projection probe's own capture (``probes.workloads.projection.run_probe`` at hidden 7168, 6
  capture layers, PP8): ``pre_norm`` of ``partial-bf16`` (bf16) against ``ref`` (float64), its rows repeated
  up to the size (rel_l2 3e-3).

For each class and size (GPU: 8192x7168 and ``--gib`` GiB per tensor; CPU: ``--cpu-elems`` elements per
tensor), the median time of one call, as a caller sees it (result on the host), of:

- ``engine``: ``validator.numerics.floors.measure_blocks(a, b)``: every metric and the row blocks' sums, in
  one read: what a comparison runs for each pair;
- ``engine, p99``: ``compare_tensors(a, b, p99=True)``: with the exact p99 ULP, which is opt-in (near and drift only);
- GPU, with ``--other-cuda PATH``: ``engine, other``: the same call on another version of
  ``validator/numerics/backends/cuda.py`` (``git show REV:validator/numerics/backends/cuda.py > PATH``), timed
  right after ``engine``;
- GPU: ``torch.compile f32``: norms, dot, max |d|, mean |d| and the tolerance count in float32, compiled by
  ``torch.compile`` (one fused pass); ``device copy``: both tensors copied on the device (the memory's pace);
- CPU: ``numpy float64``, ``numpy float32``: the same quantities in plain NumPy (float64 and float32).

GB/s counts the bytes of both tensors as stored.
The CPU section also times the engine's first call in a fresh process (``first call``: numba loads
its compiled pass from its cache) and, with an empty numba cache, the compile (``first call, cold``).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
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

import numpy as np  # noqa: E402
import torch  # noqa: E402

from validator.numerics import backends as kernels  # noqa: E402
from validator.numerics.floors import measure_blocks  # noqa: E402
from validator.numerics.metrics import compare_tensors  # noqa: E402


def torch_f32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    x, y = a.float(), b.float()
    d = y - x
    ad = d.abs()
    return torch.stack(
        [(x * x).sum(), (y * y).sum(), (x * y).sum(), ad.max(), ad.mean(), (ad <= 1e-5 + 1e-3 * x.abs()).sum().float()]
    )


def numpy_pass(a: np.ndarray, b: np.ndarray, dtype: type) -> list[float]:
    """The same quantities in plain NumPy, in ``dtype`` (pieces of 4 Mi elements, as a careful script would)."""
    out = np.zeros(6)
    for lo in range(0, a.size, 1 << 22):
        x, y = a[lo : lo + (1 << 22)].astype(dtype), b[lo : lo + (1 << 22)].astype(dtype)
        d = y - x
        ad = np.abs(d)
        out += [x @ x, y @ y, x @ y, 0.0, ad.sum(), np.count_nonzero(ad <= 1e-5 + 1e-3 * np.abs(x))]
        out[3] = max(out[3], ad.max())
    return out.tolist()


def _noisy(
    n: int, device: str, noise: float, seed: int = 0, dtype: torch.dtype = torch.bfloat16
) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator(device=device).manual_seed(seed)
    a = torch.randn(n, generator=g, device=device)
    b = (a * (1 + noise * torch.randn(n, generator=g, device=device))).to(torch.bfloat16)
    return a.to(dtype), b


def engine_info() -> dict[str, Any]:
    """What the engine has here: numba's threads, CUDA, and Triton's version where the GPU backend imports."""
    from validator.numerics.backends.cpu import threads

    try:
        import triton
    except ImportError:
        triton = None
    return {"cpu_threads": threads(), "cuda": torch.cuda.is_available(), "triton": getattr(triton, "__version__", None)}


def make_pair(n: int, device: str, seed: int = 0, noise: float = 1e-3) -> tuple[torch.Tensor, torch.Tensor]:
    """A bf16 pair of n normal values, b = a * (1 + noise * normal) (1e-3: ULP distances 0-2)."""
    return _noisy(n, device, noise, seed)


def _nonfinite(n: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    a, b = _noisy(n, device, 1e-2)
    at = torch.randperm(n, generator=torch.Generator().manual_seed(1))[:48].to(device)
    a[at[:16]], b[at[:16]] = float("nan"), float("nan")
    a[at[16:32]], b[at[16:32]] = float("inf"), float("inf")
    b[at[32:]] = float("nan")
    return a, b


def _masked(n: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    a, b = _noisy(n, device, 1e-2)
    at = torch.rand(n, generator=torch.Generator(device=device).manual_seed(2), device=device) < 0.3
    a[at], b[at] = float("-inf"), float("-inf")
    return a, b


@functools.cache
def projection_capture(device: str, tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``pre_norm`` of the probe's ref (float64) and partial-bf16 paths at hidden 7168."""
    from probes.workloads.projection import run_probe
    from probes.workloads.projection_config import ProjectionConfig

    run = run_probe(ProjectionConfig(tokens=tokens), device=device, paths=["partial-bf16", "ref"], write_stages=False)
    return run.paths["ref"].pre_norm, run.paths["partial-bf16"].pre_norm


def _projection(n: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    ref, cand = projection_capture(device, 8192 if device == "cuda" else 64)
    reps = -(-n // ref.numel())
    return ref.reshape(-1).repeat(reps)[:n], cand.reshape(-1).repeat(reps)[:n]


CLASSES: dict[str, Callable[[int, str], tuple[torch.Tensor, torch.Tensor]]] = {
    "near 1e-3": lambda n, dev: _noisy(n, dev, 1e-3),
    "drift 1e-2": lambda n, dev: _noisy(n, dev, 1e-2),
    "drift 5e-2": lambda n, dev: _noisy(n, dev, 5e-2),
    "nonfinite": _nonfinite,
    "masked": _masked,
    "bf16 vs fp32": lambda n, dev: _noisy(n, dev, 2e-2, dtype=torch.float32),
    "projection": _projection,
}


def call_times(fn: Callable[[], object], reps: int, device: str) -> list[float]:
    """Seconds of each of ``reps`` calls after two warm-up calls; each call ends with its result on the host: a
    tensor is read back, device tensors are waited for, and the engine's metrics are on the host when it returns
    (a device-wide synchronize after them would time work a comparison does not do)."""

    def call() -> None:
        out = fn()
        if isinstance(out, torch.Tensor):
            out.cpu()
        elif device == "cuda" and isinstance(out, (tuple, list)) and any(isinstance(x, torch.Tensor) for x in out):
            torch.cuda.synchronize()

    call()
    call()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        call()
        times.append(time.perf_counter() - t)
    return times


def timed(fn: Callable[[], object], reps: int, device: str) -> float:
    """Median seconds per call (:func:`call_times`)."""
    return statistics.median(call_times(fn, reps, device))


def on_backend(module: Any, fn: Callable[[], object]) -> Callable[[], object]:
    """``fn`` with ``module`` as the engine's CUDA backend (another version of cuda.py)."""

    def call() -> object:
        saved, kernels._cuda = kernels._cuda, lambda: module  # type: ignore[assignment]
        try:
            return fn()
        finally:
            kernels._cuda = saved  # type: ignore[method-assign]

    return call


def section(
    device: str,
    shapes: list[tuple[str, tuple[int, ...]]],
    reps: int,
    classes: list[str],
    compiled: bool,
    other: Any = None,
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    fused = torch.compile(torch_f32) if compiled and device == "cuda" else None
    for label, shape in shapes:
        n = math.prod(shape)
        for cls in classes:
            pair = CLASSES[cls](n, device)
            a, b = pair[0].view(shape), pair[1].view(shape)
            nbytes = n * (a.element_size() + b.element_size())
            m = compare_tensors(a, b, p99=True)
            impls: list[tuple[str, Callable[[], object], int]] = [("engine", lambda: measure_blocks(a, b), reps)]
            if other is not None and device == "cuda":
                impls.append(("engine, other", on_backend(other, lambda: measure_blocks(a, b)), reps))
            if cls.startswith(("near", "drift")):
                impls.append(("engine, p99", lambda: compare_tensors(a, b, p99=True), max(3, reps // 4)))
            if device == "cuda":
                ca, cb = torch.empty_like(a), torch.empty_like(b)
                impls.append(("device copy", lambda: (ca.copy_(a), cb.copy_(b)), reps))
                if fused is not None:
                    impls.append(("torch.compile f32", lambda: fused(a, b), reps))
            else:
                na, nb = (
                    t.reshape(-1).float().numpy() if t.dtype == torch.bfloat16 else t.reshape(-1).numpy()
                    for t in (a, b)
                )
                impls.append(("numpy float64", lambda: numpy_pass(na, nb, np.float64), max(3, reps // 4)))
                impls.append(("numpy float32", lambda: numpy_pass(na, nb, np.float32), max(3, reps // 4)))
            for name, fn, r in impls:
                try:
                    sec = timed(fn, r, device)
                except Exception as exc:  # torch.compile needs a working toolchain; say so and go on
                    print(f"  {label:>20} {cls:<13} {name:<18} failed: {type(exc).__name__}: {str(exc)[:120]}")
                    continue
                row = {
                    "device": device,
                    "pair": label,
                    "class": cls,
                    "impl": name,
                    "ms": sec * 1e3,
                    "gbps": nbytes / sec / 1e9,
                }
                rows.append(row)
                print(f"  {label:>20} {cls:<13} {name:<18} {sec * 1e3:10.3f} ms  {row['gbps']:9.1f} GB/s", flush=True)
            print(
                f"  {label:>20} {cls:<13} rel_l2 {m.rel_l2:.3g}  max_ulp {m.max_ulp}  p99_ulp {m.p99_ulp}  "
                f"non-finite {m.nonfinite_a}/{m.nonfinite_b}",
                flush=True,
            )
            del pair
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
            rows.append(
                {"device": "cpu", "pair": f"{n} elements", "impl": name, "ms": sec * 1e3, "gbps": 4 * n / sec / 1e9}
            )
            print(f"  {n:>13} elements {name:<20} {sec * 1e3:10.1f} ms  {rows[-1]['gbps']:9.2f} GB/s", flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sections", default="cpu,gpu", help="comma-separated: cpu, gpu")
    p.add_argument("--gib", type=float, default=1.0, help="GiB per tensor of the large GPU pair")
    p.add_argument(
        "--cpu-elems", default=f"{1 << 24},{1 << 26}", help="elements per tensor of the CPU pairs (comma-separated)"
    )
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--no-compile", action="store_true", help="leave torch.compile out")
    p.add_argument("--classes", default=",".join(CLASSES), help="comma-separated pair classes (default: all)")
    p.add_argument("--threads", type=int, help="torch and CPU engine threads (default: theirs)")
    p.add_argument("--json", type=Path)
    p.add_argument("--other-cuda", type=Path, help="another cuda.py, timed beside the engine on the GPU")
    args = p.parse_args()
    sections, classes = args.sections.split(","), args.classes.split(",")
    if args.threads:
        from validator.numerics.backends.cpu import set_threads

        torch.set_num_threads(args.threads)
        set_threads(args.threads)
    out: dict[str, Any] = {
        "torch": torch.__version__,
        "machine": platform.processor() or platform.machine(),
        "cpu_threads": torch.get_num_threads(),
        "engine": engine_info(),
        "rows": [],
    }
    if "gpu" in sections and torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name()
        print(f"== GPU: {out['gpu']}, torch {torch.__version__}, triton {out['engine']['triton']}", flush=True)
        big = int(args.gib * (1 << 29))
        shapes = [("8192x7168", (8192, 7168)), (f"{args.gib:g} GiB per tensor", (big,))]
        other = None
        if args.other_cuda:
            from benchmarks.engine_ab import load_module

            other = load_module(str(args.other_cuda), "other_cuda")
        out["rows"] += section("cuda", shapes, args.reps, classes, not args.no_compile, other)
    if "cpu" in sections:
        import numba

        out["numba"] = numba.__version__
        print(
            f"== CPU: {out['machine']}, {out['cpu_threads']} torch threads, numba {numba.__version__} "
            f"(the engine on {out['engine']['cpu_threads']} threads), torch {torch.__version__}",
            flush=True,
        )
        elems = [int(e) for e in args.cpu_elems.split(",")]
        shapes = [(f"{n} elements", (n,)) for n in elems]
        out["rows"] += section("cpu", shapes, max(3, args.reps // 4), classes, False)
        out["rows"] += first_calls(elems)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
