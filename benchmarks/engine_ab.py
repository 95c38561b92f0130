"""The GPU backend of this checkout against another version of it, calls in turn in one process.

    git show REV:validator/numerics/backends/cuda.py > /tmp/old_cuda.py
    PYTHONPATH=$PWD python3 benchmarks/engine_ab.py /tmp/old_cuda.py

``REV`` is the git revision to compare with (a commit, a tag, ``HEAD~1``; one whose backends name their entry
points ``cpu_totals`` and ``cuda_totals``). Both modules' ``cuda_totals`` run on the same bf16 pairs (8192x7168 and 1 GiB per tensor, ``engine_bench.make_pair``;
and 8192x7168 with differences of 5%), one call of each in turn, 40 rounds; each call ends with its result on the host. Prints the
median and the fastest call of each, and whether both gave the same counts, max_abs and ULP results. The other module must import from this checkout's ``validator.numerics.backends`` (it is
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

from benchmarks.engine_bench import make_pair  # noqa: E402
from validator.numerics.backends import cuda as this  # noqa: E402


def load_module(path: str, name: str = "other_cuda") -> ModuleType:
    """A version of a module (``validator/numerics/backends/cuda.py`` here) from a file, as a module of its own."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # numba's on-disk cache finds a module's compiled code by the module's name
    spec.loader.exec_module(module)
    return module


def run_pair(name: str, n: int, other: ModuleType, noise: float = 1e-3) -> None:
    a, b = make_pair(n, "cuda", noise=noise)
    calls = {
        label: (lambda m=m: m.cuda_totals(a, b, atol=1e-5, rtol=1e-3, chunk_elems=1 << 26))
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
        print(
            f"{name:>18} {label:<14} median {med * 1e6:8.1f} us {4 * n / med / 1e9:7.0f} GB/s, fastest {min(ts) * 1e6:8.1f} us"
        )
    x, y = (call() for call in calls.values())
    print(
        f"{name:>18} same counts, max_abs, ULP: {(x.counts, x.max_abs, x.max_ulp) == (y.counts, y.max_abs, y.max_ulp)}"
    )


def main() -> None:
    other = load_module(sys.argv[1])
    for name, n, noise in [
        ("8192x7168", 8192 * 7168, 1e-3),
        ("8192x7168, 5%", 8192 * 7168, 0.05),
        ("1 GiB per tensor", 1 << 29, 1e-3),
    ]:
        run_pair(name, n, other, noise)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
