"""`validator rl kl` as a whole process on 10^3 .. 10^6 steps: wall time and peak memory (issue 39, item 1).

Each series is one sample of one token per step (the shape that made the trend statistics quadratic), written
as JSONL to a temporary directory; each run is a fresh `validator rl kl FILE` process (and `--json` with
``--json``), its peak RSS from ``wait4``. Results: benchmarks/rl_kl_scaling.md.

    .venv/bin/python benchmarks/rl_kl_scaling.py [--steps 1000 10000 100000 1000000] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

VALIDATOR = Path(sys.executable).with_name("validator")


def write_series(path: Path, n: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    ro = -rng.random(n)
    tr = np.minimum(0.0, ro + rng.normal(0, 0.05, n))
    with open(path, "w") as f:
        for s, a, b in zip(range(n), ro.tolist(), tr.tolist()):
            f.write(json.dumps({"step": s, "sample_id": 0, "token_index": 0, "rollout_logprob": a, "train_logprob": b}) + "\n")


def run(args: list[str]) -> tuple[float, float, int]:
    """(seconds, peak RSS in MB, exit code) of one process, its output discarded."""
    t = time.perf_counter()
    p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, ru = os.wait4(p.pid, 0)
    took = time.perf_counter() - t
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode not in (0, 1, 3):
        raise SystemExit(f"{' '.join(args)}: exit {p.returncode}: {p.stderr.read().decode() if p.stderr else ''}")
    return took, ru.ru_maxrss / 1024, p.returncode


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, nargs="+", default=[1_000, 10_000, 100_000, 1_000_000])
    ap.add_argument("--json", action="store_true", help="also time --json")
    a = ap.parse_args()
    print(f"cpus {os.cpu_count()}, python {sys.version.split()[0]}")
    print("| steps | file MB | table: s | table: peak MB | exit |" + (" --json: s | --json: peak MB |" if a.json else ""))
    print("|---:|---:|---:|---:|---:|" + ("---:|---:|" if a.json else ""))
    with tempfile.TemporaryDirectory() as tmp:
        for n in a.steps:
            path = Path(tmp) / f"steps-{n}.jsonl"
            write_series(path, n)
            mb = path.stat().st_size / 1e6
            t, m, rc = run([str(VALIDATOR), "rl", "kl", str(path)])
            row = f"| {n:,} | {mb:.1f} | {t:.2f} | {m:.0f} | {rc} |"
            if a.json:
                tj, mj, _ = run([str(VALIDATOR), "rl", "kl", str(path), "--json"])
                row += f" {tj:.2f} | {mj:.0f} |"
            print(row, flush=True)
            path.unlink()


if __name__ == "__main__":
    main()
