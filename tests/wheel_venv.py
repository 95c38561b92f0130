"""A fresh virtualenv with this checkout's wheel installed, as a user's ``pip install`` would leave it
(tests/test_wheel.py, benchmarks/first_compare_bench.py), the wheel built as ``scripts/wheel`` builds it: with
the CPU engine's kernels compiled into it (setup.py). Nothing is downloaded: the wheel is built without
its dependencies and the new environment reads this one's site-packages for them (a ``.pth`` file), after the
install, so that pip does not see this environment's editable validator."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("validator", "probes", "dashboards", "migrations", "pyproject.toml", "setup.py", "README.md")


def _run(*cmd: str | Path, cwd: Path) -> str:
    # (the wheel's build compiles the CPU engine for each CPU level the host runs: about 3 min on the 2-core box)
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=1200)
    if proc.returncode != 0:
        raise RuntimeError(
            f"{' '.join(map(str, cmd))}: exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    return proc.stdout


def install_wheel(work: Path) -> Path:
    """Builds the wheel under ``work``, installs it into ``work/venv``; returns that venv's bin/ folder."""
    src = work / "src"
    src.mkdir(parents=True, exist_ok=True)
    for name in SOURCES:
        p = ROOT / name
        if p.is_dir():
            shutil.copytree(p, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(p, src / name)
    pip = (sys.executable, "-m", "pip", "--disable-pip-version-check")
    _run(*pip, "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index", "-w", work / "dist", src, cwd=work)
    (wheel,) = (work / "dist").glob("validator-*.whl")
    venv = work / "venv"
    _run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=work)
    python = venv / "bin" / "python"
    _run(*pip, "--python", python, "install", "-q", "--no-deps", "--no-index", wheel, cwd=work)
    purelib = _run(python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))", cwd=work).strip()
    Path(purelib, "_outer_site_packages.pth").write_text(sysconfig.get_path("purelib") + "\n")
    return venv / "bin"
