"""The package list, which pyproject.toml cannot express: the packages under validator/ and probes/, plus the
top-level dashboards/ and migrations/ folders mapped into the package as ``validator._data.dashboards`` and
``validator._data.migrations`` (see validator/_data), each subfolder a package of its own so that setuptools
ships its files (package-data in pyproject.toml); and the CPU engine's kernels, compiled into a wheel where
its build can import numba and torch (:class:`BuildPy`). Everything else is in pyproject.toml."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import find_namespace_packages, find_packages, setup
from setuptools.command.build_py import build_py

DATA = {"validator._data.dashboards": "dashboards", "validator._data.migrations": "migrations"}


def folder(package: str, path: str) -> list[str]:
    """``package`` and one package per subfolder of ``path``."""
    return [package, *(f"{package}.{sub}" for sub in find_namespace_packages(where=path, exclude=["*__pycache__*"]))]


# run in the built tree: 3 when it cannot import what the engine compiles with
_WARM = """
import importlib.util, sys
missing = [m for m in ("numba", "numpy", "torch") if importlib.util.find_spec(m) is None]  # (numba not imported)
if missing:
    print(f"  not compiled: this build cannot import {', '.join(missing)}", flush=True)
    sys.exit(3)
import validator
from validator.numerics.numba_cache import portable_target
from validator.numerics.warm import warm_up
assert validator.__file__.startswith(sys.argv[1]), validator.__file__  # the built tree's, not an installed one
print(f"  for {portable_target() or 'this host alone'}", flush=True)
warm_up(lambda line: print(f"  {line}", flush=True))
"""


class BuildPy(build_py):
    """``build_py``, then ``validator warm`` run in the built tree, so that a wheel carries numba's cache of the
    CPU engine's kernels beside their modules (``__pycache__/*.nbi``, ``*.nbc``) and its first comparison after
    ``pip install`` compiles nothing where the cache loads (validator/numerics/numba_cache.py: the same Python
    and numba version, a CPU level the build compiled). Once for each CPU level the build host runs (a host that
    runs x86-64-v4 runs x86-64-v3 too); on another host, for that host alone. Only where the build can import
    numba and torch (``pip wheel --no-build-isolation``, as ``scripts/wheel`` builds it); an isolated build, which
    has neither, makes a wheel without the cache, whose kernels compile at their first use. Not for editable
    installs."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False) or self.dry_run:
            return
        root = os.path.abspath(self.build_lib)
        for stale in Path(root).rglob("__pycache__"):  # an earlier build's (setuptools reuses build/lib)
            shutil.rmtree(stale)
        env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_")}  # numba's cache beside the modules
        paths = [root, *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]  # (pip's isolation: kept)
        env |= {"PYTHONPATH": os.pathsep.join(paths), "PYTHONDONTWRITEBYTECODE": "1"}  # no .pyc in the wheel
        ask = "from validator.numerics.numba_cache import levels; print(*levels())"
        found = subprocess.run([sys.executable, "-c", ask], env=env, cwd=root, capture_output=True, text=True)
        levels = found.stdout.split() if found.returncode == 0 else []
        print("compiling the CPU engine's kernels into the build (validator warm)", flush=True)
        for level in levels or [None]:
            at = env if level is None else env | {"NUMBA_CPU_NAME": level, "NUMBA_CPU_FEATURES": ""}
            done = subprocess.run([sys.executable, "-c", _WARM, root], env=at, cwd=root)
            if done.returncode == 3:
                return
            if done.returncode != 0:
                raise SystemExit(f"validator warm failed in the built tree ({done.returncode})")


setup(
    cmdclass={"build_py": BuildPy},
    packages=[
        *find_packages(include=["validator", "validator.*", "probes", "probes.*"]),
        *(p for package, path in DATA.items() for p in folder(package, path)),
    ],
    package_dir=DATA,
)
