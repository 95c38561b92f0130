"""Expiring abandoned pending runs and collecting the blobs only they held (validator.service.expiry)."""

from __future__ import annotations

import json
import os
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import torch
from sqlalchemy import select, update

from probes import BundleWriter
from validator.errors import InputError, NotFoundError
from validator.service import uploads
from validator.settings import Settings
from validator.store.models import Blob, Run, Upload

DAY = 24 * 3600


def _age(service, name: str, days: float) -> None:
    """Make a run look created ``days`` ago (the database's clock is the only one expiry reads for runs)."""
    with service.session() as s, s.begin():
        s.execute(update(Run).where(Run.name == name).values(created_at=datetime.now(UTC) - timedelta(days=days)))


def _upload(service, run: str, part: str, filename: str, data: bytes, *, final: bool = True) -> dict:
    return uploads.upload_file(service, run=run, part=part, filename=filename, chunks=[data], final=final)


def _blob_rows(service) -> set[str]:
    with service.session() as s:
        return set(s.scalars(select(Blob.sha256)))


def _partials(service) -> list[Path]:
    return sorted(service.settings.staging_dir.glob("*.partial"))


def _idle(service, days: float) -> None:
    """Make every file in progress, and every run's last completed file, look written ``days`` ago."""
    staging = service.settings.staging_dir
    for p in [*staging.glob("*.partial"), *staging.glob("*.active")]:
        os.utime(p, (time.time() - days * DAY,) * 2)


def test_an_abandoned_pending_run_expires_with_what_only_it_held(service) -> None:
    shared, own = b"a file two runs uploaded", b"a file only the abandoned run uploaded"
    uploads.create_pending(service, name="abandoned")
    sha_shared = _upload(service, "abandoned", "p0", "tensors-00000.safetensors", shared)["sha256"]
    sha_own = _upload(service, "abandoned", "p0", "tensors-00001.safetensors", own)["sha256"]
    _upload(service, "abandoned", "p1", "tensors-00000.safetensors", b"half a fi", final=False)
    uploads.create_pending(service, name="active")
    _upload(service, "active", "p0", "tensors-00000.safetensors", shared)
    assert len(_partials(service)) == 1
    _age(service, "abandoned", 8)
    _idle(service, 8)  # nothing received for as long

    got = service.collect()

    assert got.expired_runs == ["abandoned"] and got.blobs == 1 and got.bytes == len(own)
    with service.session() as s:
        assert s.scalars(select(Run.name)).all() == ["active"]
        assert {u.sha256 for u in s.scalars(select(Upload))} == {sha_shared}
    assert _blob_rows(service) == {sha_shared}
    assert service.blobs.exists(sha_shared) and not service.blobs.exists(sha_own)
    assert _partials(service) == [] and len(list(service.settings.staging_dir.glob("*.active"))) == 1  # "active"'s
    assert service.check_store() == []
    assert service.collect().expired_runs == []  # nothing left to do


def test_a_pending_run_still_receiving_a_file_is_kept(service) -> None:
    uploads.create_pending(service, name="slow")
    _age(service, "slow", 8)  # old, but a file received bytes just now
    _upload(service, "slow", "p0", "tensors-00000.safetensors", b"first bytes", final=False)
    assert service.collect(full=True).expired_runs == []
    assert uploads.upload_status(service, run="slow", part="p0", filename="tensors-00000.safetensors")["received"] == 11


def test_a_push_active_between_files_is_kept(service) -> None:
    """Activity counts from the last byte received: a file that took longer than the expiry age to stream
    keeps its run once complete, and the push's next file is accepted."""
    uploads.create_pending(service, name="long")
    _age(service, "long", 8)
    _upload(service, "long", "p0", "tensors-00000.safetensors", b"a file streamed for ", final=False)
    _idle(service, 0.5)  # streaming, well within the age
    uploads.upload_file(service, run="long", part="p0", filename="tensors-00000.safetensors", chunks=[b"days"], offset=20)
    assert service.collect().expired_runs == []  # its last byte arrived just now
    assert _upload(service, "long", "p0", "part.json", b"{}")["complete"]
    _idle(service, 8)  # and then nothing for longer than the age
    assert service.collect().expired_runs == ["long"]


def test_young_pending_runs_and_complete_runs_are_never_collected(service, tmp_path: Path) -> None:
    with BundleWriter(tmp_path / "done", run_name="done", part="p0") as w:
        w.add("x", torch.arange(8.0))
    service.ingest(tmp_path / "done")
    _age(service, "done", 30)
    uploads.create_pending(service, name="young")
    _upload(service, "young", "p0", "part.json", b"{}")
    before = _blob_rows(service)
    got = service.collect(full=True)
    assert got.expired_runs == [] and got.blobs == 0
    assert _blob_rows(service) == before
    assert service.compare("done", str(tmp_path / "done")).verdict == "pass"
    assert service.check_store() == []


def test_creating_a_run_collects_expired_ones(service) -> None:
    """The server's automatic collection: every POST /runs first expires what is due (one query otherwise)."""
    uploads.create_pending(service, name="old")
    sha = _upload(service, "old", "p0", "part.json", b'{"tensors": []}')["sha256"]
    _age(service, "old", 8)
    _idle(service, 8)
    uploads.create_pending(service, name="new")
    with service.session() as s:
        assert s.scalars(select(Run.name)).all() == ["new"]
    assert not service.blobs.exists(sha) and sha not in _blob_rows(service)
    with pytest.raises(NotFoundError, match="run 'old' is no longer pending"):  # what the push is told
        _upload(service, "old", "p0", "tensors-00000.safetensors", b"late")
    with pytest.raises(NotFoundError, match="no run named 'never'"):
        _upload(service, "never", "p0", "tensors-00000.safetensors", b"late")
    uploads.create_pending(service, name="old")  # pushed again: a run like any other
    assert uploads.upload_status(service, run="old", part="p0", filename="part.json")["received"] == 0
    assert service.check_store() == []


def test_the_expiry_age_is_a_setting(settings: Settings) -> None:
    from dataclasses import replace

    from validator.service import Service

    assert settings.pending_expiry_hours == 7 * 24
    assert Settings.from_env({"VALIDATOR_PENDING_EXPIRY_HOURS": "1.5"}, home="/x").pending_expiry_hours == 1.5
    for bad in ("soon", "0", "-3", "nan", "inf"):
        with pytest.raises(InputError, match="VALIDATOR_PENDING_EXPIRY_HOURS|pending_expiry_hours"):
            Settings.from_env({"VALIDATOR_PENDING_EXPIRY_HOURS": bad}, home="/x")
    svc = Service(replace(settings, pending_expiry_hours=1.0))
    try:
        uploads.create_pending(svc, name="hour")
        _age(svc, "hour", 0.5 / 24)
        assert svc.collect().expired_runs == []
        _age(svc, "hour", 2 / 24)
        assert svc.collect().expired_runs == ["hour"]
    finally:
        svc.close()


def test_a_file_left_by_an_expired_run_is_never_resumed_by_a_later_run(service) -> None:
    """SQLite gives a deleted highest id to the next run: the partial upload of the expired one must not
    become the new run's "bytes received so far"."""
    uploads.create_pending(service, name="gone")
    _age(service, "gone", 8)
    _upload(service, "gone", "p0", "tensors-00000.safetensors", b"stale prefix", final=False)
    leftover = _partials(service)[0]
    os.utime(leftover, (time.time() - 8 * DAY,) * 2)
    keep = leftover.read_bytes()
    assert service.collect().expired_runs == ["gone"]
    leftover.write_bytes(keep)  # even if a stalled request of the dead run writes it back afterwards
    uploads.create_pending(service, name="gone")
    st = uploads.upload_status(service, run="gone", part="p0", filename="tensors-00000.safetensors")
    assert st == {"complete": False, "received": 0, "sha256": None}


def test_a_full_collection_takes_unreferenced_blobs_and_old_orphan_files_only(service) -> None:
    sha_row, _, _ = service.blobs.put([b"a blob row nothing points at"])
    with service.session() as s, s.begin():
        s.add(Blob(sha256=sha_row, nbytes=28))
    old_file, _, _ = service.blobs.put([b"written by a finalize that died last month"])
    os.utime(service.blobs.path(old_file), (time.time() - 30 * DAY,) * 2)
    fresh_file, _, _ = service.blobs.put([b"written by an ingest that has not committed yet"])
    staging = service.settings.staging_dir
    staging.mkdir(parents=True, exist_ok=True)
    dead = staging / "finalize.999999999.abc"  # a dead process's temporary directory
    dead.mkdir()
    old_partial = staging / ("7." + "0" * 64 + ".partial")
    old_partial.write_bytes(b"x")
    os.utime(old_partial, (time.time() - 30 * DAY,) * 2)

    got = service.collect(full=True)

    assert got.blobs == 2 and got.staging_files == 2
    assert not service.blobs.exists(sha_row) and not service.blobs.exists(old_file)
    assert service.blobs.exists(fresh_file)  # a write in progress looks like this: kept
    assert _blob_rows(service) == set() and not dead.exists() and not old_partial.exists()
    assert service.check_store() == [f"blob file {fresh_file[:2]}/{fresh_file[2:]}: no row in the blobs table (orphan file)"]


def test_an_ingest_whose_blob_is_collected_before_its_transaction_writes_it_again(
    service, tmp_path: Path, monkeypatch
) -> None:
    """Race: an ingest finds a tensor's blob already present (an abandoned upload's), and a collection deletes
    it before the ingest's transaction begins. The ingest must not commit a row pointing at nothing."""
    from validator.service import core as service_mod

    t = torch.arange(16.0)
    path = tmp_path / "y"
    with BundleWriter(path, run_name="y", part="p0") as w:
        w.add("x", t)
    sha = json.loads((path / "parts" / "p0" / "part.json").read_text())["tensors"][0]["sha256"]
    uploads.create_pending(service, name="abandoned")
    _upload(service, "abandoned", "p0", "tensors-00000.safetensors", t.numpy().tobytes())
    assert service.blobs.exists(sha)
    _age(service, "abandoned", 8)
    _idle(service, 8)
    original = service_mod.store.blob_gc_lock
    fired = []

    def lock(session, *, exclusive: bool) -> None:
        if not exclusive and not fired:  # the collection runs just before the ingest's transaction
            fired.append(service.collect())
            assert not service.blobs.exists(sha)
        original(session, exclusive=exclusive)

    monkeypatch.setattr(service_mod.store, "blob_gc_lock", lock)
    service.ingest(path)
    assert fired and fired[0].expired_runs == ["abandoned"]
    assert service.blobs.exists(sha) and service.check_store() == []
    assert service.compare("y", str(path)).verdict == "pass"
