"""Compiling the CPU engine ahead of the first comparison of a large pair.

Pairs of at most ``backends.small.NUMPY_MAX`` elements, and bootstraps over few blocks, run in NumPy: nothing to
compile. Larger ones run numba's kernels, which compile for a set of argument types at their first call and keep
the machine code in numba's on-disk cache (``__pycache__`` beside the module, or ``NUMBA_CACHE_DIR``); a later
process loads it instead. On a machine whose cache is empty, the first comparison of a large pair of a format
waits for the compiler: about 5 s for bfloat16 on the 2-core dev box (``benchmarks/first_compare_bench.md``). :func:`warm_up` makes those first calls, for
every float format, so that no comparison waits: ``validator warm`` runs it (``scripts/setup`` does), and so does
the build of a wheel that can import numba and torch (``setup.py``, ``scripts/wheel``), whose cache then travels in
the wheel (``numba_cache.py``: where it loads). numba drops a kernel's cached code when its source file changes,
so after an install whose cache does not load (another Python or numba version, a CPU of a level the wheel's
build did not compile, a wheel built without it), run it as the user (and with the ``NUMBA_CACHE_DIR``) that will run the comparisons: a
server's, say, whose read routes never import torch and so cannot warm it themselves. Nothing it computes is kept.
"""

from __future__ import annotations

import time
from collections.abc import Callable

FORMATS = ("bfloat16", "float32", "float16", "float8_e4m3fn", "float8_e5m2", "float64")  # the usual first


def warm_up(report: Callable[[str], None] = lambda line: None) -> float:
    """Calls every numba kernel a comparison can reach, for each of :data:`FORMATS`: the engine's pass on the
    calling thread (a pair above ``small.NUMPY_MAX``) and on numba's threads (a pair above ``small.SMALL``), alone
    and against float32 and float64 on either side (a pair of two formats, read as stored), the batched pass,
    and the bootstrap's compiled resampling of many pairs, without a floor and with a paired, an independent and
    an empty one. ``report`` gets a line per format. Returns the seconds it took."""
    import torch

    from validator.numerics.backends.small import NUMPY_MAX, SMALL
    from validator.numerics.floors import BlockSums, bootstrap_intervals, measure_blocks, measure_blocks_many

    start = time.perf_counter()
    for name in FORMATS:
        began = time.perf_counter()
        dtype = getattr(torch, name)
        for n in (4 * NUMPY_MAX, SMALL + 4096):
            a = torch.linspace(-3.0, 3.0, n).reshape(-1, 64)
            b = a * 4  # two binades apart: wide ULP distances
            a[0, 0] = float("nan")  # a block with NaN: the float64 path
            _, sums = measure_blocks(a.to(dtype), b.to(dtype))
            for wide in (torch.float32, torch.float64):
                if wide != dtype:
                    measure_blocks(a.to(dtype), b.to(wide))
                    measure_blocks(a.to(wide), b.to(dtype))
        rows = 2 * NUMPY_MAX // 64  # pairs above NUMPY_MAX, two in a batch on the calling thread
        measure_blocks_many(
            [(a[:rows].to(dtype), b[:rows].to(dtype)), (a[rows : 2 * rows].to(dtype), b[rows : 2 * rows].to(dtype))]
        )
        few, none = BlockSums(sums.d2[:3], sums.a2[:3], 3, 0, 0, 0), BlockSums(sums.d2[:0], sums.a2[:0], 0, 0, 0, 0)
        bootstrap_intervals([(sums, None), (sums, sums), (sums, few), (sums, none)] * 100)  # many: the compiled loops
        report(f"{name}: {time.perf_counter() - began:.1f} s")
    return time.perf_counter() - start
