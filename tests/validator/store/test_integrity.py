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


def test_foreign_files_and_folders_in_blobs_are_reported_by_check_and_gc(home: Path, capsys) -> None:
    """Whatever is in blobs/ and is not a blob: named by `check` (exit 1) and by `gc`, which removes none."""
    blobs = home / "blobs"
    shard = _a_blob(home).parent
    (blobs / "notes.txt").write_text("mine")
    (blobs / "backup").mkdir()
    (blobs / "zz").mkdir()  # two characters, not hex
    (shard / "copy.bak").write_bytes(b"x")
    (shard / ("f" * 62 + ".old")).write_bytes(b"x")
    (shard / ("a" * 62)).mkdir()  # a blob's name, but a folder
    foreign = ["backup/", "notes.txt", f"{shard.name}/{'a' * 62}/", f"{shard.name}/copy.bak", f"{shard.name}/{'f' * 62}.old", "zz/"]
    code, doc = _check(home, capsys, "--quick")
    assert code == 1
    assert sorted(doc["problems"]) == sorted(f"blobs/{n}: not a blob of this store (a foreign file or folder; nothing removes it)"
                                             for n in foreign)
    capsys.readouterr()
    assert main(["--home", str(home), "gc", "--json", "--older-than", "0"]) == 0
    assert sorted(json.loads(capsys.readouterr().out)["foreign"]) == sorted(foreign)
    assert main(["--home", str(home), "gc", "--older-than", "0"]) == 0
    assert "left blobs/notes.txt: not a blob of this store" in capsys.readouterr().out
    assert (blobs / "notes.txt").exists() and (shard / "copy.bak").exists() and (shard / ("a" * 62)).is_dir()


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


# -- a damaged database (issue 39): reported as damage, exit 1, never an internal error ------------------


def _damaged_copy(home: Path, tmp_path: Path, *, table: str, at: str) -> Path:
    """A copy of a real store with 32 garbage bytes written into the first page of ``table`` (``at``: the
    page's header, or its last bytes where the rows' cells are)."""
    import shutil
    import sqlite3

    copy = tmp_path / f"damaged-{table}-{at}"
    shutil.copytree(home, copy)
    db = copy / "validator.db"
    with sqlite3.connect(db) as c:
        c.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # every page in the file itself
        page_size = c.execute("PRAGMA page_size").fetchone()[0]
        root = c.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (table,)).fetchone()[0]
    c.close()
    data = bytearray(db.read_bytes())
    start = (root - 1) * page_size + (0 if at == "header" else page_size - 40)
    data[start : start + 32] = bytes((i * 37 + 11) % 256 for i in range(32))
    db.write_bytes(bytes(data))
    return copy


@pytest.mark.parametrize(("table", "at"), [("tensors", "header"), ("blobs", "cells"), ("sqlite_master", "cells")])
def test_a_damaged_database_is_reported_not_an_internal_error(home: Path, tmp_path: Path, capsys, table: str, at: str) -> None:
    if table == "sqlite_master":  # the schema itself: the store cannot even be opened
        import shutil
        import sqlite3

        copy = tmp_path / "damaged-schema"
        shutil.copytree(home, copy)
        with sqlite3.connect(copy / "validator.db") as c:
            c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            page_size = c.execute("PRAGMA page_size").fetchone()[0]
        c.close()
        data = bytearray((copy / "validator.db").read_bytes())
        data[page_size - 32 : page_size] = bytes((i * 37 + 11) % 256 for i in range(32))
        (copy / "validator.db").write_bytes(bytes(data))
    else:
        copy = _damaged_copy(home, tmp_path, table=table, at=at)
    code, doc = _check(copy, capsys)
    assert code == 1 and doc["ok"] is False
    assert doc["problems"] and all(isinstance(p, str) for p in doc["problems"])
    assert doc["problems"][0].startswith("database: ")  # SQLite's own check comes first


def test_admin_check_answers_a_damaged_database_with_the_report(home: Path, tmp_path: Path) -> None:
    import asyncio

    import httpx

    from validator.app.api import create_app
    from validator.service import Service
    from validator.settings import Settings

    copy = _damaged_copy(home, tmp_path, table="tensors", at="header")

    async def go() -> tuple[int, dict]:
        svc = Service(Settings(home=copy, tokens=("t0k",)))
        try:
            transport = httpx.ASGITransport(app=create_app(svc.settings, service=svc))
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
                r = await c.post("/api/v1/admin/check", headers={"Authorization": "Bearer t0k"})
                return r.status_code, r.json()
        finally:
            svc.close()

    status, doc = asyncio.run(go())
    assert status == 200 and doc["ok"] is False
    assert any("malformed" in p for p in doc["problems"]), doc


@pytest.mark.parametrize(
    ("column", "damage"),
    [("runs.manifest", "UPDATE runs SET manifest = substr(manifest, 1, 20)"),
     ("tensors.shape", "UPDATE tensors SET shape = '[256,' WHERE id = (SELECT min(id) FROM tensors)"),
     ("tensors.slot", "UPDATE tensors SET slot = '{\"c\": {' WHERE id = (SELECT min(id) FROM tensors)")],
)
def test_check_parses_every_stored_json_column_and_show_says_what_is_damaged(home: Path, capsys, column: str, damage: str) -> None:
    import sqlite3

    with sqlite3.connect(home / "validator.db") as c:
        c.execute(damage)
    c.close()
    code, doc = _check(home, capsys)
    assert code == 1 and any(p.startswith("run 'r'") and column in p for p in doc["problems"]), doc
    capsys.readouterr()
    assert main(["--home", str(home), "show", "r"]) == 2  # the stored run is unusable input, not an internal error
    err = capsys.readouterr().err
    assert err.startswith("validator: error: run 'r'") and column.split(".")[1] in err and "damaged" in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_show_on_a_damaged_database_says_so(home: Path, tmp_path: Path, capsys) -> None:
    copy = _damaged_copy(home, tmp_path, table="tensors", at="header")
    capsys.readouterr()
    assert main(["--home", str(copy), "show", "r"]) == 2
    err = capsys.readouterr().err
    assert "database could not be read" in err and "malformed" in err and "internal error" not in err, err
