"""validator.numerics.warm: the first calls of every CPU kernel, made ahead of the first comparison."""

from __future__ import annotations

import numpy as np

from validator.numerics.backends import cpu
from validator.numerics.warm import FORMATS, warm_up


def test_warm_up_compiles_every_kernel_for_every_format() -> None:
    lines: list[str] = []
    warm_up(lines.append)
    assert [line.split(":")[0] for line in lines] == list(FORMATS)
    # the pass and the refining pass, on the calling thread and on numba's threads, for the bits of each
    # format (float8_e5m2 shares float8_e4m3fn's uint8; float64 has no refining pass: no ULP metrics)
    bits = {np.dtype(t).name for t in set(cpu._BITS.values())}
    for kernel in (cpu._pass, cpu._pass_serial):
        assert bits <= {sig[0].dtype.name for sig in kernel.signatures}, kernel
    for kernel in (cpu._refine, cpu._refine_serial):
        assert bits - {"float64"} <= {sig[0].dtype.name for sig in kernel.signatures}, kernel
