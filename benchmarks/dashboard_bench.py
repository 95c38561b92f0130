"""The dashboard's comparison page at Kimi scale: size and server render time of a 5,000-pair comparison
(93 layers x 3 capture points x 16 steps and a few more; tests/validator/app/dashboard/large.py).

    python benchmarks/dashboard_bench.py [--home DIR] [--repeat 20]    # the committed result: dashboard_bench.md

Builds the store (about a minute, most of it the comparison itself) unless ``--home`` names one
that ``python -m tests.validator.app.dashboard.large DIR`` built. Then, for several views of the page
(first page, a later page, one step, a status filter, another sort, one map cell):

- **cold**: the first render in a fresh process (a fresh ``Service``): reading the comparison, run A's
  capture order and deriving the map and table rows, then rendering; and the same with run A's capture
  order already known (another comparison against the same reference was shown before);
- **warm**: every later render, in-process (``httpx.ASGITransport``: the server's own time, no network),
  median and max of ``--repeat`` renders;
- **served**: the same page from a real ``validator serve`` over loopback (warm), median and max.

Target (docs/reliability.md): under 300 KB and 300 ms at 5,000 pairs.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from tests.validator.app.dashboard import large  # noqa: E402
from tests.validator.app.dashboard.browser import serve  # noqa: E402
from validator.app.api import create_app  # noqa: E402
from validator.app.dashboard import pages  # noqa: E402
from validator.service import Service  # noqa: E402
from validator.settings import Settings  # noqa: E402

VIEWS = {
    "first page": {},
    "page 25": {"page": "25"},
    "step 13": {"step": "13"},
    "status=pass": {"status": "pass"},
    "sort=rel_l2 asc": {"sort": "rel_l2", "dir": "asc"},
    "one cell (16 steps)": {"name": "hidden", "where": "layer 85"},
}


def _comparison(home: Path) -> int:
    svc = Service(Settings(home=home))
    try:
        rec = svc.cached_comparison(large.NAMES["ref"], large.NAMES["cand"], floor=(large.NAMES["ref"], large.NAMES["rerun"]),
                                    background=False)
    finally:
        svc.close()
    return int(rec["id"])


async def _in_process(home: Path, cid: int, repeat: int) -> tuple[float, float, dict[str, tuple[int, list[float]]]]:
    svc = Service(Settings(home=home))
    app = create_app(svc.settings, service=svc)
    out: dict[str, tuple[int, list[float]]] = {}
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://bench") as c:
            await c.get("/runs")  # templates compiled, static files hashed: not the comparison's cost
            t0 = time.perf_counter()
            r = await c.get(f"/comparisons/{cid}")
            cold = time.perf_counter() - t0
            assert r.status_code == 200, r.text[:500]
            for name, params in VIEWS.items():
                times = []
                for _ in range(repeat):
                    t0 = time.perf_counter()
                    r = await c.get(f"/comparisons/{cid}", params=params)
                    times.append(time.perf_counter() - t0)
                    assert r.status_code == 200, r.text[:500]
                out[name] = (len(r.content), times)
            pages._cache.pop(svc)  # forget the comparison's derived data, keep run A's capture order
            t0 = time.perf_counter()
            r = await c.get(f"/comparisons/{cid}")
            cold_known_order = time.perf_counter() - t0
    finally:
        svc.close()
    return cold, cold_known_order, out


def _served(home: Path, cid: int, repeat: int, log: Path) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    with serve(home, log) as url, httpx.Client(base_url=url, timeout=60) as c:
        c.get(f"/comparisons/{cid}")  # the process's first (cold) render
        for name, params in VIEWS.items():
            times = []
            for _ in range(repeat):
                t0 = time.perf_counter()
                r = c.get(f"/comparisons/{cid}", params=params)
                times.append(time.perf_counter() - t0)
                assert r.status_code == 200
            out[name] = times
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--home", type=Path, help="a store built by tests/validator/app/dashboard/large.py (else built now)")
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        home = args.home
        if home is None:
            home = Path(tmp) / "home"
            t0 = time.perf_counter()
            large.build_store(home, Path(tmp) / "bundles")
            t_ingest = time.perf_counter() - t0
            t0 = time.perf_counter()
            cid = _comparison(home)
            print(f"built: 3 runs of {large.N_PAIRS:,} tensors ingested in {t_ingest:.0f} s, compared in {time.perf_counter() - t0:.0f} s")
        else:
            cid = _comparison(home)
        cold, cold_order, views = asyncio.run(_in_process(home, cid, args.repeat))
        served = _served(home, cid, args.repeat, Path(tmp) / "server.log")
    ms = 1000.0
    print(f"comparison {cid}: {large.N_PAIRS:,} pairs; cold (first render in a process): {cold * ms:.0f} ms; "
          f"cold with run A's capture order known: {cold_order * ms:.0f} ms")
    print(f"{'view':<22} {'bytes':>8} {'warm median':>12} {'warm max':>9} {'served median':>14} {'served max':>11}")
    for name, (size, times) in views.items():
        s = served[name]
        print(f"{name:<22} {size:>8,} {statistics.median(times) * ms:>9.0f} ms {max(times) * ms:>6.0f} ms"
              f" {statistics.median(s) * ms:>11.0f} ms {max(s) * ms:>8.0f} ms")


if __name__ == "__main__":
    main()
