"""The GPU backend of this checkout against another version of it, calls in turn in one process.

    git show eb90c71:validator/numerics/backends/cuda.py > /tmp/old_cuda.py
    PYTHONPATH=$PWD python3 benchmarks/engine_ab.py /tmp/old_cuda.py

Both modules' ``compare_cuda`` run on the same bf16 pairs (8192x7168 and 1 GiB per tensor, ``b =
bf16(a * (1 + 1e-3 N(0,1)))``), one call of each in turn, 40 rounds; each call ends with its result on the
host. Prints the median and the fastest call of each, and whether both gave the same counts, max_abs and
ULP results. The other module must import from this checkout's ``validator.numerics.backends`` (it is
loaded by path, as a module of its own).
"""

from __future__ import annotations

import importlib.util
import statistics
import sys
import time
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from validator.numerics.backends import cuda as this  # noqa: E402


def run_pair(name: str, n: int, other: ModuleType, g: torch.Generator) -> None:
    a = torch.randn(n, generator=g, device="cuda")
    b = (a * (1 + 1e-3 * torch.randn(n, generator=g, device="cuda"))).to(torch.bfloat16)
    a = a.to(torch.bfloat16)
    calls = {
        label: (lambda m=m: m.compare_cuda(a, b, atol=1e-5, rtol=1e-3, chunk_elems=1 << 26))
        for label, m in (("other", other), ("this checkout", this))
    }
    times: dict[str, list[float]] = {label: [] for label in calls}
    for call in calls.values():
        call()
        call()
    for _ in range(40):
        for label, call in calls.items():
            torch.cuda.synchronize()
            t = time.perf_counter()
            call()
            times[label].append(time.perf_counter() - t)
    for label, ts in times.items():
        med = statistics.median(ts)
        print(f"{name:>18} {label:<14} median {med * 1e6:8.1f} us {4 * n / med / 1e9:7.0f} GB/s, fastest {min(ts) * 1e6:8.1f} us")
    x, y = (call() for call in calls.values())
    print(f"{name:>18} same counts, max_abs, ULP: {(x.counts, x.max_abs, x.ulp) == (y.counts, y.max_abs, y.ulp)}")


def main() -> None:
    spec = importlib.util.spec_from_file_location("other_cuda", sys.argv[1])
    assert spec is not None and spec.loader is not None, sys.argv[1]
    other = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(other)
    g = torch.Generator(device="cuda").manual_seed(0)
    for name, n in [("8192x7168", 8192 * 7168), ("1 GiB per tensor", 1 << 29)]:
        run_pair(name, n, other, g)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
