"""The GPU backend's kernels per call (``torch.profiler``) and whole calls, on this checkout or another version.

    PYTHONPATH=$PWD python3 benchmarks/engine_kernels.py                   # this checkout's backend
    git show REV:validator/numerics/backends/cuda.py > /tmp/old_cuda.py
    PYTHONPATH=$PWD python3 benchmarks/engine_kernels.py /tmp/old_cuda.py  # another version's, loaded by path
    PYTHONPATH=$PWD python3 benchmarks/engine_kernels.py --timeline       # this checkout's timeline alone
    PYTHONPATH=$PWD python3 benchmarks/engine_kernels.py --timeline /tmp/old_cuda.py  # and the other's after it

``REV`` is the git revision to compare with (a commit, a tag, ``HEAD~1``; one whose backends name their entry
points ``cpu_totals`` and ``cuda_totals``). bf16 pairs of 8192x7168 and 1 GiB per tensor (``engine_bench.make_pair``,
differences of 1e-3 and of 5%): the median and fastest of 40 calls of ``cuda_totals`` and of
``metrics.compare_tensors``, each ending with its result on the host, and (this checkout only) of
``floors.measure_blocks`` on 8192x7168 with differences of 1e-2 (the call a comparison makes, with its 64 row
blocks); then, after every call is timed, the GPU time of each kernel and copy over 10 calls of ``cuda_totals``
(and of ``measure_blocks``); then, this checkout only, where the host's time goes in 200 calls of ``cuda_totals``
on 8192x7168 (``cProfile``; the call waits for the GPU in ``Tensor.cpu``), and when each step of a
``compare_tensors`` call on 8192x7168 begins and ends, on the host and on the GPU (:func:`timeline`).
"""

from __future__ import annotations

import cProfile
import pstats
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from benchmarks.engine_ab import load_module  # noqa: E402
from benchmarks.engine_bench import call_times, make_pair  # noqa: E402
from validator.numerics import backends as kernels  # noqa: E402
from validator.numerics.backends import cuda as this  # noqa: E402
from validator.numerics.floors import measure_blocks  # noqa: E402
from validator.numerics.metrics import compare_tensors  # noqa: E402

PAIRS = [
    ("8192x7168", 8192 * 7168, 1e-3),
    ("1GiB", 1 << 29, 1e-3),
    ("8192x7168 5%", 8192 * 7168, 0.05),
    ("1GiB 5%", 1 << 29, 0.05),
]


def _median_us(call: Callable[[], object]) -> tuple[float, float]:
    """Median and fastest of 40 calls in µs (``engine_bench.call_times``)."""
    times = call_times(call, 40, "cuda")
    return statistics.median(times) * 1e6, min(times) * 1e6


def _calls(n: int, cuda: ModuleType, noise: float) -> list[tuple[str, Callable[[], object]]]:
    a, b = make_pair(n, "cuda", noise=noise)
    calls: list[tuple[str, Callable[[], object]]] = [
        ("cuda_totals", lambda: cuda.cuda_totals(a, b, atol=1e-5, rtol=1e-3, chunk_elems=1 << 26)),
        ("compare_tensors", lambda: compare_tensors(a, b)),
    ]
    if cuda is not this:  # compare_tensors runs this checkout's backend
        calls.pop()
    return calls


def _blocks() -> Callable[[], object]:
    """``floors.measure_blocks`` on 8192x7168 (the 64 row blocks a comparison sums, so the second kernel also
    adds each block's d² and a²)."""
    a, b = (t.view(8192, 7168) for t in make_pair(8192 * 7168, "cuda", noise=1e-2))
    return lambda: measure_blocks(a, b)


def _kernels(name: str, call: Callable[[], object]) -> None:
    """Each kernel's and copy's GPU time over 10 calls."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            call()
    for e in prof.key_averages():
        if e.device_time_total > 0:
            print(f"  {name} {e.key[:40]:40s} {e.device_time_total / e.count:8.1f} us x{e.count}")


def time_all(cuda: ModuleType) -> None:
    """Every whole call, timed before any profile runs (the profiles' own work stays out of the timings)."""
    for name, n, noise in PAIRS:
        for label, call in _calls(n, cuda, noise):
            med, fastest = _median_us(call)
            print(f"{name} {label}: median {med:7.1f} us {4 * n / med / 1e3:6.0f} GB/s, fastest {fastest:7.1f} us")
        del call  # the pair's tensors, before the next pair is made
        torch.cuda.empty_cache()
    if cuda is this:
        med, fastest = _median_us(_blocks())
        print(
            f"8192x7168 measure_blocks (64 blocks): median {med:7.1f} us {4 * 8192 * 7168 / med / 1e3:6.0f} GB/s, "
            f"fastest {fastest:7.1f} us"
        )


def profile_all(cuda: ModuleType) -> None:
    for name, n, noise in PAIRS:
        _kernels(name, _calls(n, cuda, noise)[0][1])
        torch.cuda.empty_cache()
    if cuda is this:
        _kernels("8192x7168 64 blocks", _blocks())


def profile_host(n: int) -> None:
    a, b = make_pair(n, "cuda")
    this.cuda_totals(a, b, atol=1e-5, rtol=1e-3, chunk_elems=1 << 26)
    with cProfile.Profile() as prof:
        for _ in range(200):
            this.cuda_totals(a, b, atol=1e-5, rtol=1e-3, chunk_elems=1 << 26)
    pstats.Stats(prof).sort_stats("tottime").print_stats(25)


def timeline(n: int, noise: float, cuda: ModuleType = this) -> None:
    """When each step of ``compare_tensors`` begins and ends on the host (µs from the call, median of 50 calls
    from an idle GPU): ``cuda_totals``, the two kernel launches, ``Tensor.cpu`` (it waits for the GPU); and on the
    GPU, from the call until the pass kernel is queued (``gpu idle``) and from then until the second kernel is
    done (``gpu busy``, the pass's launch included), from CUDA events recorded around them. ``cuda``: the backend
    ``compare_tensors`` runs (this checkout's, or another version's: its launches are ``_launch``, or else each
    kernel's ``run``)."""
    a, b = make_pair(n, "cuda", noise=noise)
    marks: dict[str, float] = {}
    events: dict[str, torch.cuda.Event] = {}

    def timed(name: str, fn: Callable[..., Any], event: str = "") -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            if event == "before":
                events[name] = torch.cuda.Event(enable_timing=True)
                events[name].record()
            marks[f"{name} begins"] = time.perf_counter()
            out = fn(*args, **kwargs)
            marks[f"{name} ends"] = time.perf_counter()
            if event == "after":
                events[name] = torch.cuda.Event(enable_timing=True)
                events[name].record()
            return out

        return call

    saved = {name: getattr(cuda, name) for name in ("_launch", "cuda_totals") if hasattr(cuda, name)}
    saved_runs = cuda._pass_kernel.run, cuda._fix_kernel.run
    saved_cpu, saved_backend = torch.Tensor.cpu, kernels._cuda
    if "_launch" in saved:  # one function launches both kernels
        launches = {cuda._pass_kernel: timed("pass launch", saved["_launch"], "before")}
        fix = timed("fix launch", saved["_launch"], "after")
        cuda._launch = lambda kernel, *args: launches.get(kernel, fix)(kernel, *args)
    else:
        cuda._pass_kernel.run = timed("pass launch", cuda._pass_kernel.run, "before")
        cuda._fix_kernel.run = timed("fix launch", cuda._fix_kernel.run, "after")
    cuda.cuda_totals = timed("cuda_totals", cuda.cuda_totals)
    torch.Tensor.cpu = timed("Tensor.cpu", torch.Tensor.cpu)  # type: ignore[method-assign]
    kernels._cuda = lambda: cuda  # type: ignore[assignment]
    rows = []
    try:
        for i in range(60):
            torch.cuda.synchronize()
            time.sleep(0.002)
            start = torch.cuda.Event(enable_timing=True)
            start.record()
            t0 = time.perf_counter()
            compare_tensors(a, b)
            row = {k: (v - t0) * 1e6 for k, v in marks.items()}
            row["compare_tensors ends"] = (time.perf_counter() - t0) * 1e6
            row["gpu idle"] = start.elapsed_time(events["pass launch"]) * 1e3
            row["gpu busy"] = events["pass launch"].elapsed_time(events["fix launch"]) * 1e3
            if i >= 10:  # after ten calls
                rows.append(row)
    finally:
        for name, value in saved.items():
            setattr(cuda, name, value)
        cuda._pass_kernel.run, cuda._fix_kernel.run = saved_runs
        torch.Tensor.cpu, kernels._cuda = saved_cpu, saved_backend  # type: ignore[method-assign]
    print(f"timeline, {cuda.__name__}, {n} elements, noise {noise:g} (µs from the call; median of {len(rows)} calls):")
    for key in sorted(rows[0], key=lambda k: statistics.median(r[k] for r in rows) if "gpu" not in k else 1e9):
        print(f"  {key:22s} {statistics.median(r[key] for r in rows):7.1f}")


def main() -> None:
    if sys.argv[1:2] == ["--timeline"]:  # the timeline alone, then another version's
        for module in [this, *(load_module(path) for path in sys.argv[2:3])]:
            for noise in (1e-3, 0.05):
                timeline(8192 * 7168, noise, module)
        return
    cuda = load_module(sys.argv[1]) if len(sys.argv) > 1 else this
    time_all(cuda)
    profile_all(cuda)
    if cuda is this:
        profile_host(8192 * 7168)
        for noise in (1e-3, 0.05):
            timeline(8192 * 7168, noise)


if __name__ == "__main__":
    main()
