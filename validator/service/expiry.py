"""Expiring abandoned uploads: pending runs nobody finalized, and the blobs only they held.

A pending run (``POST /runs`` or ``validator push``, never finalized) expires once it was created more than
``Settings.pending_expiry_hours`` ago and it has received no byte for that long: no file in progress has
(a partial upload's modification time) and no file completed since (the run's activity marker in staging,
touched as each file completes; :func:`activity_marker`). Expiring it deletes the run's row (with its upload rows and labels), its
partial uploads in staging, and every blob no stored row references any more. :func:`collect` with
``full=False`` is what the server runs on every run creation and at startup (one indexed query when nothing
is due); ``full=True`` (``validator gc``, ``POST /api/v1/admin/gc``) also collects every other unreferenced
blob, blob files without a row (the leftovers of a finalize that died; only when older than the expiry age,
so a write in progress is left alone, and rewritten by its writer should a tiny ``--older-than`` take it),
partial uploads untouched for that long and the temporary files of dead processes.

Concurrent writers are safe by the blob-GC lock (:func:`validator.store.crud.blob_gc_lock`): the reference
check and every deletion happen inside one transaction holding it exclusively, and every transaction that
commits references to blobs (an upload recording its file, a finalize or ingest recording its tensors)
holds it shared, checks that each blob it references exists, writes back any that is missing from its own
copy, and only then commits. So a blob found present and deleted before the referencing transaction began
is written again, and none can be deleted between that check and the commit.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from validator.errors import InputError
from validator.service.access import StoreAccess
from validator.store import crud as store
from validator.store.blobs import LocalBlobStore, blob_files, remove_stale_temp

__all__ = ["Collected", "activity_marker", "collect", "expired_marker", "leave_marker", "partial_glob", "MAX_AGE_HOURS"]

MAX_AGE_HOURS = 1e6  # an expiry age beyond this overflows dates


@dataclass
class Collected:
    """What a collection removed."""

    expired_runs: list[str] = field(default_factory=list)
    blobs: int = 0  # blob objects and rows deleted
    bytes: int = 0  # their size
    staging_files: int = 0  # partial uploads and dead processes' temporary files
    foreign: list[str] = field(default_factory=list)  # (full, local store) entries of blobs/ that are not blobs: left alone

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def partial_glob(run_id: int) -> str:
    """The names of a pending run's partial uploads in staging (see validator.service.uploads)."""
    return f"{run_id}.*.partial"


def activity_marker(staging: Path, run_id: int, run_key: str) -> Path:
    """``RUNID.KEY.active``: an empty file whose modification time is when the run's last completed file
    received its last byte (``run_key``: what tells this run from an expired one given the same id)."""
    return staging / f"{run_id}.{run_key}.active"


def expired_marker(staging: Path, name: str) -> Path:
    """``expired.HASH``: left when a pending run named ``name`` expires, so that a push still sending to it
    is told so (``is no longer pending``) rather than that no such run exists; removed when a run of that
    name is created again, and by a full collection once older than the expiry age."""
    return staging / f"expired.{hashlib.sha256(name.encode()).hexdigest()}"


def _last_write(staging: Path, run_id: int) -> float:
    """When a file of this run last received bytes: a file in progress, or the last one completed (0: none)."""
    latest = 0.0
    if not staging.is_dir():
        return latest
    for p in [*staging.glob(partial_glob(run_id)), *staging.glob(f"{run_id}.*.active")]:
        try:
            latest = max(latest, p.stat().st_mtime)
        except FileNotFoundError:  # finished meanwhile: it was being written to just now
            latest = time.time()
    return latest


def collect(svc: StoreAccess, *, full: bool = False, older_than_hours: float | None = None) -> Collected:
    """Expire pending runs older than the expiry age (``older_than_hours`` overrides the setting) and delete
    what only they held; ``full``: also every other unreferenced blob and staging leftover (module doc)."""
    if older_than_hours is not None and not 0 <= older_than_hours <= MAX_AGE_HOURS:
        raise InputError(f"--older-than {older_than_hours} must be a number of hours from 0 to {MAX_AGE_HOURS:g}")
    age_s = 3600 * (svc.settings.pending_expiry_hours if older_than_hours is None else older_than_hours)
    cutoff = time.time() - age_s
    created_before = datetime.fromtimestamp(cutoff, UTC)
    staging = svc.settings.staging_dir
    out = Collected()
    if not full:
        with svc.session() as s:
            if not store.pending_runs(s, created_before=created_before):
                return out  # the common case: one query on an indexed column
    with svc.session() as s, s.begin():
        store.blob_gc_lock(s, exclusive=True)
        due = [(r.id, r.name) for r in store.pending_runs(s, created_before=created_before)]
        expired = [(i, name) for i, name in due if _last_write(staging, i) < cutoff]
        ids = [i for i, _ in expired]
        candidates = store.upload_blobs(s, run_ids=ids)
        store.delete_runs(s, ids=ids)
        if full:
            gone = store.unreferenced_blob_rows(s)
        else:
            gone = store.blob_sizes(s, shas=store.unreferenced_blobs(s, candidates=candidates))
        for sha in gone:
            svc.blobs.delete(sha)
        store.delete_blob_rows(s, shas=list(gone))
        if full and isinstance(svc.blobs, LocalBlobStore):
            rows = set(store.blob_sizes(s))
            found, out.foreign = blob_files(svc.blobs.root)
            for sha, path in found:
                if sha not in rows and path.stat().st_mtime < cutoff:  # a finalize that died long ago
                    out.bytes += path.stat().st_size
                    out.blobs += 1
                    path.unlink(missing_ok=True)
        for i in ids:
            for p in staging.glob(partial_glob(i)) if staging.is_dir() else ():
                p.unlink(missing_ok=True)
                out.staging_files += 1
            for p in staging.glob(f"{i}.*.active") if staging.is_dir() else ():
                p.unlink(missing_ok=True)
        for _, name in expired:
            leave_marker(expired_marker(staging, name))
    out.expired_runs = [name for _, name in expired]
    out.blobs += len(gone)
    out.bytes += sum(gone.values())
    if full:
        out.staging_files += _staging_leftovers(svc, cutoff)
    return out


def _staging_leftovers(svc: StoreAccess, cutoff: float) -> int:
    """Partial uploads untouched since ``cutoff`` (their run expired, or was finalized without them) and the
    temporary files of processes that are gone."""
    staging = svc.settings.staging_dir
    n = len(remove_stale_temp(staging, kinds=("tmp", "finalize")))
    spools = (getattr(svc.blobs, "tmp", None), getattr(getattr(svc.blobs, "cache", None), "tmp", None))
    for d in {Path(x) for x in spools if x is not None}:
        n += len(remove_stale_temp(d, kinds=("tmp",)))
    leftovers = [*staging.glob("*.partial"), *staging.glob("*.active"), *staging.glob("expired.*")] if staging.is_dir() else []
    for p in leftovers:
        try:
            if p.stat().st_mtime < cutoff:
                p.unlink(missing_ok=True)
                n += 1
        except FileNotFoundError:
            pass
    return n



def leave_marker(path: Path) -> None:
    """Create ``path`` empty, or set its modification time to now (best effort: a full disk is no error)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    except OSError:
        pass
