"""32 ranks push their parts of one run at once, each from its own process, to a real server."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import torch

from probes import BundleWriter, ShardSpec
from probes.core.bundle import MANIFEST
from tests.servers import validator_serve

RANK_SCRIPT = r"""
import sys, httpx
from pathlib import Path
url, root, part = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
h = {"Authorization": "Bearer tok"}
with httpx.Client(headers=h, timeout=120) as c:
    d = root / "parts" / part
    for f in sorted(d.iterdir(), key=lambda f: f.name == "part.json"):
        for attempt in range(2):  # the second attempt is a retry of finished content: must be a no-op
            r = c.put(f"{url}/api/v1/runs/big/files/{part}/{f.name}", content=f.read_bytes())
            r.raise_for_status()
"""


def test_32_concurrent_rank_pushes_lose_nothing(tmp_path: Path, db_url: str | None) -> None:
    ranks = 32
    root = tmp_path / "big"
    expected = {}
    for r in range(ranks):
        with BundleWriter(root, run_name="big", part=f"rank{r:02d}") as w:
            t = torch.full((64, 8), float(r))
            w.add("k", t, step=0, layer=0, tp_rank=r, tp_size=ranks, shard=ShardSpec.split(0, r, ranks))
            w.add(f"own.r{r}", torch.randn(16), step=0)
            expected[r] = t
    env = {**os.environ, "VALIDATOR_HOME": str(tmp_path / "home"), "VALIDATOR_TOKENS": "tok"}
    if db_url:
        env["VALIDATOR_DATABASE_URL"] = db_url
    with validator_serve(env, tmp_path / "server.log") as url:
        h = {"Authorization": "Bearer tok"}
        assert httpx.post(url + "/api/v1/runs", json={"name": "big"}, headers=h).status_code == 201
        httpx.put(f"{url}/api/v1/runs/big/files/_root/{MANIFEST}", content=(root / MANIFEST).read_bytes(), headers=h).raise_for_status()
        procs = [
            subprocess.Popen([sys.executable, "-c", RANK_SCRIPT, url, str(root), f"rank{r:02d}"], stderr=subprocess.PIPE, text=True)
            for r in range(ranks)
        ]
        for p in procs:
            _, err = p.communicate(timeout=180)
            assert p.returncode == 0, err
        r = httpx.post(f"{url}/api/v1/runs/big/finalize", headers=h, timeout=120)
        assert r.status_code == 200, r.text
        assert r.json()["n_tensors"] == 2 * ranks
        inv = httpx.get(f"{url}/api/v1/runs/big/tensors").json()["data"]
        k = next(t for t in inv if t["name"] == "k")
        assert k["shape"] == [64 * ranks, 8] and k["shards"] == ranks
        assert len([t for t in inv if t["name"].startswith("own.")]) == ranks
