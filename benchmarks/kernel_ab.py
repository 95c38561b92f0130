"""CUDA C kernel configurations compared on GPU time alone, interleaved so that drift cancels.

    python benchmarks/kernel_ab.py --json out.json        # on a CUDA machine

The end-to-end sweep of ``compare_bench.py --sweep`` includes the host's share of each call, which
varies by tens of microseconds from run to run on the lent machines: too much to rank kernels that
differ by a few percent. Here every configuration's kernels (``vk_sample``, ``vk_main``) are
queued back to back (``call_overhead.gpu_only``), the configurations take turns for ``--rounds``
rounds, and the median per configuration is reported, with whether ``compare_tensors`` under it
prints the FP64 reference's digits (``compare_bench.printed``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from benchmarks.call_overhead import gpu_only  # noqa: E402
from benchmarks.compare_bench import gbps, make_pair, printed  # noqa: E402
from validator.kernels import _finish  # noqa: E402
from validator.kernels import cuda as kc  # noqa: E402
from validator.metrics import compare_tensors  # noqa: E402

CONFIGS: list[dict[str, Any]] = [  # validator/kernels/cuda.py CONFIG keys; window_delta: _finish's floor
    {},  # the defaults (registers capped at 51: 5 resident blocks; 15 blocks per SM, 5 under 2**27 elements)
    {"cu_minb": 4, "cu_blocks_per_sm": 12, "cu_small_bps": 4},  # registers capped at 64: 4 resident blocks
    {"cu_blocks_per_sm": 20},
]


def use(cfg: dict[str, Any], saved: dict[str, int], delta: float) -> None:
    """Configuration ``cfg`` in force (kernel macros, and the window's minimum half-width)."""
    kc.CONFIG.clear()
    kc.CONFIG.update({**saved, **{k: v for k, v in cfg.items() if k != "window_delta"}})
    if _finish._WINDOW_MIN_DELTA != cfg.get("window_delta", delta):
        _finish._WINDOW_MIN_DELTA = cfg.get("window_delta", delta)
        kc._cu_plan.cache_clear()  # the sample ranks are part of a plan


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--elems", type=int, nargs="*", default=[8192 * 7168, 1 << 29])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--configs", type=Path, help="a JSON list of configurations instead of the built-in one")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    configs = json.loads(args.configs.read_text()) if args.configs else CONFIGS
    saved, delta = dict(kc.CONFIG), _finish._WINDOW_MIN_DELTA
    out: dict[str, Any] = {"device": torch.cuda.get_device_name(), "configs": configs, "sizes": {}}
    for n in args.elems:
        a, b = make_pair(n, torch.bfloat16, "cuda", seed=4)
        os.environ["VALIDATOR_KERNELS"] = "0"
        try:
            ref = printed(compare_tensors(a, b))
        finally:
            os.environ.pop("VALIDATOR_KERNELS")
        times: list[list[float]] = [[] for _ in configs]
        exact: list[bool] = []
        for cfg in configs:  # builds every variant once, and checks its digits
            use(cfg, saved, delta)
            exact.append(printed(compare_tensors(a, b)) == ref)
        for _ in range(args.rounds):
            for i, cfg in enumerate(configs):
                use(cfg, saved, delta)
                times[i].append(gpu_only(a, b, reps=20))
        use({}, saved, delta)
        rows = []
        for cfg, ts, ok in zip(configs, times, exact, strict=True):
            med = statistics.median(ts)
            rows.append({"config": cfg, "gpu_us": 1e6 * med, "gbps_gpu": gbps(4 * n, med), "printed_exact": ok,
                         "spread": (max(ts) - min(ts)) / med})  # fmt: skip
            print(n, json.dumps(rows[-1]), flush=True)
        out["sizes"][str(n)] = rows
        del a, b
        torch.cuda.empty_cache()
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
