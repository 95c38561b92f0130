"""Comparisons on a Ray cluster (validator.executors) against one process, on this machine.

Writes two runs of ``--pairs`` bf16 tensor pairs of ``--elements`` elements each (as bundle files, which
the workers read from the shared filesystem, and optionally ingested into a blob store), starts a loopback
Ray cluster (tests/ray_cluster.py: a head without CPUs and worker nodes of one CPU each), and times
``compare_runs`` in this process (the default thread pool) and on 1, 2, 4... workers, adding worker nodes
between the rows. Each row: one warm-up comparison (worker processes start and import torch, numba),
then the best of ``--reps``. It checks that every document equals the single-process one, and reports
what crossed to the driver: the pickled task arguments and results (no tensor byte does).

    .venv/bin/python benchmarks/ray_bench.py --workers 1,2,4 --s3 http://127.0.0.1:18433 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from validator.runs.view import RunView

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def write_runs(root: Path, pairs: int, elements: int) -> tuple[Path, Path]:
    import torch

    from probes import BundleWriter

    cols = 1024
    rows = max(1, elements // cols)
    g = torch.Generator().manual_seed(0)
    out = []
    for name, noise in (("a", 0.0), ("b", 1e-3)):
        path = root / name
        with BundleWriter(path, run_name=name, part="p0") as w:
            g.manual_seed(0)
            for i in range(pairs):
                t = torch.randn(rows, cols, generator=g)
                if noise:
                    t = t * (1 + noise * torch.randn(rows, cols, generator=torch.Generator().manual_seed(i)))
                w.add(f"layer{i}.out", t.to(torch.bfloat16), step=0, layer=i)
        out.append(path)
    return out[0], out[1]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", default="1,2,4", help="worker node counts, increasing (comma-separated)")
    p.add_argument("--pairs", type=int, default=32)
    p.add_argument("--elements", type=int, default=4 << 20, help="elements per tensor (bf16)")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--batch-bytes", type=int, default=None, help="RayExecutor batch_bytes (default: the module's)")
    p.add_argument("--s3", metavar="ENDPOINT", help="also store the runs in S3 at ENDPOINT (e.g. the SeaweedFS scripts/services starts) and compare the stored runs")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args()
    counts = [int(x) for x in args.workers.split(",")]

    from tests.ray_cluster import ray_cluster
    from validator.executors import RayExecutor
    from validator.executors.planning import BATCH_BYTES
    from validator.judging.compare import compare_runs
    from validator.judging.report import comparison_json
    from validator.runs.sources import open_path

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # the loopback cluster runs without token authentication
    import numba
    import ray
    import torch

    results: dict[str, object] = {
        "pairs": args.pairs,
        "elements": args.elements,
        "reps": args.reps,
        "cpus": os.cpu_count(),
        "versions": {"python": sys.version.split()[0], "ray": ray.__version__, "torch": torch.__version__, "numba": numba.__version__},
        "load_before": os.getloadavg()[0],
        "rows": [],
    }
    rows: list[dict[str, object]] = []

    def save() -> None:  # after every row: a run stopped by a time limit still leaves the rows it measured
        results["rows"] = rows
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1))
    with tempfile.TemporaryDirectory(prefix="ray-bench-") as tmp:
        t0 = time.perf_counter()
        a, b = write_runs(Path(tmp), args.pairs, args.elements)
        print(f"wrote two runs of {args.pairs} pairs in {time.perf_counter() - t0:.1f} s", flush=True)
        va, vb = open_path(a), open_path(b)
        nbytes = sum(t.nbytes for t in va.tensors) + sum(t.nbytes for t in vb.tensors)
        results["bytes_compared"] = nbytes
        # where the tensors are: (label, views of A and B, the blob store URL for workers, before each comparison)
        sources: list[tuple[str, Callable[[], tuple[RunView, RunView]], str | None, Callable[[], None]]] = [
            ("bundle files", lambda: (open_path(a), open_path(b)), None, lambda: None)
        ]
        svc = None
        if args.s3:
            import shutil
            import uuid

            import boto3

            from validator.service import Service
            from validator.settings import Settings

            os.environ.setdefault("AWS_ACCESS_KEY_ID", "test")
            os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "test")
            client = boto3.client("s3", endpoint_url=args.s3, region_name="us-east-1")
            try:
                client.create_bucket(Bucket="validator-bench")
            except client.exceptions.ClientError as exc:
                if exc.response["Error"]["Code"] not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                    raise
            url = f"s3://validator-bench/b-{uuid.uuid4().hex[:8]}?endpoint={args.s3}"
            svc = Service(Settings(home=Path(tmp) / "home", blob_url=url))
            svc.ingest(a, name="a")
            svc.ingest(b, name="b")
            store_svc = svc

            def stored() -> tuple[RunView, RunView]:
                return store_svc.stored_view(store_svc.get_run("a")), store_svc.stored_view(store_svc.get_run("b"))

            def drop_cache() -> None:  # one process downloads every blob again, as a fresh comparison does
                for d in store_svc.settings.cache_dir.iterdir():
                    if d.name != "tmp":
                        shutil.rmtree(d, ignore_errors=True)

            sources.append(("S3 store (SeaweedFS)", stored, url, drop_cache))

        def timed(views: Callable[[], tuple[RunView, RunView]], executor: object, before: Callable[[], None]) -> tuple[float, str]:
            best, doc = float("inf"), ""
            for _ in range(args.reps):
                before()
                t0 = time.perf_counter()
                c = compare_runs(*views(), executor=executor)  # type: ignore[arg-type]
                best = min(best, time.perf_counter() - t0)
                doc = comparison_json(c)
            return best, doc

        compare_runs(va, vb)  # warm: numba's cached pass loaded
        local_docs = {}
        for label, views, _, before in sources:
            local_s, local_docs[label] = timed(views, None, before)
            rows.append({"where": "one process (thread pool)", "source": label, "workers": 0, "seconds": local_s, "gb_s": nbytes / local_s / 1e9})
            print(f"{label}, one process: {local_s:.2f} s, {nbytes / local_s / 1e9:.2f} GB/s", flush=True)
            save()
        t0 = time.perf_counter()
        with ray_cluster(Path(tmp) / "logs", workers=counts[0], cpus=1) as cluster:
            have = counts[0]
            for n in counts:
                while have < n:
                    cluster.add_worker(1)
                    have += 1
                print(f"cluster of {n} worker node(s) up ({time.perf_counter() - t0:.1f} s since the head's start)", flush=True)
                for label, views, blob_url, _ in sources:
                    ex = RayExecutor(cluster.address, blob_url=blob_url, batch_bytes=args.batch_bytes or BATCH_BYTES)
                    compare_runs(*views(), executor=ex)  # warm-up: worker processes start, import torch and numba
                    secs, doc = timed(views, ex, lambda: None)
                    assert doc == local_docs[label], "the Ray comparison differs from the single-process one"
                    per_run = ex.tasks_submitted // (args.reps + 1)
                    rows.append({"where": f"Ray, {n} worker node(s) of 1 CPU", "source": label, "workers": n, "seconds": secs,
                                 "gb_s": nbytes / secs / 1e9, "tasks": per_run})
                    print(f"{label}, {n} worker(s): {secs:.2f} s, {nbytes / secs / 1e9:.2f} GB/s, {per_run} tasks, same document", flush=True)
                    save()
        if svc is not None:
            svc.close()
        # what a task's arguments and results weigh when pickled (what crosses the network besides blobs)
        from validator.executors import portable
        from validator.judging.compare import PairToMeasure, measure_pair
        from validator.runs.reassembly import group_logical

        ga, gb = group_logical(va.tensors), group_logical(vb.tensors)
        key = sorted(ga)[0]
        arg = pickle.dumps([PairToMeasure(portable(ga[key], None), portable(gb[key], None), rounding_floor=False)])
        res = pickle.dumps([measure_pair(ga[key], gb[key], False)])
        results["pickled_args_per_pair"] = len(arg)
        results["pickled_result_per_pair"] = len(res)
        print(f"per pair: {len(arg)} bytes of task arguments, {len(res)} bytes of result; tensor bytes through the driver: 0")
    results["load_after"] = os.getloadavg()[0]
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
