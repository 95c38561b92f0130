"""Where the time of one GPU comparison goes: the whole call against the GPU work alone.

    python benchmarks/call_overhead.py --json out.json        # on a CUDA machine

For a bf16 pair of 8192x7168 (and any ``--elems``), measured side by side in one run:

- ``call``: the median time of ``compare_tensors(a, b)``, as a user sees it (host work + GPU + read back);
  the default (``call_us_launch1``), without the short way for repeated pairs (``CONFIG["LANE"] = 0``:
  ``call_us_nolane``), with torch's launcher (``CONFIG["LAUNCH"] = 0``: ``call_us_launch0``) and
  followed by a redundant ``torch.cuda.synchronize()`` (``call_us_synced``),
  interleaved in three rounds;
- ``gpu``: the same kernels (``vk_sample``, ``vk_main``) launched back to back 50 times with no
  read back, so the host runs ahead and the time per call is the GPU's alone;
- ``breakdown``: one call's parts (Python before the launches, the launches, the wait, Python after)
  and the GPU's span between CUDA events around the launches;
- ``kernel_us``: each kernel's mean GPU time per call (torch's profiler);
- a ``cProfile`` of 200 calls: the Python functions that take the host time.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from benchmarks.compare_bench import gbps, make_pair, timed  # noqa: E402
from validator.kernels import cuda as kc  # noqa: E402
from validator.metrics import compare_tensors  # noqa: E402


def gpu_only(a: torch.Tensor, b: torch.Tensor, reps: int = 50) -> float:
    """Seconds per call of the CUDA C engine's GPU work (the calls queued back to back)."""
    n = a.numel()
    index = torch.cuda.current_device()
    plan = kc._cu_plan(kc._CU_DT[a.dtype], 0, n, a.element_size(), index, kc._cu_macros(), 1, kc._cu_bps(n))
    assert plan is not None and plan.ranks is not None, kc._CU_ERRORS
    stream = kc._raw_stream(index)
    ws = kc._CuWorkspace(a.device, plan.layout)
    tol = kc._tolerances(a.device, 1e-5, 1e-3)

    def one() -> None:  # what ws.run queues (the kernels leave the workspace clean: no memset)
        ws.launch(plan, a, b, tol, stream)

    for _ in range(3):
        one()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        one()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / reps


def breakdown(a: torch.Tensor, b: torch.Tensor, reps: int = 50) -> dict[str, float]:
    """Median microseconds of the parts of one call: Python before the launches, the two launches,
    the wait for the stream, Python after it (marks only); and, in a second pass, the GPU's span
    from the first launch's arrival on the stream to the main kernel's end (CUDA events around the
    launches, which cost host time of their own and so are left out of the first pass)."""
    ws_cls = kc._CuWorkspace
    orig_launch, orig_wait = ws_cls.launch, ws_cls.wait
    ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    mark: dict[str, int] = {}
    events = [False]

    def launch(self: Any, *args: Any) -> None:
        if events[0]:
            ev0.record()
        mark["launch"] = time.perf_counter_ns()
        orig_launch(self, *args)
        mark["launched"] = time.perf_counter_ns()
        if events[0]:
            ev1.record()

    def wait(self: Any, *args: Any) -> list[float]:
        res = orig_wait(self, *args)
        mark["waited"] = time.perf_counter_ns()
        return res

    parts: dict[str, list[float]] = {k: [] for k in ("pre", "launch", "wait", "post", "gpu_span", "call")}
    ws_cls.launch, ws_cls.wait = launch, wait  # type: ignore[method-assign]
    try:
        for i in range(reps + 3):
            t0 = time.perf_counter_ns()
            compare_tensors(a, b)
            t1 = time.perf_counter_ns()
            if i < 3:
                continue
            parts["pre"].append((mark["launch"] - t0) / 1e3)
            parts["launch"].append((mark["launched"] - mark["launch"]) / 1e3)
            parts["wait"].append((mark["waited"] - mark["launched"]) / 1e3)
            parts["post"].append((t1 - mark["waited"]) / 1e3)
            parts["call"].append((t1 - t0) / 1e3)
        events[0] = True
        for _ in range(reps):
            compare_tensors(a, b)
            parts["gpu_span"].append(ev0.elapsed_time(ev1) * 1e3)
    finally:
        ws_cls.launch, ws_cls.wait = orig_launch, orig_wait  # type: ignore[method-assign]
    return {k: statistics.median(v) for k, v in parts.items()}


def kernel_us(a: torch.Tensor, b: torch.Tensor, reps: int = 20) -> dict[str, float]:
    """Mean GPU microseconds per call of each kernel a comparison runs (torch's profiler)."""
    from torch.profiler import ProfilerActivity, profile

    compare_tensors(a, b)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            compare_tensors(a, b)
        torch.cuda.synchronize()
    return {e.key: e.device_time_total / reps for e in prof.key_averages() if e.device_time_total > 0}


def measure(n: int, reps: int, profile: bool) -> dict[str, Any]:
    sync = torch.cuda.synchronize
    pair = make_pair(n, torch.bfloat16, "cuda", seed=3)
    row: dict[str, Any] = {"elements": n, "bytes": 4 * n}
    # the call as a user makes it (compare_tensors returns host numbers: nothing left to wait for), in
    # three variants measured in interleaved rounds so that drift between them cancels
    # (call_us_synced: the default followed by torch.cuda.synchronize())
    variants = {
        "call_us_launch1": (1, 1, 0),
        "call_us_nolane": (1, 0, 0),
        "call_us_launch0": (0, 1, 0),
        "call_us_synced": (1, 1, 1),
    }
    times: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(3):
        for key, (launch, lane, synced) in variants.items():
            kc.CONFIG.update(LAUNCH=launch, LANE=lane)
            times[key].append(1e6 * timed(lambda: compare_tensors(*pair), reps, sync if synced else lambda: None))
    kc.CONFIG.update(LAUNCH=1, LANE=1)
    row.update({k: statistics.median(v) for k, v in times.items()})
    row["gpu_us"] = 1e6 * gpu_only(*pair)
    row["host_us"] = row["call_us_launch1"] - row["gpu_us"]
    row["gbps_call"] = gbps(4 * n, row["call_us_launch1"] / 1e6)
    row["gbps_gpu"] = gbps(4 * n, row["gpu_us"] / 1e6)
    row["breakdown_us"] = breakdown(*pair)
    try:
        row["kernel_us"] = kernel_us(*pair)
    except Exception as exc:  # the profiler is a diagnostic: report and go on
        row["kernel_us"] = f"{type(exc).__name__}: {exc}"
    print(json.dumps(row), flush=True)
    if profile:
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(200):
            compare_tensors(*pair)
        sync()
        prof.disable()
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(22)
        row["profile_tottime"] = s.getvalue()
        print(s.getvalue())
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--elems", type=int, nargs="*", default=[8192 * 7168, 1 << 29])
    p.add_argument("--reps", type=int, default=50)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    out: dict[str, Any] = {"device": torch.cuda.get_device_name(), "config": dict(kc.CONFIG)}
    for i, n in enumerate(args.elems):
        out[str(n)] = measure(n, args.reps, profile=i == 0)
        torch.cuda.empty_cache()
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
