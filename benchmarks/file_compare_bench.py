"""Whole-process time of ``validator compare`` on two 512 MiB bf16 .safetensors files against a plain NumPy
float64 script doing the same (``numpy_compare.py``), side by side in one run.

    python benchmarks/file_compare_bench.py --dir /tmp/fc --reps 3 --noise 1e-2
    python benchmarks/file_compare_bench.py --dir /tmp/fc --reps 3 --noise 1e-2 --masked 0.3   # masked logits

Writes the files into ``--dir`` once (a ~ N(0,1), b = bf16(a * (1 + NOISE N(0,1))), 32768 x 8192; one b per
noise; with ``--masked F``, -inf on both sides at the same fraction F of the positions: engine_bench's masked
class), then runs ``validator compare A B``, ``validator compare A B --json`` and the NumPy script in turn,
``--reps`` times each, and prints every time, the medians and the ratios. ``validator compare`` exits 1 where
the drift fails the default policy; the time is the time either way.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def make_files(folder: Path, rows: int, cols: int, noise: float, masked: float) -> tuple[Path, Path]:
    tag = f"-masked{masked:g}" if masked else ""
    a_path, b_path = folder / f"a-{rows}x{cols}{tag}.safetensors", folder / f"b-{rows}x{cols}-{noise:g}{tag}.safetensors"
    if a_path.exists() and b_path.exists():
        return a_path, b_path
    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(0)
    a = torch.randn(rows, cols, generator=g).to(torch.bfloat16)
    b = (a.float() * (1 + noise * torch.randn(rows, cols, generator=g))).to(torch.bfloat16)
    if masked:
        at = torch.rand(rows, cols, generator=g) < masked
        a[at], b[at] = float("-inf"), float("-inf")
    folder.mkdir(parents=True, exist_ok=True)
    save_file({"x": a}, str(a_path))
    save_file({"x": b}, str(b_path))
    return a_path, b_path


def timed(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL)
    if done.returncode not in (0, 1):  # 1: the verdict is FAIL
        raise SystemExit(f"{cmd} exited {done.returncode}")
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, required=True, help="where the two files are written (once)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rows", type=int, default=32768)
    ap.add_argument("--cols", type=int, default=8192)
    ap.add_argument("--noise", type=float, default=1e-2, help="relative noise of b (1e-2: a drifting port)")
    ap.add_argument("--masked", type=float, default=0.0, help="fraction of positions -inf on both sides")
    args = ap.parse_args()
    a, b = make_files(args.dir, args.rows, args.cols, args.noise, args.masked)
    validator = str(Path(sys.executable).with_name("validator"))  # the console script, as a user runs it
    commands = {
        "validator compare": [validator, "compare", str(a), str(b)],
        "validator compare --json": [validator, "compare", str(a), str(b), "--json"],
        "numpy float64 script": [sys.executable, str(HERE / "numpy_compare.py"), str(a), str(b)],
    }
    times: dict[str, list[float]] = {k: [] for k in commands}
    for _ in range(args.reps):
        for name, cmd in commands.items():
            times[name].append(timed(cmd))
            print(f"{name}: {times[name][-1]:.2f} s", flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    for name, v in times.items():
        print(f"{name}: median {med[name]:.2f} s of {', '.join(f'{x:.2f}' for x in v)}")
    for name in ("validator compare", "validator compare --json"):
        print(f"ratio (numpy / {name}): {med['numpy float64 script'] / med[name]:.1f}x")


if __name__ == "__main__":
    main()
