"""validator.numerics.warm: the first calls of every CPU kernel, made ahead of the first comparison."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.paths import ROOT

# In a fresh interpreter (a test process has compiled kernels of its own before): warm_up, then every kind of
# comparison the CPU engine serves; no numba kernel may get a signature it did not have after warm_up.
CHILD = r"""
import json
import numba
import torch
from validator.numerics import ranges, resample_compiled
from validator.numerics.backends import cpu, small
from validator.numerics.floors import BlockSums, bootstrap_intervals, measure_blocks, measure_blocks_many, rounding_sums
from validator.numerics.warm import FORMATS, warm_up


def signatures():
    return {f"{m.__name__}.{k}": {str(s) for s in v.signatures} for m in (cpu, resample_compiled)
            for k, v in vars(m).items() if isinstance(v, numba.core.dispatcher.Dispatcher)}


lines = []
warm_up(lines.append)
before = signatures()
g = torch.Generator().manual_seed(0)
for name in FORMATS:
    dtype = getattr(torch, name)
    for n in (1000, 20000, small.SMALL + 5000):  # the NumPy pass, numba on the calling thread, on its threads
        a = torch.randn(n // 50, 50, generator=g)
        b = a * (1 + 0.3 * torch.randn(a.shape, generator=g))
        b[0, :3] = torch.tensor([float("nan"), float("inf"), 1e30])
        x, y = a.to(dtype), b.to(dtype)
        _, sums = measure_blocks(x, y)
        measure_blocks(x.t(), y.t())  # not contiguous
        for wide in (torch.float32, torch.float64):  # two formats, either side
            if wide != dtype:
                measure_blocks(x, y.to(wide))
                measure_blocks(x.to(wide), y)
        k = next(k for k in range(1, x.numel() + 1) if ranges.is_cut(x.shape, k))  # the first range (Ray's)
        ranges.measure_range(x.reshape(-1)[:k], y.reshape(-1)[:k], x.shape, 0)
        bootstrap_intervals([(sums, None), (sums, sums), (sums, BlockSums(sums.d2[:3], sums.a2[:3], 3, 0, 0, 0)),
                             (sums, BlockSums(sums.d2[:0], sums.a2[:0], 0, 0, 0, 0))] * 100)  # many: compiled
    rounding_sums(a, name) if name != "float64" else None
    pairs = [(a[i : i + 200].to(dtype), b[i : i + 200].to(dtype)) for i in range(0, 2000, 200)]  # above NUMPY_MAX
    measure_blocks_many(pairs[:3])  # a small batch, on the calling thread
    measure_blocks_many(pairs * 60)  # a batch above small.SMALL, on numba's threads
after = signatures()
print(json.dumps({"lines": lines, "formats": list(FORMATS),
                  "new": {k: sorted(after[k] - before.get(k, set())) for k in after if after[k] - before.get(k, set())}}))
"""


def test_warm_up_leaves_nothing_to_compile() -> None:
    run = subprocess.run([sys.executable, "-c", CHILD], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.splitlines()[-1])
    assert [line.split(":")[0] for line in out["lines"]] == out["formats"]
    assert out["new"] == {}, out["new"]
