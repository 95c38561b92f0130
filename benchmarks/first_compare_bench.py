"""The first comparisons after ``pip install``: whole-process times in a fresh virtualenv, for every pair class.

    python benchmarks/first_compare_bench.py --dir /tmp/first-compare

Builds the wheel from a copy of the sources (offline, as tests/test_wheel.py does: ``setup.py`` compiles the
CPU engine's kernels into it) and installs it, not editable, into a fresh virtualenv whose dependencies come from
this environment's site-packages (a .pth line). Then, outside the checkout, one after another, each a whole
process of the venv's ``validator`` console script:

1. ``validator compare`` of two small .safetensors files (bf16 64 x 64, drift 1e-2: the NumPy pass,
   ``backends/small.py``), the first time and again;
2. ``validator runs`` (an empty store): the command the small compare is held against;
3. ``validator compare`` of two 1024 x 1024 files of each pair class of ``engine_bench.py`` (near 1e-3, drift
   1e-2 and 5e-2, nonfinite, bf16 vs fp32, the projection probe's bf16 vs float64: numba's kernels, loaded from
   the wheel's cache), each the first time, then drift 1e-2 again;
4. the same first comparisons with numba's cache pointed at an empty folder of each class's own
   (``NUMBA_CACHE_DIR``): what a first comparison costs where the wheel's cache does not load (another Python,
   numba version or CPU level; a wheel built without it).

Prints each time and how many compiled entries the installed package's cache and the empty folders hold after
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

from benchmarks.engine_bench import CLASSES  # noqa: E402  (the pair classes every engine benchmark measures)
from tests.wheel_venv import install_wheel  # noqa: E402  (the venv a user's pip install leaves)


def run(*cmd: str | Path, cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True)
    if done.returncode not in (0, 1):  # 1: a comparison's verdict is FAIL
        raise SystemExit(f"{' '.join(map(str, cmd))}: exit {done.returncode}\n{done.stderr[-2000:]}")
    return done.stdout


def save_pair(folder: Path, name: str, rows: int, cols: int) -> tuple[Path, Path]:
    """Two .safetensors files of ``engine_bench.CLASSES[name]``, rows x cols."""
    from safetensors.torch import save_file

    a, b = CLASSES[name](rows * cols, "cpu")
    stem = f"{name.replace(' ', '-')}-{rows}x{cols}"
    paths = folder / f"a-{stem}.safetensors", folder / f"b-{stem}.safetensors"
    save_file({"x": a.reshape(rows, cols).contiguous()}, str(paths[0]))
    save_file({"x": b.reshape(rows, cols).contiguous()}, str(paths[1]))
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
    small = save_pair(work, "drift 1e-2", 64, 64)
    large = {name: save_pair(work, name, 1024, 1024) for name in CLASSES}
    (package,) = (work / "venv").glob("lib/python*/site-packages/validator")
    empty = work / "numba-cache"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VALIDATOR_", "NUMBA_")) and k != "PYTHONPATH"}
    env |= {"VALIDATOR_HOME": str(work / "home")}
    steps = [
        ("compare 64x64 bf16 files, first", ["compare", *small], env),
        ("compare 64x64 bf16 files, again", ["compare", *small], env),
        ("runs", ["runs"], env),
        *((f"compare 1024x1024 {name}, first", ["compare", *pair], env) for name, pair in large.items()),
        ("compare 1024x1024 drift 1e-2, again", ["compare", *large["drift 1e-2"]], env),
        *(
            (f"compare 1024x1024 {name}, cache elsewhere, first", ["compare", *pair],
             env | {"NUMBA_CACHE_DIR": str(empty / str(i))})
            for i, (name, pair) in enumerate(large.items())
        ),
    ]  # fmt: skip
    validator = bin_dir / "validator"
    print(f"compiled entries in the wheel: {sum(1 for _ in package.rglob('*.nbc'))}")
    for label, argv, step_env in steps:
        began = time.perf_counter()
        run(validator, *argv, cwd=work, env=step_env)
        took = time.perf_counter() - began
        installed, other = sum(1 for _ in package.rglob("*.nbc")), sum(1 for _ in empty.rglob("*.nbc"))
        print(f"{label}: {took:.2f} s (compiled entries: installed package {installed}, empty folders {other})")

if __name__ == "__main__":
    main()
