"""Where the CPU kernel's time goes on this machine: its arithmetic, the memory, or neither.

    python benchmarks/cpu_roofline.py [--elems N] [--threads 1,2,4,8,16] [--variants "base=;pf1k=-DVK_PF=1024"]

Measured side by side in one run, for a bf16 and an fp32 pair and each thread count:

- ``read``: a large fp32 ``torch.sum`` with that many threads (the memory's read bandwidth);
- ``cache``: the windowed main pass (``vk_compare_win``, called directly: no sample pass, no Python
  per job) on a pair per thread small enough for its L2 cache, repeated: the kernel's speed when the
  memory is not in the way;
- ``dram``: the same pass on disjoint slices of a large pair, a slice per thread: its speed from
  memory. Both once per build of ``_cpu_kernel.c`` in ``--variants`` (the ``VK_*`` macros: software
  prefetch distance, the in-window compress), and once with the pair in transparent
  huge pages (``madvise``);
- ``call``: ``compare_tensors`` on the large pair (what a caller pays: sample pass, window, Python),
  with the milliseconds of the call and of its sample pass and main pass (``ms_call``, ``ms_sample``,
  ``ms_main``: medians).

Everything but ``cache`` is timed from memory: before each timed call a large array (4x the
last-level cache) is written, which evicts the pair.

All in bytes of input per second. Also what the machine says about itself: CPU model, NUMA nodes,
transparent huge pages, which CPUs share a core.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import hashlib
import json
import mmap
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from benchmarks.compare_bench import llc_bytes, make_pair, timed, timed_cold  # noqa: E402
from validator.kernels import _native, cpu  # noqa: E402
from validator.metrics import compare_tensors  # noqa: E402

_DT = {torch.bfloat16: 3, torch.float32: 1}


def machine() -> dict[str, Any]:
    def read(path: str) -> str | None:
        try:
            return Path(path).read_text().strip()
        except OSError:
            return None

    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    keep = ("Model name", "CPU(s)", "Thread(s) per core", "Core(s) per socket", "Socket(s)", "NUMA node(s)",
            "L2 cache", "L3 cache", "CPU max MHz", "Hypervisor vendor")  # fmt: skip
    out: dict[str, Any] = {
        k: v.strip() for k, _, v in (line.partition(":") for line in lscpu.splitlines()) if k.strip() in keep
    }
    out["affinity"] = len(os.sched_getaffinity(0))
    out["thp"] = read("/sys/kernel/mm/transparent_hugepage/enabled")
    siblings = {read(f"/sys/devices/system/cpu/cpu{c}/topology/thread_siblings_list") for c in os.sched_getaffinity(0)}
    out["thread_siblings"] = sorted(s for s in siblings if s)
    mhz = [
        float(line.split(":")[1]) for line in (read("/proc/cpuinfo") or "").splitlines() if line.startswith("cpu MHz")
    ]
    out["cpu_mhz"] = [min(mhz), max(mhz)] if mhz else None
    if shutil.which("numactl"):
        out["numactl"] = subprocess.run(["numactl", "-H"], capture_output=True, text=True).stdout.splitlines()[:4]
    return out


def build(flags: list[str]) -> ctypes.CDLL:
    """The kernel library built with these extra flags (cached like the real one)."""
    cc = os.environ.get("CC") or shutil.which("cc") or "cc"
    flags = ["-march=native", *flags]
    key = hashlib.sha256("\0".join([_native._SOURCE.read_text(), *flags]).encode()).hexdigest()[:16]
    path = _native._cache_dir() / f"vkcpu-roofline-{key}.so"
    if not path.exists():
        err = _native._compile(cc, flags, path)
        if err:
            raise SystemExit(f"build with {flags} failed: {err}")
    return _native._load(path)


class Pass:
    """One thread's windowed main pass over a pair, called straight through ctypes."""

    def __init__(self, lib: ctypes.CDLL, a: torch.Tensor, b: torch.Tensor, win: tuple[int, int, int]) -> None:
        self.lib, self.a, self.b = lib, a, b
        self.acc, self.win = _native.Acc(), _native.Win()
        self.hist = torch.zeros(max(1, win[1] - win[0]), dtype=torch.int64)
        self.lo, self.width, self.shift = win[0], win[1] - win[0], win[2]

    def __call__(self, reps: int = 1) -> None:
        for _ in range(reps):
            ctypes.memset(ctypes.byref(self.acc), 0, ctypes.sizeof(self.acc))
            ctypes.memset(ctypes.byref(self.win), 0, ctypes.sizeof(self.win))
            self.win.lo, self.win.width, self.win.shift = self.lo, self.width, self.shift
            self.win.window = self.hist.data_ptr()
            nxt = ctypes.c_int64(0)
            rc = self.lib.vk_compare_win(
                self.a.data_ptr(), self.b.data_ptr(), _DT[self.a.dtype], self.a.numel(), 1 << 18, ctypes.byref(nxt),
                1e-5, 1e-3, ctypes.byref(self.acc), ctypes.byref(self.win), 0,
            )  # fmt: skip
            if rc != 0:
                raise SystemExit("vk_compare_win refused its arguments")


def parallel_seconds(
    pool: ThreadPoolExecutor, passes: list[Pass], reps: int, inner: int = 1, evict: Callable[[], Any] | None = None
) -> float:
    """Median wall seconds of running every pass at once (each ``inner`` times), after ``evict()`` if given."""

    def once() -> None:
        list(pool.map(lambda p: p(inner), passes))

    return timed(once, reps) if evict is None else timed_cold(once, reps, evict)


def huge_copy(t: torch.Tensor) -> tuple[torch.Tensor, mmap.mmap]:
    """A copy of t in anonymous memory advised for transparent huge pages."""
    nbytes = t.numel() * t.element_size()
    buf = mmap.mmap(-1, nbytes + (2 << 20))
    if hasattr(mmap, "MADV_HUGEPAGE"):
        buf.madvise(mmap.MADV_HUGEPAGE)
    out = torch.frombuffer(buf, dtype=torch.uint8, count=nbytes).view(t.dtype)
    out.copy_(t)
    return out, buf


@contextlib.contextmanager
def phases() -> Iterator[dict[str, list[float]]]:
    """Milliseconds of each call's sample pass and main pass (lists, a value per call) while the block runs."""
    ms: dict[str, list[float]] = {"sample": [], "main": []}
    saved = cpu._sample_window, cpu._compare_windowed

    def timer(fn: Callable[..., Any], key: str) -> Callable[..., Any]:
        def run(*args: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*args)
            finally:
                ms[key].append(1e3 * (time.perf_counter() - t))

        return run

    cpu._sample_window, cpu._compare_windowed = timer(saved[0], "sample"), timer(saved[1], "main")  # type: ignore[assignment]
    try:
        yield ms
    finally:
        cpu._sample_window, cpu._compare_windowed = saved  # type: ignore[assignment]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--elems", type=int, default=1 << 26)
    p.add_argument("--cache-bytes", type=int, default=1 << 20, help="bytes of each thread's in-cache pair (both)")
    p.add_argument("--threads", default="1,2,4,8,16")
    p.add_argument(
        "--variants",
        default="base=;pf1k=-DVK_PF=1024;pf4k=-DVK_PF=4096",
        help="name=compiler flags;... (builds of _cpu_kernel.c; the first is the one for cache and the huge pages)",
    )
    p.add_argument("--reps", type=int, default=5)
    p.add_argument(
        "--sample-grid",
        default="",
        help="SAMPLE_MAX:_SAMPLE_PER_THREAD,... : the call timed with each, at the largest thread count",
    )
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    counts = [int(x) for x in args.threads.split(",")]
    sample_grid = [tuple(int(v) for v in x.split(":")) for x in args.sample_grid.split(",") if x]
    variants = {k: v.split() for k, _, v in (x.partition("=") for x in args.variants.split(";"))}
    out: dict[str, Any] = {"machine": machine(), "rows": []}
    print(json.dumps(out["machine"]), flush=True)
    libs = {name: build(flags) for name, flags in variants.items()}
    out["variants"] = variants
    pool = ThreadPoolExecutor(max_workers=max(counts))
    big = torch.ones(max(1 << 27, llc_bytes()), dtype=torch.float32)  # 4x the last-level cache in bytes
    bign = big.numpy()

    def evict() -> None:  # NumPy, in this thread: torch's intra-op threads would still be spinning
        np.add(bign, 1.0, out=bign)

    keep_threads = torch.get_num_threads()
    for dtype in (torch.bfloat16, torch.float32):
        a, b = make_pair(args.elems, dtype)
        compare_tensors(a, b)
        win = cpu.last_window or (0, 1, 0)  # the window the real call chose for this pair
        ha, ma = huge_copy(a)
        hb, mb = huge_copy(b)
        esz, name = a.element_size(), str(dtype).removeprefix("torch.")
        cache_elems = args.cache_bytes // (2 * esz)
        small = [make_pair(cache_elems, dtype, seed=s) for s in range(max(counts))]
        print(f"== {name}: {args.elems} elements, window {win}", flush=True)
        for t in counts:
            torch.set_num_threads(t)
            row: dict[str, Any] = {"dtype": name, "threads": t}
            row["read"] = big.numel() * 4 / timed(lambda: big.sum(), args.reps) / 1e9
            torch.set_num_threads(keep_threads)
            inner = max(1, (1 << 24) // (cache_elems * t))
            step = -(-args.elems // t)
            for vname, lib in libs.items():
                s = parallel_seconds(pool, [Pass(lib, *small[i], win) for i in range(t)], args.reps, inner)
                row[f"cache_{vname}"] = t * inner * 2 * esz * cache_elems / s / 1e9
                passes = [Pass(lib, a[i : i + step], b[i : i + step], win) for i in range(0, args.elems, step)]
                row[f"dram_{vname}"] = 2 * esz * args.elems / parallel_seconds(pool, passes, args.reps, 1, evict) / 1e9
            lib0 = next(iter(libs.values()))
            passes = [Pass(lib0, ha[i : i + step], hb[i : i + step], win) for i in range(0, args.elems, step)]
            row["dram_thp"] = 2 * esz * args.elems / parallel_seconds(pool, passes, args.reps, 1, evict) / 1e9
            cpu.set_threads(t)
            compare_tensors(a, b)  # the threads and their buffers made
            with phases() as ms:
                t_call = timed_cold(lambda: compare_tensors(a, b), args.reps, evict)
            row["call"] = 2 * esz * args.elems / t_call / 1e9
            row["ms_call"] = 1e3 * t_call
            row.update({f"ms_{k}": statistics.median(v) for k, v in ms.items()})
            for smax, per in sample_grid if t == max(counts) else []:
                saved = cpu.SAMPLE_MAX, cpu._SAMPLE_PER_THREAD
                cpu.SAMPLE_MAX, cpu._SAMPLE_PER_THREAD = smax, per
                try:
                    compare_tensors(a, b)
                    with phases() as ms:
                        t_call = timed_cold(lambda: compare_tensors(a, b), args.reps, evict)
                finally:
                    cpu.SAMPLE_MAX, cpu._SAMPLE_PER_THREAD = saved
                key = f"smax{smax}_per{per}"
                row[f"ms_call_{key}"] = 1e3 * t_call
                row.update({f"ms_{k}_{key}": statistics.median(v) for k, v in ms.items()})
            cpu.set_threads(None)
            out["rows"].append(row)
            print("  ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()), flush=True)
        del ha, hb, ma, mb, passes
    pool.shutdown()
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    t0 = time.perf_counter()
    rc = main()
    print(f"total {time.perf_counter() - t0:.0f} s")
    raise SystemExit(rc)
