"""numba's on-disk cache: guarded across processes, and loadable on another machine.

numba numbers a new entry of a kernel's on-disk cache from the index it has just read, so two processes that
compile two signatures of one kernel at the same moment (two dtypes, say) can both write the same file, and
leave one signature's index entry pointing at the other's code. :func:`first_call` holds an exclusive lock on
one file in the temporary directory around the first call of a kernel for a set of argument types in this
process (the call that loads it from the cache, or compiles and saves it); later calls take no lock.

numba keys a cached kernel on the Python and numba versions, a hash of the module's source and the CPU the code
was built for: by default the host's own model and features, so a cache built on one machine loads on no other.
:func:`portable_target` (called before numba is imported: ``jit.py``) has numba build for a named level instead,
the first of :data:`LEVELS` whose features the host has: ``x86-64-v4`` (AVX-512: Intel server CPUs since
Skylake, AMD since Zen 4) or ``x86-64-v3`` (AVX2, FMA: Intel since Haswell, AMD since Zen). A cache built for a
level on any machine then loads on every other that runs at that level, and the wheel can carry one for each
level its build host runs (``setup.py``: a wheel built where numba and torch import compiles the kernels into it),
so that the first comparison after ``pip install`` waits for no compiler. The kernels' results then come from the
same machine code on all the hosts of a level (on the 2-core dev box the two levels gave the same bits, and the
host's own build a rel_l2 1e-8 apart: ``benchmarks/cpu_level_ab.py``). It sets numba's ``NUMBA_CPU_NAME`` and
``NUMBA_CPU_FEATURES`` for the whole process, so only before numba is imported and only where neither is set;
elsewhere numba builds for the host. numba reads the wheel's cache from ``__pycache__`` beside the installed
modules where that folder is writable (a virtualenv's) and ``NUMBA_CACHE_DIR`` is unset; elsewhere it compiles
into a cache of the user's (``validator warm``).
"""

from __future__ import annotations

import contextlib
import os
import platform
import sys
import tempfile
from collections.abc import Hashable, Iterator

try:
    import fcntl
except ImportError:  # not POSIX: no lock
    fcntl = None  # type: ignore[assignment]

# the CPU levels numba builds for, the most capable first, with what each asks of a CPU beyond x86-64 (as LLVM
# names the features)
_V3 = "cx16 sahf popcnt sse3 sse4.1 sse4.2 ssse3 avx avx2 bmi bmi2 f16c fma lzcnt movbe xsave".split()
LEVELS: dict[str, list[str]] = {"x86-64-v4": [*_V3, "avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"]}
LEVELS["x86-64-v3"] = _V3
_DONE: set[Hashable] = set()
_PATH = os.path.join(tempfile.gettempdir(), "validator-numba-cache.lock")


@contextlib.contextmanager
def first_call(key: Hashable) -> Iterator[None]:
    """Around a call of a kernel; ``key``: the kernel and its argument types. The first time in this
    process, the call runs under the lock."""
    if key in _DONE or fcntl is None:
        yield
        return
    fd = os.open(_PATH, os.O_RDONLY | os.O_CREAT, 0o666)  # read-only: any user can lock a file another made
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
        _DONE.add(key)
    finally:
        os.close(fd)  # releases the lock


def levels() -> list[str]:
    """The :data:`LEVELS` this host runs, the most capable first (none but on x86-64)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return []
    import llvmlite.binding as ll  # numba's own LLVM binding (imports no numba)

    have = ll.get_host_cpu_features()
    return [name for name, needs in LEVELS.items() if all(have.get(feature, False) for feature in needs)]


def portable_target() -> str | None:
    """Has numba build for the first of :func:`levels` (see the module), where numba is not imported yet and
    neither variable is set. Returns the level numba builds for (one this function chose, or one set in the two
    variables as it sets them: a wheel's build compiles each level so), else None (numba builds for the host)."""
    name = os.environ.get("NUMBA_CPU_NAME")
    if name in LEVELS and os.environ.get("NUMBA_CPU_FEATURES") == "":
        return name
    if "numba" in sys.modules or name is not None or "NUMBA_CPU_FEATURES" in os.environ:
        return None
    here = levels()
    if not here:
        return None
    os.environ["NUMBA_CPU_NAME"], os.environ["NUMBA_CPU_FEATURES"] = here[0], ""
    return here[0]
