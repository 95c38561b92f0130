"""Every call, not just the median: the CPU path's calls one by one, cold and warm.

    python benchmarks/cpu_calls.py [--elems N] [--reps 15] [--json out.json]

For a bf16 and an fp32 pair on all threads: each call to ``compare_tensors`` timed with its sample
pass and main pass, first ``--reps`` calls from memory (a 4x-L3 array written by NumPy before each),
then ``--reps`` back to back. A median hides a bimodal machine; this shows it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from benchmarks.compare_bench import llc_bytes, make_pair  # noqa: E402
from benchmarks.cpu_roofline import phases  # noqa: E402
from validator.metrics import compare_tensors  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--elems", type=int, default=1 << 26)
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    big = np.ones(max(1 << 27, llc_bytes()), dtype=np.float32)
    out: dict[str, Any] = {}
    for dtype in (torch.bfloat16, torch.float32):
        a, b = make_pair(args.elems, dtype)
        nbytes = 2 * a.numel() * a.element_size()
        compare_tensors(a, b)
        name = str(dtype).removeprefix("torch.")
        for mode in ("cold", "warm"):
            calls = []
            with phases() as ms:
                for _ in range(args.reps):
                    if mode == "cold":
                        np.add(big, 1.0, out=big)
                    t = time.perf_counter()
                    compare_tensors(a, b)
                    calls.append(1e3 * (time.perf_counter() - t))
            rows = list(zip(calls, ms["sample"], ms["main"]))
            out[f"{name}_{mode}"] = rows
            med = statistics.median(calls)
            print(
                f"{name} {mode}: median {med:.2f} ms = {nbytes / med / 1e6:.1f} GB/s; calls (total/sample/main ms):",
                " ".join(f"{c:.1f}/{s:.2f}/{m:.1f}" for c, s, m in rows),
                flush=True,
            )
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
