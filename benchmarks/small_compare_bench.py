"""Whole-process time of ``validator compare`` on two small .safetensors files and two small bundles against
``validator runs``, side by side in one run (issue target: the compare within 2x of ``validator runs``).

    python benchmarks/small_compare_bench.py --dir /tmp/small-compare --reps 7

Writes two bf16 64 x 64 files into ``--dir`` (b = bf16(a * (1 + 1e-2 N(0,1)))) and two bundles of 32 bf16
tensors of 16 x 256 (8 layers of 4 tensors, the same noise), then runs, in turn, ``--reps`` times each:
``validator compare A B``, ``validator compare A B --json``, ``validator compare`` of the bundles and
``validator runs`` (the store of ``VALIDATOR_HOME``, as set). Prints each command's median wall and CPU (user + system) seconds, from the
operating system's accounting of the finished child, and the ratios of the medians to ``validator runs``'. Then
the slowest imports of one ``validator compare`` (``python -X importtime``, cumulative, top level only).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path


def make_files(folder: Path) -> tuple[Path, Path]:
    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(0)
    a = torch.randn(64, 64, generator=g).to(torch.bfloat16)
    b = (a.float() * (1 + 1e-2 * torch.randn(64, 64, generator=g))).to(torch.bfloat16)
    folder.mkdir(parents=True, exist_ok=True)
    paths = folder / "a.safetensors", folder / "b.safetensors"
    save_file({"x": a}, str(paths[0]))
    save_file({"x": b}, str(paths[1]))
    return paths


def make_bundles(folder: Path) -> tuple[Path, Path]:
    import torch

    from probes import BundleWriter

    paths = folder / "bundle-a", folder / "bundle-b"
    for path, noise in zip(paths, (0.0, 1e-2)):
        g = torch.Generator().manual_seed(0)
        if path.exists():
            import shutil

            shutil.rmtree(path)
        with BundleWriter(path, run_name=path.name, part="tp0") as w:
            for layer in range(8):
                for name in ("q", "k", "v", "out"):
                    x = torch.randn(16, 256, generator=g)
                    x = x * (1 + noise * torch.randn(16, 256, generator=torch.Generator().manual_seed(layer)))
                    w.add(name, x.to(torch.bfloat16), step=0, layer=layer)
    return paths


def timed(cmd: list[str]) -> tuple[float, float]:
    """(wall, user + system CPU) seconds of one run of ``cmd``."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{cmd} exited {proc.returncode}")
    return wall, usage.ru_utime + usage.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, required=True, help="where the two files are written")
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    a, b = make_files(args.dir)
    ba, bb = make_bundles(args.dir)
    validator = str(Path(sys.executable).with_name("validator"))
    commands = {
        "validator compare": [validator, "compare", str(a), str(b)],
        "validator compare --json": [validator, "compare", str(a), str(b), "--json"],
        "validator compare (bundles, 32 tensors)": [validator, "compare", str(ba), str(bb)],
        "validator runs": [validator, "runs"],
    }
    for cmd in commands.values():  # warm the page cache
        timed(cmd)
    got: dict[str, list[tuple[float, float]]] = {k: [] for k in commands}
    for _ in range(args.reps):
        for label, cmd in commands.items():
            got[label].append(timed(cmd))
    base_wall = statistics.median(w for w, _ in got["validator runs"])
    base_cpu = statistics.median(c for _, c in got["validator runs"])
    for label, times in got.items():
        wall, cpu = statistics.median(w for w, _ in times), statistics.median(c for _, c in times)
        print(f"{label}: median wall {wall:.2f} s, cpu {cpu:.2f} s; / validator runs: wall {wall / base_wall:.2f}x, "
              f"cpu {cpu / base_cpu:.2f}x")  # fmt: skip
    trace = subprocess.run([sys.executable, "-X", "importtime", "-m", "validator.app.cli", "compare", str(a), str(b)],
                           capture_output=True, text=True).stderr  # fmt: skip
    top = []
    for line in trace.splitlines():
        parts = line.split("|")
        if len(parts) == 3 and parts[2].startswith(" ") and not parts[2].startswith("  ") and parts[1].strip().isdigit():
            top.append((int(parts[1]), parts[2].strip()))
    print("slowest top-level imports of one validator compare (cumulative):")
    for us, name in sorted(top, reverse=True)[:8]:
        print(f"  {name}: {us / 1e6:.2f} s")


if __name__ == "__main__":
    main()
