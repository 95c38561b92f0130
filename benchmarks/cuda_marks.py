"""What the GPU pass leaves to its second kernel on each class of pair, worked out on the CPU.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/cuda_marks.py [--sizes 8192x7168,1gib]

``validator/numerics/backends/cuda.py``'s ``_fix_kernel`` reads a row (one program's elements) again in float64
where the pass marked it. On a pair without NaN/Inf and with sums in float32's range, two rules mark rows:

- the tolerance test: an element whose float32 ``|d|`` passes one of the band's two float32 tolerances
  (``common.tolerances``: atol and rtol moved ``EPS`` down and up) and fails the other; its row's count is redone;
- the largest ``|d|``: a row whose largest ULP distance exceeds ``common.exact_ulp`` may hold an inexact float32
  ``|d|``; where its largest is the pair's, the row is redone whole.

For each class of ``engine_bench.CLASSES`` (but ``projection``, which needs the probe) at each size, this builds the
pair on the CPU (the same recipe as on the GPU, from the CPU's random stream), cuts it into the pass's rows
(``cuda._plan`` with the edges ``floors.measure_blocks`` gives) and prints the elements inside the band, the rows
they mark, and the largest ULP distance against ``exact_ulp``. It runs no kernel: it applies the two rules with
float32 arithmetic in torch, which rounds the tolerance's product and sum apart where the GPU fuses them, and
draws other random values than the GPU: the counts are the class's, not the GPU run's to the element.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.engine_bench import CLASSES  # noqa: E402
from validator.numerics import floors  # noqa: E402
from validator.numerics.backends import cuda  # noqa: E402
from validator.numerics.backends.common import exact_ulp, tolerances, ulp_spec  # noqa: E402
from validator.numerics.backends.small import ordinals, stored  # noqa: E402

SIZES = {"8192x7168": (8192, 7168), "1gib": (1 << 29,)}
PIECE = 1 << 24


def row_edges(shape: tuple[int, ...]) -> np.ndarray:
    """The first element of each of the pass's rows, and the end, for a pair of ``shape`` read whole."""
    n = math.prod(shape)
    plan = cuda._plan((n,), tuple(floors._edges(shape)), torch.device("cpu"))
    seg = plan.seg_edges[0].tolist()
    starts = [
        lo + (hi - lo) * i // plan.K // plan.align * plan.align for lo, hi in zip(seg, seg[1:]) for i in range(plan.K)
    ]
    return np.array([*starts, n])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default=",".join(SIZES), help=f"comma-separated, of {', '.join(SIZES)}")
    args = ap.parse_args()
    (_, _, a_lo, r_lo, a_hi, r_hi), _ = tolerances(1e-5, 1e-3)  # metrics.measure's defaults
    a_lo, r_lo, a_hi, r_hi = (float(np.float32(v)) for v in (a_lo, r_lo, a_hi, r_hi))  # the pass's float32 values
    for size in args.sizes.split(","):
        shape = SIZES[size]
        edges = row_edges(shape)
        for name, make in CLASSES.items():
            if name == "projection":
                continue
            a, b = make(math.prod(shape), "cpu")
            band, top = [], 0
            for at in range(0, a.numel(), PIECE):  # in pieces: a 1 GiB pair's temporaries would not fit
                pa, pb = a[at : at + PIECE], b[at : at + PIECE]
                xa, xb = pa.float(), pb.float()
                fine = xa.isfinite() & xb.isfinite()
                d, aa = (xb - xa).abs(), xa.abs()
                lo = d <= torch.clamp(aa * r_lo + a_lo, min=0)
                hi = d <= aa * r_hi + a_hi
                band.append(at + np.flatnonzero((fine & (lo != hi)).numpy()))
                if ulp_spec(a.dtype, b.dtype) is not None:
                    bits = [stored(t)[0] for t in (pa, pb)]  # each format's bits, as the engine reads them
                    top = max(top, int(np.abs(ordinals(bits[0]) - ordinals(bits[1]))[fine.numpy()].max()))
            found = np.concatenate(band)
            rows = len(np.unique(np.searchsorted(edges, found, side="right")))
            line = f"{size:>9} {name:<13} in the band {len(found):>6} elements, {rows:>4} of {len(edges) - 1} rows"
            if ulp_spec(a.dtype, b.dtype) is not None:
                line += f"; largest ULP distance {top} (exact_ulp {exact_ulp(a.dtype)})"
            print(line, flush=True)


if __name__ == "__main__":
    main()
