"""The CPU engine built for named CPU levels (what it builds for: validator/numerics/numba_cache.py) against
numba's default, the host's own CPU model and features, alternating whole processes.

    python benchmarks/cpu_level_ab.py [--rounds 4] [--levels x86-64-v3,x86-64-v4]

Each process measures pairs of 16 Mi and 64 Mi elements of every class of ``engine_bench.CLASSES`` (near 1e-3,
drift 1e-2 and 5e-2, nonfinite, bf16 vs fp32, the projection capture; ``floors.measure_blocks``, as a comparison
calls it, in rows of 4,096; one call first, then the median of 15), with numba's cache
in a folder of its own for each build (the first round compiles). Prints each process's medians, then the
fastest per build and pair, and whether the two builds gave the same metrics.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import json, time
import numpy as np
from benchmarks.engine_bench import CLASSES
from validator.numerics.floors import measure_blocks

times, metrics = {}, {}
for n in (1 << 24, 1 << 26):
    for name, make in CLASSES.items():
        x, y = (t.reshape(-1, 4096) for t in make(n, "cpu"))
        key = f"{n >> 20} Mi, {name}"
        m, _ = measure_blocks(x, y)
        took = []
        for _ in range(15):
            t = time.perf_counter()
            measure_blocks(x, y)
            took.append(time.perf_counter() - t)
        times[key] = float(np.median(took)) * 1e3
        metrics[key] = [m.rel_l2, m.cosine, m.max_abs, m.max_ulp, m.pass_ratio, m.nonfinite_a, m.nonfinite_b]
print(json.dumps({"times": times, "metrics": metrics}))
"""

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--levels", default="x86-64-v3", help="comma-separated LLVM CPU names, each built without extra features")
    args = ap.parse_args()
    import llvmlite.binding as ll

    host = ll.get_host_cpu_name()
    builds = {level: {"NUMBA_CPU_NAME": level, "NUMBA_CPU_FEATURES": ""} for level in args.levels.split(",")}
    builds[f"host ({host})"] = {"NUMBA_CPU_NAME": host}
    got: dict[str, list[dict[str, dict[str, object]]]] = {name: [] for name in builds}
    with tempfile.TemporaryDirectory() as caches:
        for _ in range(args.rounds):
            for i, (name, extra) in enumerate(builds.items()):
                env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_")}
                env |= {"NUMBA_CACHE_DIR": os.path.join(caches, str(i)), "PYTHONPATH": str(ROOT), **extra}
                done = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True)
                if done.returncode:
                    raise SystemExit(done.stderr[-3000:])
                got[name].append(json.loads(done.stdout.splitlines()[-1]))
                print(name, {k: round(v, 2) for k, v in got[name][-1]["times"].items()}, flush=True)
    print("fastest median, ms:")
    for name, runs in got.items():
        print(f"  {name}: {({k: round(min(r['times'][k] for r in runs), 2) for k in runs[0]['times']})}")
    *levels, native = (runs[-1]["metrics"] for runs in got.values())
    for name, level in zip(builds, levels):
        for key in level:
            apart = abs(level[key][0] / native[key][0] - 1)
            same = "same" if level[key] == native[key] else f"rel_l2 {apart:.3g} apart"
            counts = "" if level[key][2:] == native[key][2:] else ", COUNTS OR MAXIMA DIFFER"
            print(f"  {name} against the host's, {key}: {same}{counts}")


if __name__ == "__main__":
    main()
