"""Comparison-engine throughput, side by side with the ceilings and the peers, in one run.

    python benchmarks/compare_bench.py                      # CPU sections (+ GPU when CUDA is there)
    python benchmarks/compare_bench.py --ingest-mb 2048     # the 2 GB ingest of the issue
    python benchmarks/compare_bench.py --json out.json --sections cpu,gpu

Sections (``--sections``, comma-separated; default: all that apply here):

- ``cpu``: bytes/s of ``compare_tensors`` (our kernels) on bf16 and fp32 pairs, against the machine's
  read bandwidth (a large multi-threaded ``torch.sum``), a NumPy float64 implementation of the same
  metrics (what msprobe / Polygraphy-style tools do), SGLang's comparator math (re-implemented from
  its published formula: per-tensor stats, then ``rel_diff = 1 - 2<x,y>/(|x|^2+|y|^2)`` in float64,
  max/mean abs diff) and the streamed torch reference (``VALIDATOR_KERNELS=0``).
- ``ingest``: a bundle of ``--ingest-mb`` written, then ingested into a fresh store in a subprocess
  (peak RSS by ``resource.getrusage``), as the service does it today and with the streaming feed of
  ``validator.kernels.streaming``; and the run compared with a noisy copy (throughput, peak RSS).
- ``pairs``: ``compare_runs`` on runs of ``--pairs`` small tensors and a tenth of that (linear scaling).
- ``gpu``: on CUDA, bf16 pairs of 8192x7168 and of ``--gpu-gib`` GiB, our fused kernel against the
  device copy bandwidth, a large device sum, a naive torch version (upcast to fp32, one reduction per
  metric) and SGLang's math; with the printed metrics checked against the FP64 reference.

Bytes/s always counts the input bytes of both tensors once. Every figure is the median of ``--reps``.
"""

from __future__ import annotations

import argparse
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

import torch  # noqa: E402

from validator.kernels import backend_for, info  # noqa: E402
from validator.metrics import TensorMetrics, compare_tensors  # noqa: E402

# ---------------------------------------------------------------- helpers


def printed(m: TensorMetrics) -> dict[str, str]:
    """The metrics as the report prints them: 4 significant digits, cosine with 6 decimals."""
    out = {}
    for k, v in m.to_dict().items():
        if k == "cosine" and isinstance(v, float):
            out[k] = f"{v:.6f}"
        elif isinstance(v, float):
            out[k] = f"{v:.4g}"
        else:
            out[k] = str(v)
    return out


def timed(fn: Callable[[], Any], reps: int, sync: Callable[[], None] = lambda: None) -> float:
    """Median seconds of ``reps`` calls after one warm-up."""
    fn()
    sync()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        sync()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def timed_cold(fn: Callable[[], Any], reps: int, evict: Callable[[], Any]) -> float:
    """Median seconds of ``reps`` calls, each after ``evict()`` (untimed) has pushed the inputs out of
    the caches, after one warm-up."""
    fn()
    ts = []
    for _ in range(reps):
        evict()
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def llc_bytes() -> int:
    """The last-level cache of the machine as lscpu reports it (all instances together), 0 if unknown."""
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "K": 1 << 10, "M": 1 << 20}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("L3 cache", "L3"):
            parts = value.split()
            if len(parts) >= 2 and parts[1] in units:
                return int(float(parts[0]) * units[parts[1]])
    return 0


def gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9


def make_pair(n: int, dtype: torch.dtype, device: str = "cpu", seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A reference and a candidate that differs like two serving kernels do: ~1% relative noise."""
    g = torch.Generator(device=device).manual_seed(seed)
    a = torch.randn(n, generator=g, device=device, dtype=torch.float32)
    b = a + 0.01 * a.abs().mean() * torch.randn(n, generator=g, device=device, dtype=torch.float32)
    return a.to(dtype), b.to(dtype)


def load_note() -> str:
    try:
        l1, l5, l15 = os.getloadavg()
        return f"load average {l1:.2f} {l5:.2f} {l15:.2f} on {os.cpu_count()} CPUs"
    except OSError:
        return "load average unknown"


# ---------------------------------------------------------------- peers


def numpy_f64_metrics(a: torch.Tensor, b: torch.Tensor, atol: float = 1e-5, rtol: float = 1e-3) -> dict[str, Any]:
    """Every TensorMetrics field with NumPy float64 whole-array operations (the peers' style)."""
    import numpy as np

    x_all = a.to(torch.float64).numpy()
    y_all = b.to(torch.float64).numpy()
    fin = np.isfinite(x_all) & np.isfinite(y_all)
    all_fin = bool(fin.all())
    x, y = (x_all, y_all) if all_fin else (x_all[fin], y_all[fin])
    d = y - x
    na, nb, nd = float(np.sqrt(np.dot(x, x))), float(np.sqrt(np.dot(y, y))), float(np.sqrt(np.dot(d, d)))
    dot = float(np.dot(x, y))
    ad = np.abs(d)
    out = {
        "norm_a": na,
        "norm_b": nb,
        "rel_l2": nd / na if na else math.inf,
        "cosine": dot / (na * nb) if na and nb else math.nan,
        "max_abs": float(ad.max()) if ad.size else 0.0,
        "mean_abs": float(ad.mean()) if ad.size else 0.0,
        "rel_diff": nd * nd / (na * na + nb * nb) if na or nb else 0.0,
        "pass_ratio": float(np.isclose(y_all, x_all, rtol=rtol, atol=atol, equal_nan=True).mean()),
        "nonfinite_a": int((~np.isfinite(x_all)).sum()),
        "nonfinite_b": int((~np.isfinite(y_all)).sum()),
    }
    if a.dtype == b.dtype and a.dtype in (torch.bfloat16, torch.float16):
        ia = a.view(torch.int16).numpy().astype(np.int64)
        ib = b.view(torch.int16).numpy().astype(np.int64)
        oa = np.where(ia < 0, -(ia & 0x7FFF), ia)
        ob = np.where(ib < 0, -(ib & 0x7FFF), ib)
        dist = np.abs(oa - ob)[fin] if not all_fin else np.abs(oa - ob)
        out["max_ulp"] = int(dist.max())
        out["p99_ulp"] = int(np.percentile(dist, 99, method="inverted_cdf"))
    return out


def sglang_math(x_baseline: torch.Tensor, x_target: torch.Tensor) -> dict[str, float]:
    """SGLang's comparator math on one pair, re-implemented from its published description: both
    tensors to float32, per-tensor mean/std/min/max, then rel_diff = 1 - 2<x,y>/(|x|^2+|y|^2) computed
    in float64, and the max and mean absolute difference."""
    x = x_baseline.float()
    y = x_target.float()
    stats = {}
    for name, t in (("baseline", x), ("target", y)):
        stats[f"{name}_mean"] = t.mean().item()
        stats[f"{name}_std"] = t.std().item()
        stats[f"{name}_min"] = t.min().item()
        stats[f"{name}_max"] = t.max().item()
    xd, yd = x.double(), y.double()
    denom = (xd * xd + yd * yd).sum()
    stats["rel_diff"] = (1 - 2 * (xd * yd).sum() / denom).item()
    diff = (y - x).abs()
    stats["max_abs_diff"] = diff.max().item()
    stats["mean_abs_diff"] = diff.mean().item()
    return stats


def naive_torch(a: torch.Tensor, b: torch.Tensor, atol: float = 1e-5, rtol: float = 1e-3) -> list[float]:
    """Upcast to float32, one reduction per metric (each a separate pass over memory)."""
    x, y = a.float(), b.float()
    d = y - x
    vals = [
        torch.linalg.vector_norm(x),
        torch.linalg.vector_norm(y),
        torch.linalg.vector_norm(d),
        (x * y).sum(),
        d.abs().max(),
        d.abs().mean(),
        (d.abs() <= atol + rtol * x.abs()).float().mean(),
        (~torch.isfinite(x)).sum(),
        (~torch.isfinite(y)).sum(),
    ]
    return [float(v) for v in torch.stack([v.float() for v in vals]).cpu()]


# ---------------------------------------------------------------- sections


def section_cpu(args: argparse.Namespace, out: dict[str, Any]) -> None:
    import numpy as np

    n = args.cpu_elems
    rows: list[tuple[str, float, str]] = []
    res: dict[str, Any] = {"elements": n, "threads": torch.get_num_threads(), "load_before": load_note()}
    # the memory's bandwidth, not the cache's: an array of 4x the last-level cache at least (the H200's
    # host reports 300 MiB of L3; there a 256 MiB array read at 129 GB/s and a 512 MiB one at 84-92)
    llc = llc_bytes()
    res["llc_bytes"] = llc
    big = torch.randn(max(n, 1 << 26, llc), dtype=torch.float32)  # llc floats: 4x the cache in bytes
    t = timed(lambda: big.sum(), args.reps)
    read_bw = gbps(big.numel() * 4, t)
    res["read_bw_gbps"] = read_bw
    rows.append(
        ("memory read: torch.sum fp32, all threads", read_bw, f"{big.numel() * 4 >> 20} MiB, L3 {llc >> 20} MiB")
    )
    bign = big.numpy()
    t = timed(lambda: bign.sum(), args.reps)
    rows.append(("memory read: numpy sum fp32, 1 thread", gbps(big.numel() * 4, t), ""))
    for dtype in (torch.bfloat16, torch.float32):
        name = str(dtype).removeprefix("torch.")
        a, b = make_pair(n, dtype)
        nbytes = 2 * a.numel() * a.element_size()
        # from memory, like the read above: before each call the large array is written, which evicts the
        # pair (by NumPy, in this thread: torch's intra-op threads would still be spinning on the cores)
        t_ours = timed_cold(lambda: compare_tensors(a, b), args.reps, lambda: np.add(bign, 1.0, out=bign))
        res[f"{name}_warm_gbps"] = gbps(nbytes, timed(lambda: compare_tensors(a, b), args.reps))
        t_np = timed(lambda: numpy_f64_metrics(a, b), max(1, args.reps // 2))
        t_sg = timed(lambda: sglang_math(a, b), max(1, args.reps // 2))
        m = min(n, args.ref_elems)  # the streamed torch reference is slow: timed and checked on a prefix
        os.environ["VALIDATOR_KERNELS"] = "0"
        try:
            t_ref = timed(lambda: compare_tensors(a[:m], b[:m]), 1)
            ref = compare_tensors(a[:m], b[:m])
        finally:
            os.environ.pop("VALIDATOR_KERNELS")
        same = printed(ref) == printed(compare_tensors(a[:m], b[:m]))
        r = {
            "backend": backend_for(a, b),
            "ours_gbps": gbps(nbytes, t_ours),
            "numpy_f64_gbps": gbps(nbytes, t_np),
            "sglang_math_gbps": gbps(nbytes, t_sg),
            "reference_gbps": gbps(2 * m * a.element_size(), t_ref),
            "reference_elems": m,
            "printed_identical_to_reference": same,
        }
        r["ratio_vs_read_bw"] = r["ours_gbps"] / read_bw
        r["ratio_vs_numpy"] = r["ours_gbps"] / r["numpy_f64_gbps"]
        r["ratio_vs_sglang"] = r["ours_gbps"] / r["sglang_math_gbps"]
        res[name] = r
        rows += [
            (
                f"{name}: ours ({r['backend']})",
                r["ours_gbps"],
                f"{r['ratio_vs_read_bw']:.0%} of read bw, printed == ref: {same}",
            ),
            (f"{name}: NumPy float64 metrics", r["numpy_f64_gbps"], f"ours {r['ratio_vs_numpy']:.1f}x"),
            (f"{name}: SGLang comparator math", r["sglang_math_gbps"], f"ours {r['ratio_vs_sglang']:.1f}x"),
            (f"{name}: torch reference (VALIDATOR_KERNELS=0)", r["reference_gbps"], f"on {m} elements"),
        ]
    res["load_after"] = load_note()
    out["cpu"] = res
    table(f"CPU: bf16/fp32 pairs of {n} elements ({res['load_before']})", rows)


_INGEST_CHILD = r"""
import json, resource, sys, time
def hwm():
    # VmHWM: this process's own peak RSS. ru_maxrss is also printed, but Linux carries the parent's
    # high-water mark across fork+exec into it, so in a child of a large process it over-reports.
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
sys.path.insert(0, sys.argv[1])
mode, bundle, home = sys.argv[2], sys.argv[3], sys.argv[4]
if mode == "with-torch":  # what every ingest cost before it stopped importing torch: the import alone
    import torch
from validator.config import Settings
from validator.service import Service
svc = Service(Settings(home=__import__("pathlib").Path(home)))
base = hwm()
t = time.perf_counter()
s = svc.ingest(bundle, name="bench")
dt = time.perf_counter() - t
print(json.dumps({"seconds": dt, "bytes": s.total_bytes, "rss_after_import_mb": base, "peak_rss_mb": hwm(),
                  "ru_maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "torch_loaded": "torch" in sys.modules}))
"""

_COMPARE_CHILD = r"""
import json, resource, sys, time
def hwm():
    # VmHWM: this process's own peak RSS. ru_maxrss is also printed, but Linux carries the parent's
    # high-water mark across fork+exec into it, so in a child of a large process it over-reports.
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
sys.path.insert(0, sys.argv[1])
from validator.sources import open_path
from validator.compare import compare_runs
a, b = open_path(sys.argv[2]), open_path(sys.argv[3])
base = hwm()
t = time.perf_counter()
c = compare_runs(a, b)
dt = time.perf_counter() - t
print(json.dumps({"seconds": dt, "pairs": len(c.pairs), "verdict": c.verdict, "rss_after_import_mb": base,
                  "peak_rss_mb": hwm(), "ru_maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def _child(code: str, *argv: str) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-c", code, str(ROOT), *argv], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _write_bundle(path: Path, name: str, total_bytes: int, tensor_mb: int, noise: float, seed: int) -> int:
    from probes import BundleWriter

    per = tensor_mb << 20
    n_t = max(1, total_bytes // per)
    g = torch.Generator().manual_seed(seed)
    written = 0
    with BundleWriter(path, run_name=name, max_file_bytes=256 << 20) as w:
        for i in range(n_t):
            g0 = torch.Generator().manual_seed(1000 + i)
            x = torch.randn(per // 2, generator=g0)
            if noise:
                x = x + noise * torch.randn(per // 2, generator=g)
            w.add(f"layer{i}.hidden", x.to(torch.bfloat16), step=0)
            written += per
    return written


def section_ingest(args: argparse.Namespace, out: dict[str, Any]) -> None:
    rows: list[tuple[str, float, str]] = []
    res: dict[str, Any] = {"bundle_mb": args.ingest_mb, "tensor_mb": args.ingest_tensor_mb}
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        tmpd = Path(tmp)
        total = _write_bundle(tmpd / "run_a", "run_a", args.ingest_mb << 20, args.ingest_tensor_mb, 0.0, 1)
        _write_bundle(tmpd / "run_b", "run_b", args.ingest_mb << 20, args.ingest_tensor_mb, 0.01, 2)
        res["bytes"] = total
        modes = {"streamed": "ingest (torch not imported)", "with-torch": "ingest, torch imported first"}
        for mode, label in modes.items():
            r = _child(_INGEST_CHILD, mode, str(tmpd / "run_a"), str(tmpd / f"home-{mode}"))
            r["gbps"] = gbps(r["bytes"], r["seconds"])
            res[mode] = r
            rows.append(
                (
                    label,
                    r["gbps"],
                    f"peak RSS {r['peak_rss_mb']:.0f} MB (after imports {r['rss_after_import_mb']:.0f} MB)",
                )
            )
        r = _child(_COMPARE_CHILD, str(tmpd / "run_a"), str(tmpd / "run_b"))
        r["gbps"] = gbps(2 * total, r["seconds"])
        res["compare"] = r
        rows.append(
            (
                "compare_runs of the two bundles",
                r["gbps"],
                f"{r['pairs']} pairs, peak RSS {r['peak_rss_mb']:.0f} MB (after imports {r['rss_after_import_mb']:.0f} MB)",
            )
        )
    out["ingest"] = res
    table(f"Ingest and compare: bf16 bundle of {args.ingest_mb} MB in {args.ingest_tensor_mb} MB tensors", rows)


def section_pairs(args: argparse.Namespace, out: dict[str, Any]) -> None:
    from probes import BundleWriter
    from validator.compare import compare_runs
    from validator.sources import open_path

    rows: list[tuple[str, float, str]] = []
    res: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        for count in (args.pairs // 10, args.pairs):
            paths = []
            for side in ("a", "b"):
                p = Path(tmp) / f"{side}{count}"
                g = torch.Generator().manual_seed(len(side))
                with BundleWriter(p, run_name=p.name, max_file_bytes=64 << 20) as w:
                    for i in range(count):
                        w.add(f"t{i}", torch.randn(args.pair_elems, generator=g).to(torch.bfloat16), step=0)
                paths.append(p)
            va, vb = open_path(paths[0]), open_path(paths[1])
            t = time.perf_counter()
            c = compare_runs(va, vb)
            dt = time.perf_counter() - t
            res[str(count)] = {"seconds": dt, "per_pair_ms": 1000 * dt / count, "pairs": len(c.pairs)}
            rows.append(
                (
                    f"compare_runs, {count} pairs of {args.pair_elems} bf16",
                    count / dt,
                    f"pairs/s; {1000 * dt / count:.3f} ms/pair",
                )
            )
    lo, hi = res[str(args.pairs // 10)], res[str(args.pairs)]
    res["time_ratio"] = hi["seconds"] / lo["seconds"]
    out["pairs"] = res
    table(f"Pair scaling (10x the pairs took {res['time_ratio']:.2f}x the time)", rows, unit="pairs/s")


def section_gpu(args: argparse.Namespace, out: dict[str, Any]) -> None:
    from validator.kernels import cuda as kc

    dev = "cuda"
    sync = torch.cuda.synchronize
    res: dict[str, Any] = {"device": torch.cuda.get_device_name(), "info": info()}
    from validator.kernels import cuda as kc_

    probe = make_pair(1 << 21, torch.bfloat16, dev)
    compare_tensors(*probe)
    res["cuda_c_errors"] = {str(k): v for k, v in kc_._CU_ERRORS.items()}
    print("CUDA C engine:", "in use" if kc_.WINDOW_STATS["cuda_c"] else f"not in use: {res['cuda_c_errors']}")
    res["cuda_c_kernels"] = cu_kernel_attributes()
    print("CUDA C kernels (registers, local bytes, max threads/block):", res["cuda_c_kernels"])
    out["gpu"] = res  # filled in as we go: a later failure keeps what was measured
    rows: list[tuple[str, float, str]] = []
    buf = torch.empty(1 << 30, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(buf)
    buf.random_()
    t = timed(lambda: dst.copy_(buf), args.reps, sync)
    copy_bw = gbps(2 * buf.numel(), t)
    t = timed(lambda: buf.view(torch.float32).sum(), args.reps, sync)
    read_bw = gbps(buf.numel(), t)
    res["copy_bw_gbps"], res["read_bw_gbps"] = copy_bw, read_bw
    rows += [("device copy (read + write bytes)", copy_bw, "1 GiB"), ("device read: fp32 sum", read_bw, "1 GiB")]
    table("GPU ceilings", rows)
    if args.sweep:
        res["sweep"], best = gpu_sweep(args)
        res["cuda_c_kernels_swept"] = cu_kernel_attributes()
        print("CUDA C kernels after the sweep (registers, local bytes, max threads/block):")
        for k, v in res["cuda_c_kernels_swept"].items():
            print("  ", k, v)
        kc.CONFIG.update(best)
        res["chosen_config"] = dict(kc.CONFIG)
        if args.best_out:
            Path(args.best_out).write_text(json.dumps(best))
    if args.profile:
        for n in (1024, 8192 * 7168):
            try:
                gpu_profile(n)
            except Exception as exc:  # the profiler is a diagnostic: report and go on
                print("profile failed:", type(exc).__name__, exc)
    tiny = make_pair(1024, torch.bfloat16, dev)
    res["per_call_overhead_us"] = 1e6 * timed(lambda: compare_tensors(*tiny), 20, sync)
    rows.append(
        ("per-call time, 1024-element pair (fixed overhead)", res["per_call_overhead_us"], "microseconds, not GB/s")
    )
    shapes = [("8192x7168", 8192 * 7168), (f"{args.gpu_gib} GiB per tensor", int(args.gpu_gib * (1 << 29)))]
    for label, n in shapes:
        a, b = make_pair(n, torch.bfloat16, dev, seed=3)
        nbytes = 4 * n
        t_ours = timed(lambda: compare_tensors(a, b), args.reps)  # returns host numbers: nothing to wait for
        t_naive = timed(lambda: naive_torch(a, b), args.reps, sync)
        t_sg = timed(lambda: sglang_math(a, b), max(1, args.reps // 2), sync)
        ours = compare_tensors(a, b)
        saved = dict(kc.CONFIG)
        kc.CONFIG["DIAG"] = 2
        kc.CONFIG["CUDIAG"] = 9
        t_noulp = timed(lambda: compare_tensors(a, b), args.reps)
        kc.CONFIG.update(saved)
        os.environ["VALIDATOR_KERNELS"] = "0"
        try:
            t_ref = time.perf_counter()
            ref = compare_tensors(a, b)
            sync()
            t_ref = time.perf_counter() - t_ref
        finally:
            os.environ.pop("VALIDATOR_KERNELS")
        same = printed(ref) == printed(ours)
        r = {
            "elements": n,
            "backend": backend_for(a, b),
            "ours_gbps": gbps(nbytes, t_ours),
            "ours_without_ulp_work_gbps": gbps(nbytes, t_noulp),
            "naive_torch_gbps": gbps(nbytes, t_naive),
            "sglang_math_gbps": gbps(nbytes, t_sg),
            "fp64_reference_gbps": gbps(nbytes, t_ref),
            "printed_identical_to_fp64_reference": same,
            "ours_printed": printed(ours),
        }
        if not same:
            r["diff"] = {k: (v, printed(ours)[k]) for k, v in printed(ref).items() if printed(ours)[k] != v}
        r["ratio_vs_copy_bw"] = r["ours_gbps"] / copy_bw
        r["ratio_vs_naive"] = r["ours_gbps"] / r["naive_torch_gbps"]
        r["ratio_vs_sglang"] = r["ours_gbps"] / r["sglang_math_gbps"]
        res[label] = r
        rows += [
            (
                f"{label}: ours ({r['backend']})",
                r["ours_gbps"],
                f"{r['ratio_vs_copy_bw']:.0%} of copy bw; printed == FP64 ref: {same}",
            ),
            (
                f"{label}: ours, ULP work left out (diagnostic)",
                r["ours_without_ulp_work_gbps"],
                "not exact: no p99/max ULP",
            ),
            (
                f"{label}: naive torch (fp32, 1 reduction/metric)",
                r["naive_torch_gbps"],
                f"ours {r['ratio_vs_naive']:.1f}x",
            ),
            (f"{label}: SGLang comparator math", r["sglang_math_gbps"], f"ours {r['ratio_vs_sglang']:.1f}x"),
            (f"{label}: FP64 torch reference", r["fp64_reference_gbps"], "one run"),
        ]
        torch.cuda.empty_cache()
    out["gpu"] = res
    table(f"GPU: bf16 pairs on {res['device']} (config {res.get('chosen_config', kc.CONFIG)})", rows)


SWEEP: list[dict[str, int]] = [  # kernel configurations (validator/kernels/cuda.py CONFIG keys)
    # the CUDA C engine (_cuda_kernel.cu): blocks of 256 threads per SM in the grid, and the minimum
    # resident blocks promised to the compiler (caps its registers: 4 -> 64 per thread)
    {"ENGINE": 1, "cu_blocks_per_sm": 8, "cu_minb": 4},
    {"ENGINE": 1, "cu_blocks_per_sm": 12, "cu_minb": 4},
    {"ENGINE": 1, "cu_blocks_per_sm": 16, "cu_minb": 4},
    {"ENGINE": 1, "cu_blocks_per_sm": 6, "cu_minb": 3},
    {"ENGINE": 1, "cu_blocks_per_sm": 15, "cu_minb": 5},
]

_DIAG_BASE = {"ENGINE": 1, "cu_blocks_per_sm": 15, "cu_minb": 5}
ATTRIBUTION: list[dict[str, int]] = [  # timing only, never chosen: the main pass with one part left out
    _DIAG_BASE,
    # 4 the loads alone, 6 no tolerance test, 7 no max |d|, 9 no ULP work, 10 no float64 work,
    # 11 no sums of products (_cuda_kernel.cu, step())
    *({**_DIAG_BASE, "CUDIAG": d} for d in (4, 6, 7, 9, 10, 11)),
]


def gpu_sweep(args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """Kernel configurations on the 8192x7168 pair and a 1 GiB pair; the best exact one is returned.
    DIAG rows leave parts of the work out: they are timings for attribution, never chosen."""
    from validator.kernels import cuda as kc

    saved = dict(kc.CONFIG)
    results: list[dict[str, Any]] = []
    sizes = (8192 * 7168, 1 << 29)
    pairs = {n: make_pair(n, torch.bfloat16, "cuda", seed=4) for n in sizes}
    os.environ["VALIDATOR_KERNELS"] = "0"
    try:
        ref = {n: printed(compare_tensors(*p)) for n, p in pairs.items()}
    finally:
        os.environ.pop("VALIDATOR_KERNELS")
    best, best_score = {}, -1.0
    for cfg in ATTRIBUTION if args.attribution else SWEEP:
        kc.CONFIG.clear()
        kc.CONFIG.update(saved)
        kc.CONFIG.update(cfg)
        row: dict[str, Any] = dict(cfg)
        try:
            for n, (a, b) in pairs.items():
                t = timed(lambda: compare_tensors(a, b), args.reps, torch.cuda.synchronize)
                row[f"gbps_{n}"] = gbps(4 * n, t)
                before = dict(kc.WINDOW_STATS)
                row[f"exact_{n}"] = printed(compare_tensors(a, b)) == ref[n]
                row[f"fallback_{n}"] = kc.WINDOW_STATS["fallback"] - before["fallback"]
                row[f"cuda_c_{n}"] = kc.WINDOW_STATS["cuda_c"] - before["cuda_c"]
            score = min(row[f"gbps_{sizes[0]}"] / 1000, row[f"gbps_{sizes[1]}"] / 2500)
            if (
                not cfg.get("DIAG")
                and not cfg.get("CUDIAG")
                and all(row[f"exact_{n}"] for n in sizes)
                and score > best_score
            ):
                best, best_score = dict(cfg), score
        except Exception as exc:  # a configuration that does not compile is a result too
            row["error"] = f"{type(exc).__name__}: {exc}"[:300]
        results.append(row)
        print("sweep", json.dumps(row), flush=True)
    kc.CONFIG.clear()
    kc.CONFIG.update(saved)
    del pairs
    torch.cuda.empty_cache()
    return results, best


def cu_kernel_attributes() -> dict[str, list[int]]:
    """Registers per thread, local (spill) bytes and the occupancy limit of the compiled CUDA C kernels."""
    import ctypes

    out: dict[str, list[int]] = {}
    try:
        lib = torch.cuda._utils._get_gpu_runtime_library()  # type: ignore[attr-defined]
        for key, pair in _cached_cu():
            for name, k in zip(("sample", "main"), pair):
                vals = []
                for attr in (4, 3, 0):  # NUM_REGS, LOCAL_SIZE_BYTES, MAX_THREADS_PER_BLOCK
                    v = ctypes.c_int()
                    lib.cuFuncGetAttribute(ctypes.byref(v), attr, k.func)
                    vals.append(v.value)
                out[f"{name}{key}"] = vals
    except Exception as exc:  # diagnostics only
        out["error"] = [0]
        print("kernel attributes:", type(exc).__name__, exc)
    return out


def _cached_cu() -> list[tuple[tuple[int, ...], Any]]:
    from validator.kernels import cuda as kc

    return [(k, v) for k, v in kc._CU_BUILT.items() if v is not None]


def gpu_profile(n: int, reps: int = 20) -> None:
    """Where the time of one call goes: torch.profiler over ``reps`` calls on an ``n``-element pair."""
    from torch.profiler import ProfilerActivity, profile

    a, b = make_pair(n, torch.bfloat16, "cuda", seed=5)
    compare_tensors(a, b)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            compare_tensors(a, b)
        torch.cuda.synchronize()
    print(f"\n== profile: {reps} calls on a {n}-element bf16 pair")
    print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=14, max_name_column_width=40))
    sys.stdout.flush()


def table(title: str, rows: list[tuple[str, float, str]], unit: str = "GB/s") -> None:
    w = max(len(r[0]) for r in rows)
    print(f"\n== {title}")
    for name, v, note in rows:
        print(f"  {name.ljust(w)}  {v:10.2f} {unit}  {note}")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sections", default=None, help="cpu,ingest,pairs,gpu (default: all that apply)")
    p.add_argument("--cpu-elems", type=int, default=1 << 26, help="elements per tensor in the CPU pairs")
    p.add_argument("--ref-elems", type=int, default=1 << 22, help="elements the slow torch reference is timed on")
    p.add_argument("--ingest-mb", type=int, default=512, help="bundle size for the ingest section (the issue: 2048)")
    p.add_argument("--ingest-tensor-mb", type=int, default=64)
    p.add_argument("--pairs", type=int, default=10_000)
    p.add_argument("--pair-elems", type=int, default=1024)
    p.add_argument("--gpu-gib", type=float, default=1.0, help="GiB per tensor of the large GPU pair")
    p.add_argument("--sweep", action="store_true", help="time several GPU kernel configurations, then use the best")
    p.add_argument("--profile", action="store_true", help="GPU: torch.profiler tables of one call")
    p.add_argument("--attribution", action="store_true", help="with --sweep: the timing-only variants instead")
    p.add_argument("--best-out", default=None, help="with --sweep: write the chosen configuration (JSON) here")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--tmp", default=None, help="folder for the temporary bundles")
    p.add_argument("--json", default=None, help="write every number here")
    args = p.parse_args(argv)
    default = ["cpu", "ingest", "pairs"] + (["gpu"] if torch.cuda.is_available() else [])
    sections = args.sections.split(",") if args.sections else default
    out: dict[str, Any] = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor(),
            "cpus": os.cpu_count(),
            "torch": torch.__version__,
            "python": platform.python_version(),
        },
        "kernels": info(),
    }
    print(json.dumps(out, indent=1))
    for s in sections:
        try:
            {"cpu": section_cpu, "ingest": section_ingest, "pairs": section_pairs, "gpu": section_gpu}[s](args, out)
        except Exception:  # report and go on with the other sections
            import traceback

            traceback.print_exc()
            out.setdefault("errors", {})[s] = traceback.format_exc()[-3000:]
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
