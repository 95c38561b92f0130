"""Finalize at real sizes: a bundle part with N tensor records (a Kimi-K3 capture across 64 ranks has tens of
thousands), uploaded to a pending run and finalized through the API's own path (``validator.service.uploads``:
the uploaded files assembled, the bundle read and checked, every blob stored and made durable, the records
inserted in one transaction), on the embedded store (SQLite + local blobs).

    python benchmarks/finalize_bench.py --records 100000        # the committed result: benchmarks/finalize_bench.md

Prints the wall time of the finalize alone (the upload before it is not timed), the CPU time this process
spent in it (user and system), and the load average around it (the box is shared: wall time depends on who
else runs).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import torch

from probes import BundleWriter
from validator.service import Service, uploads
from validator.settings import Settings


def make_bundle(root: Path, n: int) -> Path:
    """One part, ``n`` distinct tiny tensors (so ``n`` blobs too), named like capture points per layer/step."""
    with BundleWriter(root, run_name="finalize-bench", part="rank0") as w:
        for i in range(n):
            w.add("layer.out", torch.tensor([float(i), float(i) + 0.5]), layer=i % 93, step=i // 93)
    return root


def upload(svc: Service, bundle: Path, name: str) -> None:
    """What ``validator push`` sends: the manifest, then each part's files (part.json last)."""
    uploads.create_pending(svc, name=name)
    files = [("_root", bundle / "manifest.json")]
    for part in sorted(p for p in (bundle / "parts").iterdir() if p.is_dir()):
        files += [(part.name, f) for f in sorted(part.iterdir()) if f.name != "part.json"] + [(part.name, part / "part.json")]
    for part_name, f in files:
        with open(f, "rb") as fh:
            uploads.upload_file(svc, run=name, part=part_name, filename=f.name, chunks=iter(lambda: fh.read(1 << 20), b""))


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
        upload(svc, bundle, "finalize-bench")
        t_upload = time.perf_counter() - t0
        os.sync()  # the bundle was written here, not by the server: its dirty pages are not finalize's to write
        load0 = os.getloadavg()[0]
        t0, c0 = time.perf_counter(), os.times()
        summary = uploads.finalize(svc, run="finalize-bench")
        t_fin, c1 = time.perf_counter() - t0, os.times()
        load1 = os.getloadavg()[0]
        svc.close()
    print(f"records: {args.records:,} (stored {summary.n_tensors:,}); writing the bundle {t_write:.1f} s, uploading it "
          f"{t_upload:.1f} s (neither part of finalize)")
    print(f"finalize: {t_fin:.1f} s wall; CPU in this process {c1.user - c0.user:.1f} s user + {c1.system - c0.system:.1f} s "
          f"system; load average {load0:.2f} before, {load1:.2f} after")


if __name__ == "__main__":
    main()
