"""The CPU kernel's speed by thread count, and what the machine says about its CPUs.

    python benchmarks/cpu_scaling.py [--elems N] [--json out.json]

For a bf16 and an fp32 pair: bytes of input compared per second with 1, 2, 4, 8 and 16 threads,
measured side by side in one run, against a large fp32 sum on all threads (read bandwidth); and the
CPU model, the cores per socket, threads per core, AVX-512 and any cgroup CPU quota.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from benchmarks.compare_bench import make_pair, timed  # noqa: E402
from validator.kernels import cpu  # noqa: E402
from validator.metrics import compare_tensors  # noqa: E402


def machine() -> dict[str, Any]:
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    keep = ("Model name", "CPU(s)", "Thread(s) per core", "Core(s) per socket", "Socket(s)", "CPU max MHz")
    out: dict[str, Any] = {
        k: v.strip() for k, _, v in (line.partition(":") for line in lscpu.splitlines()) if k in keep
    }
    out["avx512f"] = "avx512f" in lscpu
    out["affinity"] = len(os.sched_getaffinity(0))
    for path in ("/sys/fs/cgroup/cpu.max", "/sys/fs/cgroup/cpu/cpu.cfs_quota_us"):
        if os.path.exists(path):
            out[path] = Path(path).read_text().strip()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--elems", type=int, default=1 << 25)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    out: dict[str, Any] = {"machine": machine()}
    print(json.dumps(out["machine"]), flush=True)
    big = torch.ones(1 << 26, dtype=torch.float32)
    out["read_gbps"] = big.numel() * 4 / timed(lambda: big.sum(), 5) / 1e9
    print("read bandwidth (fp32 sum, all threads):", round(out["read_gbps"], 2), "GB/s", flush=True)
    for dtype in (torch.bfloat16, torch.float32):
        a, b = make_pair(args.elems, dtype)
        for threads in (1, 2, 4, 8, 16):
            cpu.set_threads(threads)
            t = timed(lambda: compare_tensors(a, b), args.reps)
            gbps = 2 * a.element_size() * args.elems / t / 1e9
            out[f"{str(dtype).removeprefix('torch.')}_threads{threads}"] = gbps
            print(
                f"{dtype} threads {threads}: {gbps:.2f} GB/s ({100 * gbps / out['read_gbps']:.0f}% of read)", flush=True
            )
    cpu.set_threads(None)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
