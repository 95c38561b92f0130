"""The first comparisons after ``pip install``: whole-process times in a fresh virtualenv.

    python benchmarks/first_compare_bench.py --dir /tmp/first-compare

Builds the wheel from a copy of the sources (offline, as tests/test_wheel.py does: ``setup.py`` compiles the
CPU engine's kernels into it) and installs it, not editable, into a fresh virtualenv whose dependencies come from
this environment's site-packages (a .pth line). Then, outside the checkout, one after another, each a whole
process of the venv's ``validator`` console script:

1. ``validator compare`` of two small .safetensors files (bf16 64 x 64: the NumPy pass, ``backends/small.py``),
   the first time and again;
2. ``validator runs`` (an empty store): the command the small compare is held against;
3. ``validator compare`` of two larger files (bf16 1024 x 1024: numba's kernels, loaded from the wheel's cache),
   the first time and again;
4. the same with numba's cache pointed at an empty folder (``NUMBA_CACHE_DIR``): what the first comparison costs
   where the wheel's cache does not load (another Python, numba version or CPU level; a wheel built without it),
   the first time and again.

Prints each time and how many compiled entries the installed package's cache and the empty folder hold after
each step (a step that compiled adds some).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.wheel_venv import install_wheel  # noqa: E402  (the venv a user's pip install leaves)


def run(*cmd: str | Path, cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True)
    if done.returncode not in (0, 1):  # 1: a comparison's verdict is FAIL
        raise SystemExit(f"{' '.join(map(str, cmd))}: exit {done.returncode}\n{done.stderr[-2000:]}")
    return done.stdout


def make_pair(folder: Path, rows: int, cols: int) -> tuple[Path, Path]:
    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(0)
    a = torch.randn(rows, cols, generator=g).to(torch.bfloat16)
    b = (a.float() * (1 + 1e-2 * torch.randn(rows, cols, generator=g))).to(torch.bfloat16)
    paths = folder / f"a-{rows}x{cols}.safetensors", folder / f"b-{rows}x{cols}.safetensors"
    save_file({"x": a}, str(paths[0]))
    save_file({"x": b}, str(paths[1]))
    return paths


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, required=True, help="an empty or missing folder to work in (removed first)")
    args = ap.parse_args()
    work = args.dir.resolve()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    t0 = time.perf_counter()
    bin_dir = install_wheel(work)
    print(f"wheel built and installed in a fresh virtualenv: {time.perf_counter() - t0:.1f} s")
    small, large = make_pair(work, 64, 64), make_pair(work, 1024, 1024)
    (package,) = (work / "venv").glob("lib/python*/site-packages/validator")
    empty = work / "numba-cache"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VALIDATOR_", "NUMBA_")) and k != "PYTHONPATH"}
    env |= {"VALIDATOR_HOME": str(work / "home")}
    elsewhere = env | {"NUMBA_CACHE_DIR": str(empty)}
    validator = bin_dir / "validator"
    steps = [
        ("compare 64x64 bf16 files, first", ["compare", *small], env),
        ("compare 64x64 bf16 files, again", ["compare", *small], env),
        ("runs", ["runs"], env),
        ("compare 1024x1024 bf16 files, first", ["compare", *large], env),
        ("compare 1024x1024 bf16 files, again", ["compare", *large], env),
        ("compare 1024x1024 bf16 files, cache elsewhere, first", ["compare", *large], elsewhere),
        ("compare 1024x1024 bf16 files, cache elsewhere, again", ["compare", *large], elsewhere),
    ]
    print(f"compiled entries in the wheel: {sum(1 for _ in package.rglob('*.nbc'))}")
    for label, argv, step_env in steps:
        began = time.perf_counter()
        run(validator, *argv, cwd=work, env=step_env)
        took = time.perf_counter() - began
        installed, other = sum(1 for _ in package.rglob("*.nbc")), sum(1 for _ in empty.rglob("*.nbc"))
        print(f"{label}: {took:.2f} s (compiled entries: installed package {installed}, empty folder {other})")


if __name__ == "__main__":
    main()
