"""The CPU backend of this checkout against another version of it, calls in turn in one process.

    git show REV:validator/numerics/backends/cpu.py > /tmp/old_cpu.py
    .venv/bin/python benchmarks/cpu_ab.py /tmp/old_cpu.py --threads 2 --elems 16,64 --reps 10

``REV`` is the git revision to compare with (a commit, a tag, ``HEAD~1``; one whose backends name their entry
points ``cpu_totals`` and ``cuda_totals``). Both modules' ``cpu_totals`` run on the same bf16 pairs (``engine_bench.make_pair``, ``--elems`` Mi
elements per tensor; ``--dtypes``: the same values in other float dtypes) on ``--threads`` threads,
one call of each in turn, ``--reps`` rounds. Prints per version the least CPU time per element pair
(``time.process_time``: every thread of the process) and the best wall GB/s (both tensors' bytes); then
a 64-element pair, the best of 5 rounds of 200 calls, in microseconds per call; and whether both versions
gave the same results, field for field. The other module must import from this checkout's
``validator.numerics.backends`` (it is loaded by path, as a module of its own), so ``REV`` must be 558e906 or later:
an older ``cpu.py`` imports names from ``small.py`` that it no longer has (for an A/B across that commit, time
two checkouts with ``engine_bench.py --sections cpu`` instead).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numba  # noqa: E402
import torch  # noqa: E402

from benchmarks.engine_ab import load_module  # noqa: E402
from benchmarks.engine_bench import make_pair  # noqa: E402
from validator.numerics.backends import cpu as this  # noqa: E402


def best_of(calls: dict[str, Callable[[], object]], rounds: int, per_round: int = 1) -> dict[str, tuple[float, float]]:
    """(least process seconds, least wall seconds) per call of each, the calls taken in turn."""
    best = {label: (float("inf"), float("inf")) for label in calls}
    for _ in range(rounds):
        for label, call in calls.items():
            p, w = time.process_time(), time.perf_counter()
            for _ in range(per_round):
                call()
            p, w = (time.process_time() - p) / per_round, (time.perf_counter() - w) / per_round
            best[label] = (min(best[label][0], p), min(best[label][1], w))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("other", help="another version's validator/numerics/backends/cpu.py")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--elems", default="16,64", help="Mi elements per tensor (comma-separated)")
    parser.add_argument("--dtypes", default="bfloat16", help="torch float dtypes (comma-separated)")
    parser.add_argument("--reps", type=int, default=10)
    args = parser.parse_args()
    versions = {"other": load_module(args.other, "other_cpu"), "this checkout": this}
    numba.set_num_threads(args.threads)  # (a version whose pass runs on numba's threads)
    for m in versions.values():
        getattr(m, "set_threads", lambda n: None)(args.threads)  # (one that runs on its own pool)
    same = True
    for mi in (int(x) for x in args.elems.split(",")):
        a, b = make_pair(mi << 20, "cpu")
        for dtype in (getattr(torch, name) for name in args.dtypes.split(",")):
            x, y = a.to(dtype), b.to(dtype)
            calls = {label: (lambda m=m: m.cpu_totals(x, y, atol=1e-3, rtol=1e-2)) for label, m in versions.items()}
            results = [call() for call in calls.values()]
            same &= results[0] == results[1]
            for label, (p, w) in best_of(calls, args.reps).items():
                print(
                    f"{mi:3d} Mi {str(dtype):16s} {label:14s} {p / x.numel() * 1e9:6.3f} ns CPU per element pair, {2 * x.nbytes / w / 1e9:5.2f} GB/s"
                )
    a, b = make_pair(64, "cpu")
    calls = {label: (lambda m=m: m.cpu_totals(a, b, atol=1e-3, rtol=1e-2)) for label, m in versions.items()}
    for call in calls.values():
        call()
    for label, (_, w) in best_of(calls, 5, 200).items():
        print(f"64 elements {label:14s} {w * 1e6:7.1f} us per call")
    print(f"same results: {same}")


if __name__ == "__main__":
    main()
