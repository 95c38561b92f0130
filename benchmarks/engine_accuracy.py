"""The engine's error against float64 NumPy over random pairs, per metric: the worst relative error seen.

    .venv/bin/python benchmarks/engine_accuracy.py --pairs 300

Pairs of every 8- and 16-bit float format and float32 (``--pairs`` of them, in turn), 1 to 60,000 elements,
magnitudes spread over 2**-8 .. 2**8 in a third of them, relative differences of 1e-3 .. 1, and the sign of a
tenth of the elements flipped in every seventh; each measured by ``metrics.compare_tensors`` on this machine's
backend, against the same metric in float64 NumPy over the values as stored. The stated accuracy
(docs/performance.md): 1e-6 relative for the norms, rel_l2 and mean_abs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from validator.numerics.metrics import compare_tensors

DTYPES = [torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.float8_e5m2, torch.float32]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=300)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    worst: dict[str, float] = {}
    for case in range(args.pairs):
        dt = DTYPES[case % len(DTYPES)]
        n = int(rng.integers(1, 60_000))
        a = rng.standard_normal(n) * (np.exp2(rng.uniform(-8, 8, n)) if case % 3 == 0 else 1.0)
        b = a * (1 + [1e-3, 1e-2, 0.1, 1.0][case % 4] * rng.standard_normal(n))
        if case % 7 == 0:
            b[: n // 10] = -a[: n // 10]
        if dt.itemsize == 1:  # inside float8_e4m3fn's range (past it, torch's conversion gives NaN or saturates)
            a, b = np.clip(a, -400, 400), np.clip(b, -400, 400)
        ta, tb = torch.from_numpy(a).to(dt), torch.from_numpy(b).to(dt)
        x, y = ta.double().numpy(), tb.double().numpy()  # the values as stored
        if not (np.isfinite(x).all() and np.isfinite(y).all()):
            raise SystemExit(f"pair {case} ({dt}): a value past the format's range")
        d = y - x
        ref = {
            "norm_a": np.sqrt(np.sum(x * x)),
            "norm_b": np.sqrt(np.sum(y * y)),
            "rel_l2": np.sqrt(np.sum(d * d)) / np.sqrt(np.sum(x * x)),
            "mean_abs": np.mean(np.abs(d)),
        }
        m = compare_tensors(ta.to(args.device), tb.to(args.device))
        for name, want in ref.items():
            if want:
                worst[name] = max(worst.get(name, 0.0), abs(getattr(m, name) - want) / want)
        if m.max_abs != np.max(np.abs(d)):
            print(f"pair {case} ({dt}, {n} elements): max_abs {m.max_abs!r}, float64 {np.max(np.abs(d))!r}")
    print(f"{args.pairs} pairs on {args.device}: worst relative error against float64 NumPy")
    for name, err in worst.items():
        print(f"  {name:9s} {err:.2e}")


if __name__ == "__main__":
    main()
