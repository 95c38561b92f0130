"""Per-pair overhead of a comparison: two stored runs of 4,464 small tensors each (93 layers x 3 capture
points x 16 steps, bf16 16 x 1024, 146 MB per run) against two stored runs of one tensor of the same total
bytes, compared in one process the way ``validator compare RUN-A RUN-B --json`` does it (resolve the stored
runs, measure every pair, judge, encode the JSON report).

    python benchmarks/many_pairs_bench.py --home /tmp/many-pairs --reps 3

The runs are written and ingested into the embedded store at ``--home`` once (not timed). Prints each
time, the medians and (many - one) / 4,464: the overhead per pair (also from the fastest repetition of
each). ``--save-json DIR`` writes the JSON report of each comparison (``DIR/many.json``, ``DIR/one.json``,
from the last repetition): a change that must keep the results bit for bit compares them byte for byte
(``cmp``) with the ones saved before it. ``--profile`` then prints where one more comparison of the 4,464
pairs spends its time (``cProfile``, 25 functions by their own time, then 50 by the time of their calls; the
profiler's cost is in the figures).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time
from pathlib import Path

import torch

from probes import BundleWriter
from validator.judging.report import comparison_doc, dumps
from validator.service import Service
from validator.settings import Settings
from validator.store.bulk import cycle_collector_paused

LAYERS, POINTS, STEPS = 93, ("attn.out", "mlp.out", "hidden"), 16
ROWS, COLS = 16, 1024
PAIRS = LAYERS * len(POINTS) * STEPS


def write(path: Path, name: str, *, many: bool, seed: int) -> Path:
    base, noise = torch.Generator().manual_seed(0), torch.Generator().manual_seed(seed)
    with BundleWriter(path, run_name=name, part="rank0") as w:
        if not many:
            t = torch.randn(PAIRS * ROWS, COLS, generator=base)
            w.add("all", (t * (1 + 1e-3 * torch.randn(t.shape, generator=noise))).to(torch.bfloat16))
            return path
        for step in range(STEPS):
            for layer in range(LAYERS):
                for point in POINTS:
                    t = torch.randn(ROWS, COLS, generator=base)
                    t = t * (1 + 1e-3 * torch.randn(t.shape, generator=noise))
                    w.add(point, t.to(torch.bfloat16), step=step, layer=layer)
    return path


def ensure_runs(home: Path) -> Service:
    svc = Service(Settings(home=home))
    have = {r.name for r in svc.list_runs(limit=100)}
    for many in (True, False):
        for side, seed in (("a", 1), ("b", 2)):
            name = f"{'many' if many else 'one'}-{side}"
            if name not in have:
                svc.ingest(write(home.parent / f"{home.name}-bundles" / name, name, many=many, seed=seed), name=name)
    return svc


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
    args = ap.parse_args()
    svc = ensure_runs(args.home)
    times: dict[str, list[float]] = {"many": [], "one": []}
    try:
        timed(svc, "one-a", "one-b")  # warm: imports, the engine's first call
        for _ in range(args.reps):
            for kind in ("many", "one"):
                sec, pairs, report = timed(svc, f"{kind}-a", f"{kind}-b")
                times[kind].append(sec)
                print(f"{kind}: {pairs} pair(s) in {sec:.2f} s", flush=True)
                if args.save_json:
                    args.save_json.mkdir(parents=True, exist_ok=True)
                    (args.save_json / f"{kind}.json").write_text(report)
        if args.profile:
            with cProfile.Profile() as prof:
                timed(svc, "many-a", "many-b")
            pstats.Stats(prof).sort_stats("tottime").print_stats(25)
            pstats.Stats(prof).sort_stats("cumulative").print_stats(50)
    finally:
        svc.close()
    many, one = statistics.median(times["many"]), statistics.median(times["one"])
    print(f"many ({PAIRS} pairs): median {many:.2f} s; one pair of the same bytes: median {one:.2f} s")
    print(f"overhead per pair: {(many - one) / PAIRS * 1e3:.3f} ms")
    # on a shared box the fastest repetitions move less between runs than the medians
    print(f"from the fastest of each: {(min(times['many']) - min(times['one'])) / PAIRS * 1e3:.3f} ms")


if __name__ == "__main__":
    main()
