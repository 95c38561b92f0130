"""Crashes: the server is SIGKILLed in the middle of an upload, a finalize and a comparison. After a restart
no partial run is visible, temporary files are gone, a retry succeeds, and every blob is stored once."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch

from probes import BundleWriter, ShardSpec
from tests.factories import tensors, write_tp_bundle
from tests.reliability.helpers import TOKEN, Server, blob_files, bundle_files, check_blob_store, db_blobs, wait_for
from validator.app.client import Client
from validator.settings import Settings


def _bundle(root: Path, name: str, *, big: int = 1 << 20) -> Path:
    """Two parts; part p1 holds a tensor of ``big`` float32s (so its upload takes a while)."""
    g = torch.Generator().manual_seed(7)
    with BundleWriter(root / name, run_name=name, part="p0", labels={"case": "crash"}) as w:
        w.add("small", torch.randn(64, 8, generator=g), step=0, tp_rank=0, tp_size=2, shard=ShardSpec.split(0, 0, 2))
    with BundleWriter(root / name, run_name=name, part="p1") as w:
        w.add("small", torch.randn(64, 8, generator=g), step=0, tp_rank=1, tp_size=2, shard=ShardSpec.split(0, 1, 2))
        w.add("big", torch.randn(big, generator=g), step=0)
    return root / name


def _expected_shas(bundle: Path) -> dict[str, str]:
    out = {}
    for pj in sorted(bundle.glob("parts/*/part.json")):
        for rec in json.loads(pj.read_text())["tensors"]:
            out[f"{pj.parent.name}:{rec['name']}"] = rec["sha256"]
    return out


def _settings(home: Path, db_url: str | None) -> Settings:
    return Settings(home=home, database_url=db_url)


def _assert_consistent(home: Path, db_url: str | None, bundle: Path | None = None) -> None:
    """Blobs on disk = blobs in the database, each hashing to its name; no temporary file anywhere; the
    stored tensors are exactly the bundle's."""
    on_disk = check_blob_store(home / "blobs")
    assert set(on_disk) == db_blobs(_settings(home, db_url))
    from validator.service import Service as _Service

    checker = _Service(_settings(home, db_url))
    try:  # `validator check` agrees (orphan blob rows are expected here only while uploads are pending)
        problems = [p for p in checker.check_store() if "orphan row" not in p]
    finally:
        checker.close()
    assert problems == [], problems
    staging = home / "staging"
    # nothing left but pending runs' activity markers (validator.service.expiry)
    left = sorted(p.name for p in staging.iterdir() if p.suffix != ".active") if staging.exists() else []
    assert left == [], left
    if bundle is not None:
        from sqlalchemy import select

        from validator.service import Service
        from validator.store.models import Tensor

        svc = Service(_settings(home, db_url))
        try:
            with svc.session() as s:
                stored = sorted(s.scalars(select(Tensor.sha256)))
        finally:
            svc.close()
        assert stored == sorted(_expected_shas(bundle).values())


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


def _slow_body(path: Path, started: threading.Event, chunk: int = 64 << 10) -> Iterator[bytes]:
    with open(path, "rb") as f:
        first = True
        while b := f.read(chunk):
            yield b
            if first:
                started.set()
                first = False
            time.sleep(0.05)


def test_kill_during_upload_then_resume(tmp_path: Path, home: Path, db_url: str | None) -> None:
    bundle = _bundle(tmp_path, "up")
    files = bundle_files(bundle)
    big = next(f for part, f in files if part == "p1" and f.suffix == ".safetensors")
    server = Server(home, db_url=db_url)
    with server.client() as c:
        assert c.post("/runs", json={"name": "up"}).status_code == 201
        for part, f in files:
            if f == big:
                break
            assert c.put(f"/runs/up/files/{part}/{f.name}", content=f.read_bytes()).status_code == 200
    started = threading.Event()
    errors: list[BaseException] = []

    def upload() -> None:
        try:
            with httpx.Client(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30) as h:
                h.put(f"{server.url}/api/v1/runs/up/files/p1/{big.name}", content=_slow_body(big, started))
        except httpx.HTTPError as exc:
            errors.append(exc)

    t = threading.Thread(target=upload)
    t.start()
    assert started.wait(30)
    with server.client() as c:
        wait_for(lambda: c.get(f"/runs/up/files/p1/{big.name}").json()["received"] > 0)
    server.kill()
    t.join(30)
    assert errors, "the upload should have been cut off by the crash"

    server = Server(home, db_url=db_url)  # the real entry point: create_app -> Service.recover()
    try:
        with server.client() as c:
            assert c.get("/runs").json()["data"] == []
            assert c.get("/runs/up").status_code == 404
            st = c.get(f"/runs/up/files/p1/{big.name}").json()
            assert not st["complete"] and 0 < st["received"] < big.stat().st_size  # the received prefix is kept
        client = Client(server.url, TOKEN)
        try:
            run = client.push(bundle)  # resumes from "received", then finalizes
        finally:
            client.close()
        assert run["n_tensors"] == 3 and run["status"] == "complete"
    finally:
        server.stop()
    _assert_consistent(home, db_url, bundle)


@pytest.mark.parametrize("fault", ["blobs", "commit"])
def test_kill_during_finalize(tmp_path: Path, home: Path, db_url: str | None, fault: str) -> None:
    """Killed after some tensors were stored (blobs the database does not know yet) or inside the
    transaction that makes the run visible: the run stays invisible, and finalizing again completes it."""
    bundle = _bundle(tmp_path, "fin", big=4096)
    marker = tmp_path / "stalled"
    server = Server(home, db_url=db_url, fault=f"{fault}:{marker}")
    with server.client() as c:
        assert c.post("/runs", json={"name": "fin"}).status_code == 201
        for part, f in bundle_files(bundle):
            assert c.put(f"/runs/fin/files/{part}/{f.name}", content=f.read_bytes()).status_code == 200
    def finalize() -> None:
        with contextlib.suppress(httpx.HTTPError):  # cut off by the crash
            httpx.post(f"{server.url}/api/v1/runs/fin/finalize", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60)

    t = threading.Thread(target=finalize, daemon=True)
    t.start()
    wait_for(marker.exists)
    assert any(p.name.startswith("finalize.") for p in (home / "staging").iterdir())  # a crashed finalize's directory
    if fault == "blobs":
        assert len(blob_files(home / "blobs")) > len(db_blobs(_settings(home, db_url)))  # blobs the database does not know
    server.kill()

    server = Server(home, db_url=db_url)
    try:
        assert not any(p.name.startswith("finalize.") for p in (home / "staging").iterdir())  # recover() removed it
        with server.client() as c:
            assert c.get("/runs").json()["data"] == []
            assert c.get("/runs/fin").status_code == 404
            r = c.post("/runs/fin/finalize")
            assert r.status_code == 200, r.text
            assert r.json()["n_tensors"] == 3
            assert c.get("/runs/fin/tensors").status_code == 200
    finally:
        server.stop()
    _assert_consistent(home, db_url, bundle)


def test_kill_during_comparison(tmp_path: Path, home: Path, db_url: str | None) -> None:
    """A background comparison whose server died is not 'running' forever: after the restart it says it was
    interrupted, and asking again computes it."""
    from validator.service import Service

    full = tensors()
    svc = Service(_settings(home, db_url))
    try:
        for name, tp in (("ref", 2), ("cand", 4)):
            svc.ingest(write_tp_bundle(tmp_path, name, full, tp=tp))
    finally:
        svc.close()

    marker = tmp_path / "comparing"
    server = Server(home, db_url=db_url, fault=f"compare:{marker}")
    with server.client() as c:
        r = c.post("/comparisons", json={"a": "ref", "b": "cand", "background": True})
        assert r.status_code == 202, r.text
        cid = r.json()["id"]
        wait_for(marker.exists)
        assert c.get(f"/comparisons/{cid}").json()["status"] == "running"
    server.kill()

    server = Server(home, db_url=db_url)
    try:
        with server.client() as c:
            rec = c.get(f"/comparisons/{cid}").json()
            assert rec["status"] == "error" and "interrupted" in rec["error"], rec
            r = c.post("/comparisons", json={"a": "ref", "b": "cand", "background": True})
            rec = r.json()
            assert rec["id"] == cid
            rec = wait_for(lambda: (x := c.get(f"/comparisons/{cid}").json())["status"] in ("done", "error") and x)
            assert rec["status"] == "done" and rec["verdict"] == "pass", rec
            g = c.post("/gates", json={"baseline": "ref", "candidate": "cand"})
            assert g.status_code == 200 and g.json()["verdict"] == "pass"
    finally:
        server.stop()
    _assert_consistent(home, db_url)


def test_recover_keeps_live_and_resumable_files(tmp_path: Path) -> None:
    """recover() removes only what dead processes left: a live process's temporary files and partial
    uploads (resume state) stay."""
    import os
    import subprocess
    import sys

    from validator.service import Service
    from validator.store.blobs import temp_prefix

    settings = Settings(home=tmp_path / "home")
    svc = Service(settings)
    try:
        staging, btmp = settings.staging_dir, settings.blob_dir / "tmp"
        staging.mkdir(parents=True, exist_ok=True)
        dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True)
        dead_pid = int(dead.stdout)
        (staging / f"finalize.{dead_pid}.abc").mkdir()
        (staging / f"finalize.{dead_pid}.abc" / "manifest.json").write_text("{}")
        (staging / f"tmp.{dead_pid}.x").mkdir()
        (btmp / f"tmp.{dead_pid}.y").write_bytes(b"half a blob")
        (btmp / "tmpLEGACY1").write_bytes(b"old")
        (staging / "finalize-LEGACY").mkdir()
        mine = staging / (temp_prefix("finalize") + "live")
        mine.mkdir()
        partial = staging / ("0" * 64 + ".partial")
        partial.write_bytes(b"resume me")
        old_partial = staging / ("1" * 64 + ".partial")
        old_partial.write_bytes(b"abandoned")
        os.utime(old_partial, (time.time() - 30 * 24 * 3600,) * 2)
        unrelated = staging / "notes.txt"
        unrelated.write_text("not ours to delete")
        got = svc.recover()
        assert got["temp_files"] == 6, got
        assert sorted(p.name for p in staging.iterdir()) == sorted([mine.name, partial.name, unrelated.name])
        assert list(btmp.iterdir()) == []
    finally:
        svc.close()
