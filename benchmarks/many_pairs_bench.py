"""Per-pair overhead of a comparison: two stored runs of 4,464 small tensors each (93 layers x 3 capture
points x 16 steps, 16 x 1024 each) against two stored runs of one tensor of the same bytes, for each class of
pair users compare (``--classes``, all by default; a = reference, b = candidate, drawn from one base ``t``):

- ``near``: bf16, each side ``t * (1 + 1e-3 N(0,1))``: a port that rounds alike;
- ``drift1``, ``drift5``: the same with 1e-2 and 5e-2: pairs that drift like a real port's;
- ``nonfinite``: ``drift1`` with 2 NaN and 2 +Inf at the same positions on both sides of every tensor, and one
  more NaN in b only in one tensor of each 93 (those pairs FAIL);
- ``bf16-fp32``: a = ``t`` in float32, b = bf16(``t * (1 + 2e-2 N)``): the transformers engine's bf16 capture
  against its float32 one;
- ``projection``: the projection probe's own capture (``probes.workloads.projection.run_probe`` at hidden 7168, 64
  tokens, PP8): ``pre_norm`` of ``ref`` (float64) as a and of ``partial-bf16`` (bf16) as b, cut into 16 x 1024
  tiles, repeated up to the 4,464 pairs.

    python benchmarks/many_pairs_bench.py --home /tmp/many-pairs --reps 3

The runs are written and ingested into the embedded store at ``--home`` once (not timed). Then, for each class
in turn: ``validator compare many-a many-b --json`` and ``validator compare one-a one-b --json`` as whole
processes (the console script, as a user runs it), and the same comparisons in this process the way the command
does them (resolve the stored runs, measure every pair, judge, encode the JSON report). Prints each time, the
medians and (many - one) / 4,464: the overhead per pair (also from the fastest repetition of each); for the
processes, from their wall-clock times and from the CPU time they used. ``--save-json DIR`` writes the JSON
report of each comparison (``DIR/CLASS-many.json``, ``DIR/CLASS-one.json``, from the last repetition): a change
that must keep the results bit for bit compares them byte for byte (``cmp``) with the ones saved before it.
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


NOISE = {"near": 1e-3, "drift1": 1e-2, "drift5": 5e-2, "nonfinite": 1e-2}
CLASSES = (*NOISE, "bf16-fp32", "projection")


def _projection_tiles() -> tuple[torch.Tensor, torch.Tensor]:
    """``pre_norm`` of the probe's ref (float64) and partial-bf16 paths at hidden 7168, as 16 x 1024 tiles."""
    from probes.workloads.projection import run_probe
    from probes.workloads.projection_config import ProjectionConfig

    run = run_probe(ProjectionConfig(tokens=64), device="cpu", paths=["partial-bf16", "ref"], write_stages=False)
    ref, cand = run.paths["ref"].pre_norm.reshape(-1), run.paths["partial-bf16"].pre_norm.reshape(-1)
    tiles = ref.numel() // (ROWS * COLS)
    return ref[: tiles * ROWS * COLS].reshape(tiles, ROWS, COLS), cand[: tiles * ROWS * COLS].reshape(tiles, ROWS, COLS)


def side_tensors(cls: str, side: str) -> list[torch.Tensor]:
    """The PAIRS tensors of one side of a class, in the order the many-tensor run stores them."""
    base, noise = torch.Generator().manual_seed(0), torch.Generator().manual_seed(1 if side == "a" else 2)
    if cls == "projection":
        ref, cand = _projection_tiles()
        tiles = ref if side == "a" else cand
        return [tiles[i % len(tiles)].clone() for i in range(PAIRS)]
    out = []
    for i in range(PAIRS):
        t = torch.randn(ROWS, COLS, generator=base)
        if cls == "bf16-fp32":
            out.append(
                t if side == "a" else (t * (1 + 2e-2 * torch.randn(t.shape, generator=noise))).to(torch.bfloat16)
            )
            continue
        x = (t * (1 + NOISE[cls] * torch.randn(t.shape, generator=noise))).to(torch.bfloat16)
        if cls == "nonfinite":
            flat = x.view(-1)
            flat[[7, 901]], flat[[333, 12001]] = float("nan"), float("inf")
            if side == "b" and i % LAYERS == 5:
                flat[4242] = float("nan")
        out.append(x)
    return out


def write(path: Path, name: str, tensors: list[torch.Tensor], *, many: bool) -> Path:
    with BundleWriter(path, run_name=name, part="rank0") as w:
        if not many:
            w.add("all", torch.cat([t.reshape(-1) for t in tensors]).reshape(PAIRS * ROWS, COLS))
            return path
        i = 0
        for step in range(STEPS):
            for layer in range(LAYERS):
                for point in POINTS:
                    w.add(point, tensors[i], step=step, layer=layer)
                    i += 1
    return path


def run_name(kind: str, side: str, cls: str) -> str:
    return f"{kind}-{side}-{cls}"


def ensure_runs(svc: Service, home: Path, cls: str) -> None:
    have = {r.name for r in svc.list_runs(limit=1000)}
    for side in ("a", "b"):
        if all(run_name(kind, side, cls) in have for kind in ("many", "one")):
            continue
        tensors = side_tensors(cls, side)
        for kind in ("many", "one"):
            name = run_name(kind, side, cls)
            if name not in have:
                bundle = write(home.parent / f"{home.name}-bundles" / name, name, tensors, many=kind == "many")
                svc.ingest(bundle, name=name)


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
    ap.add_argument("--home", type=Path, required=True, help="the embedded store the runs are ingested into (once)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--classes", default=",".join(CLASSES), help=f"comma-separated, of {', '.join(CLASSES)}")
    ap.add_argument(
        "--save-json", type=Path, metavar="DIR", help="write each comparison's JSON report to DIR/CLASS-{many,one}.json"
    )
    ap.add_argument(
        "--profile", action="store_true", help="then profile one more comparison of each class's many pairs"
    )
    args = ap.parse_args()
    classes = args.classes.split(",")
    if unknown := set(classes) - set(CLASSES):
        ap.error(f"unknown classes {sorted(unknown)}; known: {', '.join(CLASSES)}")
    svc = Service(Settings(home=args.home))
    try:
        for cls in classes:
            ensure_runs(svc, args.home, cls)
        for cls in classes:
            one_class(svc, args, cls)
    finally:
        svc.close()


def one_class(svc: Service, args: argparse.Namespace, cls: str) -> None:
    print(f"== {cls}", flush=True)
    names = {kind: (run_name(kind, "a", cls), run_name(kind, "b", cls)) for kind in ("many", "one")}
    procs: dict[str, list[float]] = {"many": [], "one": []}
    cpu: dict[str, list[float]] = {"many": [], "one": []}
    for _ in range(args.reps):
        for kind in ("many", "one"):
            wall, used = whole_process(args.home, *names[kind])
            procs[kind].append(wall)
            cpu[kind].append(used)
            print(f"validator compare {' '.join(names[kind])} --json: {wall:.2f} s ({used:.2f} s CPU)", flush=True)
    report_overhead(f"{cls}: whole process", procs)
    report_overhead(f"{cls}: whole process, CPU time", cpu)
    times: dict[str, list[float]] = {"many": [], "one": []}
    timed(svc, *names["one"])  # warm: imports, the engine's first call
    for _ in range(args.reps):
        for kind in ("many", "one"):
            sec, pairs, report = timed(svc, *names[kind])
            times[kind].append(sec)
            print(f"in process, {kind}: {pairs} pair(s) in {sec:.2f} s", flush=True)
            if args.save_json:
                args.save_json.mkdir(parents=True, exist_ok=True)
                (args.save_json / f"{cls}-{kind}.json").write_text(report)
    if args.profile:
        with cProfile.Profile() as prof:
            timed(svc, *names["many"])
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
        pstats.Stats(prof).sort_stats("cumulative").print_stats(50)
    report_overhead(f"{cls}: in process", times)


def report_overhead(label: str, times: dict[str, list[float]]) -> None:
    many, one = statistics.median(times["many"]), statistics.median(times["one"])
    print(f"{label}: many ({PAIRS} pairs): median {many:.2f} s; one pair of the same bytes: median {one:.2f} s")
    print(f"{label}: overhead per pair: {(many - one) / PAIRS * 1e3:.3f} ms")
    # on a shared box the fastest repetitions move less between runs than the medians
    print(f"{label}: from the fastest of each: {(min(times['many']) - min(times['one'])) / PAIRS * 1e3:.3f} ms")


if __name__ == "__main__":
    main()
