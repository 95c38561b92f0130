"""Expiring abandoned pending runs on a live store: `validator gc` (another process) collects an abandoned
run's blobs while a real upload of the same content for another run is between storing its blob and
recording it; the upload still ends up with its blob, and `validator check` is clean. Plus the faces of the
collection: `validator gc` and POST /api/v1/admin/gc."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import torch

from probes import BundleWriter
from tests.reliability.helpers import TOKEN, Server, bundle_files, wait_for
from tests.servers import VALIDATOR as EXE
from validator.settings import Settings


def _bundle(root: Path, name: str) -> Path:
    g = torch.Generator().manual_seed(3)
    with BundleWriter(root / name, run_name=name, part="p0") as w:
        w.add("h", torch.randn(256, 16, generator=g), step=0)
        w.add("k", torch.randn(64, generator=g), step=0)
    return root / name


def _env(home: Path, db_url: str | None) -> dict[str, str]:
    env = {**os.environ, "VALIDATOR_HOME": str(home)}
    env.pop("VALIDATOR_DATABASE_URL", None)
    if db_url:
        env["VALIDATOR_DATABASE_URL"] = db_url
    return env


def _validator(home: Path, db_url: str | None, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([EXE, *args], env=_env(home, db_url), capture_output=True, text=True, timeout=120)


def _age(home: Path, db_url: str | None, name: str, days: float) -> None:
    from sqlalchemy import select, update

    from validator.service import Service
    from validator.store.models import Run

    svc = Service(Settings(home=home, database_url=db_url))
    try:
        with svc.session() as s, s.begin():
            s.execute(update(Run).where(Run.name == name).values(created_at=datetime.now(UTC) - timedelta(days=days)))
            run_id = s.scalars(select(Run.id).where(Run.name == name)).one()
        for f in svc.settings.staging_dir.glob(f"{run_id}.*"):  # and received nothing for as long
            os.utime(f, (time.time() - days * 24 * 3600,) * 2)
    finally:
        svc.close()


def test_gc_beside_a_concurrent_upload_of_the_same_content(tmp_path: Path, db_url: str | None) -> None:
    home = tmp_path / "home"
    bundle = _bundle(tmp_path, "kept")
    files = bundle_files(bundle)
    part, tfile = next((p, f) for p, f in files if f.suffix == ".safetensors")
    data = tfile.read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    blob = home / "blobs" / sha[:2] / sha[2:]

    server = Server(home, db_url=db_url)
    try:
        with server.client() as c:  # a push abandoned after one file: the same file "kept" will send
            assert c.post("/runs", json={"name": "abandoned"}).status_code == 201
            assert c.put(f"/runs/abandoned/files/{part}/{tfile.name}", content=data).status_code == 200
            assert c.post("/runs", json={"name": "kept"}).status_code == 201
    finally:
        server.stop()
    assert blob.exists()

    marker = tmp_path / "paused"
    server = Server(home, db_url=db_url, fault=f"reference:{marker}")
    try:
        _age(home, db_url, "abandoned", 8)  # past the 7-day expiry age
        got: dict[str, httpx.Response] = {}

        def upload() -> None:
            with httpx.Client(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=120) as h:
                got["r"] = h.put(f"{server.url}/api/v1/runs/kept/files/{part}/{tfile.name}", content=data)

        t = threading.Thread(target=upload)
        t.start()
        wait_for(marker.exists)  # the upload found its blob present and is about to record it...
        gc = _validator(home, db_url, "gc", "--json")  # ...when a collection runs in another process
        assert gc.returncode == 0, gc.stderr
        doc = json.loads(gc.stdout)
        assert doc["expired_runs"] == ["abandoned"] and doc["blobs"] == 1 and doc["bytes"] == len(data)
        assert not blob.exists()  # nothing referenced it at that moment: collected
        marker.with_name(marker.name + ".go").touch()
        t.join(120)
        assert got["r"].status_code == 200, got["r"].text
        assert blob.exists()  # the upload wrote it again before recording it
        with server.client() as c:
            for p, f in files:
                if f != tfile:
                    assert c.put(f"/runs/kept/files/{p}/{f.name}", content=f.read_bytes()).status_code == 200
            r = c.post("/runs/kept/finalize")
            assert r.status_code == 200, r.text
            assert r.json()["n_tensors"] == 2
            assert c.get("/runs/abandoned").status_code == 404
    finally:
        server.stop()
    check = _validator(home, db_url, "check")
    assert check.returncode == 0, check.stdout + check.stderr
    cmp = _validator(home, db_url, "compare", "kept", str(bundle), "--json")
    assert cmp.returncode == 0 and json.loads(cmp.stdout)["verdict"] == "pass", cmp.stdout + cmp.stderr


def test_gc_command(tmp_path: Path) -> None:
    home = tmp_path / "home"
    r = _validator(home, None, "gc")
    assert r.returncode == 0 and r.stdout.startswith("expired 0 pending run(s); deleted 0 blob(s)"), r.stdout + r.stderr
    for bad in ("-1", "nan", "inf", "1e300", "soon"):
        r = _validator(home, None, "gc", "--older-than", bad)
        assert r.returncode == 2 and "--older-than" in r.stderr and "Traceback" not in r.stderr, r.stderr
    r = subprocess.run([EXE, "gc"], env={**_env(home, None), "VALIDATOR_PENDING_EXPIRY_HOURS": "-2"},
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "pending_expiry_hours" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_admin_gc_route(tmp_path: Path) -> None:
    import asyncio

    from validator.app.api import create_app
    from validator.service import Service, uploads

    async def go(svc: Service) -> list[tuple[int, dict]]:
        transport = httpx.ASGITransport(app=create_app(svc.settings, service=svc))
        auth = {"Authorization": "Bearer t0k"}
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
            out = []
            for url, headers in (("/api/v1/admin/gc", {}), ("/api/v1/admin/gc?older_than_hours=-1", auth),
                                 ("/api/v1/admin/gc", auth), ("/api/v1/admin/gc?older_than_hours=0", auth)):
                r = await c.post(url, headers=headers)
                out.append((r.status_code, r.json()))
            return out

    svc = Service(Settings(home=tmp_path / "home", tokens=("t0k",)))
    try:
        uploads.create_pending(svc, name="left")
        uploads.upload_file(svc, run="left", part="p0", filename="part.json", chunks=[b"{}"])
        (anon, _), (neg, _), (default, d1), (zero, d2) = asyncio.run(go(svc))
        assert (anon, neg, default, zero) == (401, 422, 200, 200)
        assert d1 == {"expired_runs": [], "blobs": 0, "bytes": 0, "staging_files": 0, "foreign": []}  # a minute old: kept
        assert d2["expired_runs"] == ["left"] and d2["blobs"] == 1 and d2["bytes"] == 2
        assert svc.check_store() == []
    finally:
        svc.close()
