"""Per-pair overhead of a comparison: two stored runs of 4,464 small tensors each (93 layers x 3 capture
points x 16 steps, bf16 16 x 1024, 146 MB per run) against two stored runs of one tensor of the same total
bytes, both sides ``t * (1 + NOISE N(0,1))`` of one base ``t`` (NOISE 1e-2 by default: a drifting port).

    python benchmarks/many_pairs_bench.py --home /tmp/many-pairs --reps 3 --noise 1e-2

The runs are written and ingested into the embedded store at ``--home`` once (not timed). Then, in turn:
``validator compare many-a many-b --json`` and ``validator compare one-a one-b --json`` as whole processes
(the console script, as a user runs it), and the same comparisons in this process the way the command does
them (resolve the stored runs, measure every pair, judge, encode the JSON report). Prints each time, the
medians and (many - one) / 4,464: the overhead per pair (also from the fastest repetition of each); for the
processes, from their wall-clock times and from the CPU time they used. ``--save-json DIR`` writes the JSON
report of each comparison (``DIR/many.json``, ``DIR/one.json``, from the last repetition): a change that must
keep the results bit for bit compares them byte for byte (``cmp``) with the ones saved before it.
``--profile`` then prints where one more comparison of the 4,464 pairs spends its time (``cProfile``, 25
functions by their own time, then 50 by the time of their calls; the profiler's cost is in the figures).
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from probes import BundleWriter
from validator.judging.report import comparison_doc, dumps
from validator.service import Service
from validator.service.cycle_collector import cycle_collector_paused
from validator.settings import Settings

LAYERS, POINTS, STEPS = 93, ("attn.out", "mlp.out", "hidden"), 16
ROWS, COLS = 16, 1024
PAIRS = LAYERS * len(POINTS) * STEPS


def write(path: Path, name: str, *, many: bool, seed: int, noise_level: float) -> Path:
    base, noise = torch.Generator().manual_seed(0), torch.Generator().manual_seed(seed)
    with BundleWriter(path, run_name=name, part="rank0") as w:
        if not many:
            t = torch.randn(PAIRS * ROWS, COLS, generator=base)
            w.add("all", (t * (1 + noise_level * torch.randn(t.shape, generator=noise))).to(torch.bfloat16))
            return path
        for step in range(STEPS):
            for layer in range(LAYERS):
                for point in POINTS:
                    t = torch.randn(ROWS, COLS, generator=base)
                    t = t * (1 + noise_level * torch.randn(t.shape, generator=noise))
                    w.add(point, t.to(torch.bfloat16), step=step, layer=layer)
    return path


def run_name(kind: str, side: str, noise: float) -> str:
    return f"{kind}-{side}-{noise:g}"


def ensure_runs(home: Path, noise: float) -> Service:
    svc = Service(Settings(home=home))
    have = {r.name for r in svc.list_runs(limit=100)}
    for many in (True, False):
        for side, seed in (("a", 1), ("b", 2)):
            name = run_name("many" if many else "one", side, noise)
            if name not in have:
                bundle = write(home.parent / f"{home.name}-bundles" / name, name, many=many, seed=seed, noise_level=noise)
                svc.ingest(bundle, name=name)
    return svc


def whole_process(home: Path, a: str, b: str) -> tuple[float, float]:
    """Seconds of ``validator compare A B --json`` as a process (exit 1, a FAIL, counts as done): wall clock, and
    the CPU time the process used (user and system), which other work on a shared box moves less."""
    cmd = [str(Path(sys.executable).with_name("validator")), "compare", a, b, "--json"]
    r0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    done = subprocess.run(cmd, env={**os.environ, "VALIDATOR_HOME": str(home)}, stdout=subprocess.DEVNULL)
    wall, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode not in (0, 1):
        raise SystemExit(f"{cmd} exited {done.returncode}")
    return wall, r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime


def timed(svc: Service, a: str, b: str) -> tuple[float, int, str]:
    t0 = time.perf_counter()
    c = svc.compare(a, b, allow_paths=False)
    with cycle_collector_paused():  # as the service builds a stored comparison's report
        report = dumps(comparison_doc(c), indent=True)  # as `validator compare --json` prints it
    return time.perf_counter() - t0, len(c.pairs), report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--home", type=Path, required=True, help="the embedded store the four runs are ingested into (once)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--save-json", type=Path, metavar="DIR", help="write each comparison's JSON report to DIR/{many,one}.json")
    ap.add_argument("--profile", action="store_true", help="then profile one more comparison of the many pairs")
    ap.add_argument("--noise", type=float, default=1e-2, help="relative noise of each side (1e-2: a drifting port)")
    args = ap.parse_args()
    svc = ensure_runs(args.home, args.noise)
    names = {kind: (run_name(kind, "a", args.noise), run_name(kind, "b", args.noise)) for kind in ("many", "one")}
    procs: dict[str, list[float]] = {"many": [], "one": []}
    cpu: dict[str, list[float]] = {"many": [], "one": []}
    for _ in range(args.reps):
        for kind in ("many", "one"):
            wall, used = whole_process(args.home, *names[kind])
            procs[kind].append(wall)
            cpu[kind].append(used)
            print(f"validator compare {' '.join(names[kind])} --json: {wall:.2f} s ({used:.2f} s CPU)", flush=True)
    report_overhead("whole process", procs)
    report_overhead("whole process, CPU time", cpu)
    times: dict[str, list[float]] = {"many": [], "one": []}
    try:
        timed(svc, *names["one"])  # warm: imports, the engine's first call
        for _ in range(args.reps):
            for kind in ("many", "one"):
                sec, pairs, report = timed(svc, *names[kind])
                times[kind].append(sec)
                print(f"in process, {kind}: {pairs} pair(s) in {sec:.2f} s", flush=True)
                if args.save_json:
                    args.save_json.mkdir(parents=True, exist_ok=True)
                    (args.save_json / f"{kind}.json").write_text(report)
        if args.profile:
            with cProfile.Profile() as prof:
                timed(svc, *names["many"])
            pstats.Stats(prof).sort_stats("tottime").print_stats(25)
            pstats.Stats(prof).sort_stats("cumulative").print_stats(50)
    finally:
        svc.close()
    report_overhead("in process", times)


def report_overhead(label: str, times: dict[str, list[float]]) -> None:
    many, one = statistics.median(times["many"]), statistics.median(times["one"])
    print(f"{label}: many ({PAIRS} pairs): median {many:.2f} s; one pair of the same bytes: median {one:.2f} s")
    print(f"{label}: overhead per pair: {(many - one) / PAIRS * 1e3:.3f} ms")
    # on a shared box the fastest repetitions move less between runs than the medians
    print(f"{label}: from the fastest of each: {(min(times['many']) - min(times['one'])) / PAIRS * 1e3:.3f} ms")


if __name__ == "__main__":
    main()
