"""`validator check` and POST /api/v1/admin/check: a consistent store passes; each kind of damage is named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.factories import tensors, write_tp_bundle
from validator.app.cli import main


@pytest.fixture
def home(tmp_path: Path) -> Path:
    h = tmp_path / "home"
    assert main(["--home", str(h), "ingest", str(write_tp_bundle(tmp_path, "r", tensors(), tp=2))]) == 0
    return h


def _check(home: Path, capsys, *extra: str) -> tuple[int, dict]:
    capsys.readouterr()
    code = main(["--home", str(home), "check", "--json", *extra])
    return code, json.loads(capsys.readouterr().out)


def _a_blob(home: Path) -> Path:
    return next(p for d in sorted((home / "blobs").iterdir()) if len(d.name) == 2 for p in sorted(d.iterdir()))


def test_a_consistent_store_passes(home: Path, capsys) -> None:
    assert _check(home, capsys) == (0, {"ok": True, "problems": []})


def test_corrupt_missing_and_orphan_blobs_are_named(home: Path, capsys) -> None:
    blob = _a_blob(home)
    data = blob.read_bytes()
    blob.write_bytes(bytes([data[0] ^ 1]) + data[1:])  # same size, other bytes
    code, doc = _check(home, capsys)
    assert code == 1 and any("hash to something else" in p and blob.parent.name + blob.name in p for p in doc["problems"])
    assert _check(home, capsys, "--quick")[0] == 0  # sizes only: this corruption needs the hash
    blob.unlink()
    code, doc = _check(home, capsys, "--quick")
    assert code == 1 and any("missing" in p for p in doc["problems"])
    (blob.parent / ("e" * 62)).write_bytes(b"stray")
    code, doc = _check(home, capsys, "--quick")
    assert any("orphan file" in p for p in doc["problems"])


def test_leftovers_of_dead_processes_are_named(home: Path, capsys) -> None:
    staging = home / "staging"
    staging.mkdir(exist_ok=True)
    (staging / "finalize.999999999.abc").mkdir()  # no such process
    code, doc = _check(home, capsys)
    assert code == 1 and doc["problems"] == ["staging/finalize.999999999.abc: left by a process that is gone"]


def test_admin_route_needs_a_write_token_and_reports(home: Path) -> None:
    import asyncio

    import httpx

    from validator.app.api import create_app
    from validator.service import Service
    from validator.settings import Settings

    async def go() -> tuple[int, int, dict]:
        svc = Service(Settings(home=home, tokens=("t0k",)))
        try:
            transport = httpx.ASGITransport(app=create_app(svc.settings, service=svc))
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
                anon = (await c.post("/api/v1/admin/check")).status_code
                r = await c.post("/api/v1/admin/check", headers={"Authorization": "Bearer t0k"})
                return anon, r.status_code, r.json()
        finally:
            svc.close()

    assert asyncio.run(go()) == (401, 200, {"ok": True, "problems": []})
