"""validator.numerics.numba_cache.portable_target: the CPU numba builds the engine for, so that a cache built on one
machine (a wheel's) loads on another. Each case runs in a fresh interpreter: the test process has imported numba."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import llvmlite.binding as ll
import pytest

from tests.paths import ROOT
from validator.numerics.numba_cache import LEVELS, levels

CHILD = r"""
import json, os, sys
if sys.argv[1] == "numba first":
    import numba
from validator.numerics import jit
from validator.numerics.numba_cache import portable_target
from numba.core.registry import cpu_target
magic = cpu_target.target_context.codegen().magic_tuple()  # what numba keys a cached kernel's CPU on
print(json.dumps({"cpu": jit.numba.config.CPU_NAME, "features": jit.numba.config.CPU_FEATURES,
                  "again": portable_target(), "env": os.environ.get("NUMBA_CPU_NAME"), "key": magic[1:]}))
"""


def _child(case: str, **env: str) -> dict[str, object]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_CPU")} | env
    run = subprocess.run([sys.executable, "-c", CHILD, case], cwd=ROOT, env=clean, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    out: dict[str, object] = json.loads(run.stdout.splitlines()[-1])
    return out


# the x86-64 psABI levels in the names Linux gives the CPU's flags (/proc/cpuinfo): an oracle apart from LLVM's
# feature map, which numba_cache.levels reads
_V3_FLAGS = "cx16 lahf_lm popcnt pni sse4_1 sse4_2 ssse3 avx avx2 bmi1 bmi2 f16c fma abm movbe xsave".split()
_LEVEL_FLAGS = {
    "x86-64-v4": [*_V3_FLAGS, "avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"],
    "x86-64-v3": _V3_FLAGS,
}


def _host_levels() -> list[str] | None:
    """The levels whose every flag the kernel lists for this host's CPU, the most capable first; None where no
    /proc/cpuinfo says (not Linux)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return []
    try:
        with open("/proc/cpuinfo") as f:
            flags = set(next(line for line in f if line.startswith("flags")).split(":", 1)[1].split())
    except (OSError, StopIteration):
        return None
    return [name for name, needs in _LEVEL_FLAGS.items() if set(needs) <= flags]


def _known_host_levels() -> list[str]:
    here = _host_levels()
    if here is None:
        pytest.skip("no /proc/cpuinfo: the host's CPU flags cannot be read apart from LLVM's map")
    return here


def test_levels_are_named_most_capable_first() -> None:
    assert list(LEVELS) == ["x86-64-v4", "x86-64-v3"]
    assert set(LEVELS["x86-64-v3"]) < set(LEVELS["x86-64-v4"])  # a v4 host runs v3 code
    assert {"avx2", "fma"} <= set(LEVELS["x86-64-v3"]) and "avx512f" in LEVELS["x86-64-v4"]
    assert len(LEVELS["x86-64-v3"]) == len(_LEVEL_FLAGS["x86-64-v3"])  # a flag for each of LLVM's features
    assert levels() == _known_host_levels()


def test_the_engine_builds_for_the_best_level_the_host_has() -> None:
    """numba keys the cache on the level's name with no feature of the host's: a cache built for the level on
    one host is the cache of every host of the level."""
    out = _child("plain")
    here = _known_host_levels()
    if here:
        assert out == {"cpu": here[0], "features": "", "again": here[0], "env": here[0], "key": [here[0], ""]}
    else:  # the host's own CPU, as numba chooses by default
        assert out | {"key": None} == {"cpu": None, "features": None, "again": None, "env": None, "key": None}
        assert out["key"][0] == ll.get_host_cpu_name()  # type: ignore[index]


def test_a_level_set_as_the_wheel_build_sets_it_is_kept() -> None:
    out = _child("plain", NUMBA_CPU_NAME="x86-64-v3", NUMBA_CPU_FEATURES="")
    assert out == {"cpu": "x86-64-v3", "features": "", "again": "x86-64-v3", "env": "x86-64-v3", "key": ["x86-64-v3", ""]}


def test_a_cpu_the_user_names_is_kept() -> None:
    out = _child("plain", NUMBA_CPU_NAME="generic")
    assert out == {"cpu": "generic", "features": "", "again": None, "env": "generic", "key": ["generic", ""]}


def test_numba_imported_first_keeps_the_host_cpu() -> None:
    """numba read its settings when it was imported: changing them later would key the cache on a CPU the
    code was not built for."""
    out = _child("numba first")
    assert out | {"key": None} == {"cpu": None, "features": None, "again": None, "env": None, "key": None}
    assert out["key"][0] == ll.get_host_cpu_name()  # type: ignore[index]


@pytest.mark.skipif(not _host_levels(), reason="the host CPU runs none of the levels, or its flags are not known")
def test_the_level_measures_what_the_host_cpu_measures() -> None:
    """The engine's pass built for the level and for the host give the same counts, maxima and ULP distances,
    and the same rel_l2 and cosine within the engine's stated accuracy (1e-6 relative): their float32 sums may
    add their vector lanes in another order (on the 2-core dev box rel_l2 differs from the 9th digit)."""
    code = r"""
import json, sys, torch
from validator.numerics.floors import measure_blocks
g = torch.Generator().manual_seed(1)
a = torch.randn(512, 1024, generator=g)
out = []
for noise in (1e-3, 5e-2):
    b = a * (1 + noise * torch.randn(a.shape, generator=g))
    b[3, 7] = float("nan")
    m, _ = measure_blocks(a.bfloat16(), b.bfloat16())
    out.append([m.rel_l2, m.cosine, m.max_abs, m.max_ulp, m.nonfinite_a, m.nonfinite_b, m.pass_ratio])
print(json.dumps(out))
"""
    runs = []
    for env in ({}, {"NUMBA_CPU_NAME": ll.get_host_cpu_name()}):
        clean = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_")} | env
        run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=clean, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr[-3000:]
        runs.append(json.loads(run.stdout.splitlines()[-1]))
    level, host = runs
    for x, y in zip(level, host):
        assert x[0] == pytest.approx(y[0], rel=1e-6) and x[1] == pytest.approx(y[1], rel=1e-6)
        assert x[2:] == y[2:]
