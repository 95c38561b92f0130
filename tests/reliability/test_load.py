"""Load: 64 ranks push their parts of one run to one real server at once (SQLite and PostgreSQL), each file
twice (the retry must be a no-op), while CI gates keep asking for verdicts. Nothing is lost (every
tensor's hash is checked), nothing fails with 'database is locked', and every gate answers."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx
import torch

from probes import BundleWriter, ShardSpec
from probes.core.bundle import MANIFEST
from tests.factories import tensors, write_tp_bundle
from tests.reliability.helpers import TOKEN, Server, check_blob_store, db_blobs
from validator.service import Service
from validator.settings import Settings

RANKS = 64
GATES = 12


def _rank_bundle(root: Path) -> Path:
    for r in range(RANKS):
        with BundleWriter(root, run_name="big", part=f"rank{r:02d}") as w:
            w.add("k", torch.full((32, 8), float(r)), step=0, layer=0, tp_rank=r, tp_size=RANKS,
                  shard=ShardSpec.split(0, r, RANKS))
            w.add(f"own.r{r}", torch.randn(16, generator=torch.Generator().manual_seed(r)), step=0)
    return root


def test_64_concurrent_rank_uploads_with_gates(tmp_path: Path, db_url: str | None) -> None:
    bundle = _rank_bundle(tmp_path / "big")
    home = tmp_path / "home"
    settings = Settings(home=home, database_url=db_url)
    seed = Service(settings)
    try:  # the runs the gates compare, stored before the load starts
        full = tensors()
        seed.ingest(write_tp_bundle(tmp_path, "ref", full, tp=2))
        seed.ingest(write_tp_bundle(tmp_path, "cand", full, tp=4, noise=1e-3))
    finally:
        seed.close()

    server = Server(home, db_url=db_url)
    errors: list[str] = []
    gate_times: list[float] = []
    try:
        h = {"Authorization": f"Bearer {TOKEN}"}
        api = server.url + "/api/v1"
        assert httpx.post(api + "/runs", json={"name": "big"}, headers=h).status_code == 201
        httpx.put(f"{api}/runs/big/files/_root/{MANIFEST}", content=(bundle / MANIFEST).read_bytes(), headers=h).raise_for_status()
        start = threading.Barrier(RANKS + 1)
        uploads_done = threading.Event()

        def rank(r: int) -> None:
            part = bundle / "parts" / f"rank{r:02d}"
            files = sorted(part.iterdir(), key=lambda f: f.name == "part.json")
            with httpx.Client(headers=h, timeout=60) as c:
                start.wait()
                for f in files:
                    for attempt in range(2):  # the second is a retry of finished content: a no-op
                        resp = c.put(f"{api}/runs/big/files/rank{r:02d}/{f.name}", content=f.read_bytes())
                        if resp.status_code != 200:
                            errors.append(f"rank {r} {f.name} #{attempt}: {resp.status_code} {resp.text[:200]}")
                        elif attempt == 1 and resp.json()["created"] is not False:
                            errors.append(f"rank {r} {f.name}: the retry was not a no-op")

        def gates() -> None:
            with httpx.Client(headers=h, timeout=60) as c:
                start.wait()
                for i in range(GATES):  # a new policy each time: a real comparison, not a cached answer
                    t0 = time.monotonic()
                    resp = c.post(api + "/gates", json={"baseline": "ref", "candidate": "cand",
                                                        "policy": {"rule": [{"match": "*", "rel_l2_max": 0.5 + i * 1e-3}]}})
                    gate_times.append(time.monotonic() - t0)
                    if resp.status_code != 200 or resp.json()["verdict"] != "pass":
                        errors.append(f"gate {i}: {resp.status_code} {resp.text[:200]}")
                    if uploads_done.is_set() and i >= 3:
                        break

        threads = [threading.Thread(target=rank, args=(r,)) for r in range(RANKS)]
        g = threading.Thread(target=gates)
        for t in [*threads, g]:
            t.start()
        for t in threads:
            t.join(120)
        uploads_done.set()
        g.join(120)
        assert not errors, errors[:5]
        assert len(gate_times) >= 4 and max(gate_times) < 20, gate_times

        r = httpx.post(api + "/runs/big/finalize", headers=h, timeout=120)
        assert r.status_code == 200, r.text
        assert r.json()["n_tensors"] == 2 * RANKS
        inv = httpx.get(api + "/runs/big/tensors").json()["data"]
        k = next(t for t in inv if t["name"] == "k")
        assert k["shape"] == [32 * RANKS, 8] and k["shards"] == RANKS
    finally:
        server.stop()
    log = server.output()
    assert "database is locked" not in log and "Traceback" not in log, log[-3000:]

    # every tensor of every rank is stored with the hash its writer recorded, and the bytes match
    expected = {}
    for pj in (bundle / "parts").glob("*/part.json"):
        for rec in json.loads(pj.read_text())["tensors"]:
            expected[(rec["name"], rec["coords"].get("tp_rank"))] = rec["sha256"]
    from sqlalchemy import select

    from validator.store.models import Run, Tensor

    svc = Service(settings)
    try:
        with svc.session() as s:
            run_id = s.scalars(select(Run.id).where(Run.name == "big")).one()
            rows = s.scalars(select(Tensor).where(Tensor.run_id == run_id)).all()
            stored = {(t.name, t.coords.get("tp_rank")): t.sha256 for t in rows}
    finally:
        svc.close()
    assert stored == expected
    blobs = check_blob_store(home / "blobs")
    assert set(stored.values()) <= set(blobs) and set(blobs) == db_blobs(settings)
    svc = Service(settings)
    try:
        assert svc.check_store() == []  # `validator check`: database and blobs agree after the load
    finally:
        svc.close()


def test_overlapping_retries_of_one_file(tmp_path: Path) -> None:
    """A client that times out and retries while its first request is still streaming: the retry is
    refused (409) instead of interleaving bytes, and the file ends up exactly right."""
    import hashlib

    import pytest

    from validator.errors import ConflictError
    from validator.service import uploads

    svc = Service(Settings(home=tmp_path / "home"))
    try:
        uploads.create_pending(svc, name="r")
        data = bytes(range(256)) * 4096  # 1 MiB
        half = threading.Event()
        go_on = threading.Event()
        result: dict[str, object] = {}

        def slow() -> object:  # the first request's body has not begun to arrive when the retry comes
            half.set()
            go_on.wait(30)
            yield data[: len(data) // 2]
            yield data[len(data) // 2 :]

        def first() -> None:
            try:
                result["first"] = uploads.upload_file(svc, run="r", part="p0", filename="acceptance.jsonl", chunks=slow())
            except Exception as exc:  # reported below
                result["first"] = exc

        t = threading.Thread(target=first)
        t.start()
        assert half.wait(30)
        with pytest.raises(ConflictError, match="in progress"):
            uploads.upload_file(svc, run="r", part="p0", filename="acceptance.jsonl", chunks=iter([data]))
        go_on.set()
        t.join(30)
        sha = hashlib.sha256(data).hexdigest()
        assert isinstance(result["first"], dict) and result["first"]["sha256"] == sha, result
        again = uploads.upload_file(svc, run="r", part="p0", filename="acceptance.jsonl", chunks=iter([data]))
        assert again["complete"] and again["created"] is False and again["sha256"] == sha
        # no partial upload left; the run's activity marker (its last byte received) stays until finalize
        assert [p.suffix for p in svc.settings.staging_dir.iterdir()] == [".active"]
    finally:
        svc.close()
