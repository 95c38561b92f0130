"""numba, as the engine's compiled code imports it: after ``numba_cache.portable_target``, which must run before
numba is first imported (it chooses the CPU numba builds for, so that a cache built on one machine loads on
another). ``backends/cpu.py`` and ``resample_compiled.py`` import numba from here, never directly."""

from validator.numerics.numba_cache import portable_target

portable_target()

import numba  # noqa: E402
from numba import njit, prange, types  # noqa: E402
from numba.extending import overload  # noqa: E402

__all__ = ["njit", "numba", "overload", "prange", "types"]
