"""A few comparisons of one bf16 pair on the GPU, for Nsight Compute to profile the CUDA C kernels.

    ncu --kernel-name regex:vk_ --launch-skip 2 --launch-count 2 --section SpeedOfLight \
        --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
        --section Occupancy python3 benchmarks/profile_kernels.py --elems 536870912

The first call builds the kernels and its lane; the later calls are the ones to look at.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from benchmarks.compare_bench import make_pair  # noqa: E402
from validator.metrics import compare_tensors  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--elems", type=int, default=1 << 29)
    p.add_argument("--calls", type=int, default=3)
    args = p.parse_args(argv)
    a, b = make_pair(args.elems, torch.bfloat16, "cuda", seed=3)
    for _ in range(args.calls):
        m = compare_tensors(a, b)
    torch.cuda.synchronize()
    print(m)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
