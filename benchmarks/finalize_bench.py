"""Finalize at real sizes: a bundle part with N tensor records (a Kimi-K3 capture across 64 ranks has tens of
thousands), stored through the path an API finalize takes (read the bundle, store every blob, insert the
records in one transaction), on the embedded store (SQLite + local blobs).

    python benchmarks/finalize_bench.py --records 100000        # the committed result: benchmarks/finalize_bench.md
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from probes import BundleWriter
from validator.runs.sources import read_bundle
from validator.service import Service
from validator.settings import Settings


def make_bundle(root: Path, n: int) -> Path:
    """One part, ``n`` distinct tiny tensors (so ``n`` blobs too), named like capture points per layer/step."""
    with BundleWriter(root, run_name="finalize-bench", part="rank0") as w:
        for i in range(n):
            w.add("layer.out", torch.tensor([float(i), float(i) + 0.5]), layer=i % 93, step=i // 93)
    return root


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=100_000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        bundle = make_bundle(Path(tmp) / "bundle", args.records)
        t_write = time.perf_counter() - t0
        svc = Service(Settings(home=Path(tmp) / "home"))
        t0 = time.perf_counter()
        view = read_bundle(bundle)
        t_read = time.perf_counter() - t0
        t0 = time.perf_counter()
        summary = svc.ingest_view(view, name="finalize-bench")
        t_store = time.perf_counter() - t0
        svc.close()
    print(f"records: {args.records:,} (stored {summary.n_tensors:,}); writing the bundle {t_write:.1f} s (not part of finalize)")
    print(f"finalize: read and check the bundle {t_read:.1f} s + store blobs and records {t_store:.1f} s = {t_read + t_store:.1f} s")


if __name__ == "__main__":
    main()
