"""Runs pushed over the network: a pending run, its bundle files uploaded one by one, then finalize.

Client-chosen names are checked against a strict pattern and never become paths: a file in progress
lives under a name derived from a hash, a received file becomes a content-addressed blob, and
finalize assembles the bundle in a private temporary directory from those blobs.

Uploads are idempotent (the same content again is a no-op) and resumable per file (``offset`` appends
to the bytes received so far; ``status`` says how many arrived). The size cap is enforced while
streaming.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterable
from datetime import UTC
from pathlib import Path
from typing import TYPE_CHECKING, Any

from probes.core.bundle import MANIFEST, PART_FILE, PART_RE
from validator.errors import ConflictError, InputError, NotFoundError, StorageError, ValidatorError
from validator.runs.sources import read_bundle
from validator.service.cycle_collector import cycle_collector_paused
from validator.service.expiry import activity_marker, collect, expired_marker, leave_marker, partial_glob
from validator.store import crud as store
from validator.store.blobs import temp_prefix
from validator.store.models import Run

if TYPE_CHECKING:
    from validator.service.core import RunSummary, Service

__all__ = ["create_pending", "upload_file", "upload_status", "finalize", "check_file_name"]

_FILE_RE = re.compile(r"(tensors-[0-9]{5}\.safetensors|part\.json|acceptance\.jsonl|logprobs\.jsonl|gsm8k\.jsonl|metrics\.json)")
ROOT_PART = "_root"  # the manifest's pseudo-part


def check_file_name(part: str, filename: str) -> None:
    if part == ROOT_PART:
        if filename != MANIFEST:
            raise InputError(f"only {MANIFEST} may be uploaded at the bundle root, not {filename!r}")
        return
    if not PART_RE.fullmatch(part) or ".." in part:
        raise InputError(f"part name {part!r} must be 1-64 letters, digits, '_', '.', '-'")
    if not _FILE_RE.fullmatch(filename):
        raise InputError(
            f"file name {filename!r} is not a bundle file (tensors-NNNNN.safetensors, part.json, acceptance.jsonl, "
            "logprobs.jsonl, gsm8k.jsonl)"
        )


def _pending_run(svc: Service, ref: str) -> Run:
    with svc.session() as s:
        run = store.get_run(s, ref=ref, include_pending=True)
    if run is None:
        if expired_marker(svc.settings.staging_dir, ref).exists():
            raise NotFoundError(f"run {ref!r} is no longer pending (finalized, or expired unfinished); push it again")
        raise NotFoundError(f"no run named {ref!r}")
    if run.status != "pending":
        raise ConflictError(f"run {run.name!r} is already finalized")
    return run


def create_pending(svc: Service, *, name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """Create a pending run; a retry with the same name of a still-pending run returns it again. Pending
    runs abandoned for longer than the expiry age are collected first (validator.service.expiry)."""
    store.check_run_name(name)
    store.check_labels(labels or {}, where=f"run {name!r}")
    collect(svc)
    with svc.session() as s, s.begin():
        run = store.get_run(s, ref=name, include_pending=True)
        if run is not None:
            if run.status == "pending" and run.name == name:
                return {"id": run.id, "name": run.name, "status": run.status}
            raise ConflictError(f"a run named {name!r} already exists")
        run = store.create_run(s, name=name, source="upload", manifest={}, labels=labels or {})
        expired_marker(svc.settings.staging_dir, name).unlink(missing_ok=True)
        return {"id": run.id, "name": run.name, "status": run.status}


def _run_key(run: Run) -> str:
    """What tells this run's staging files from those of an expired run given the same id: a hash of its id
    and creation time."""
    at = run.created_at
    created = (at if at.tzinfo else at.replace(tzinfo=UTC)).timestamp() if at else 0.0  # whatever the session's zone
    return hashlib.sha256(f"{run.id}\0{created}".encode()).hexdigest()[:32]


def _partial_path(svc: Service, run: Run, part: str, filename: str) -> Path:
    """``RUNID.KEY.partial``: the run id lets expiry find a run's files in progress; the key also hashes the
    run's creation time, so a file left by an expired run is never resumed by a later run given its id."""
    at = run.created_at
    created = (at if at.tzinfo else at.replace(tzinfo=UTC)).timestamp() if at else 0.0  # whatever the session's zone
    key = hashlib.sha256(f"{run.id}\0{created}\0{part}\0{filename}".encode()).hexdigest()
    d = svc.settings.staging_dir
    d.mkdir(parents=True, exist_ok=True)
    return d / partial_glob(run.id).replace("*", key)


def upload_status(svc: Service, *, run: str, part: str, filename: str) -> dict[str, Any]:
    check_file_name(part, filename)
    r = _pending_run(svc, run)
    with svc.session() as s:
        done = {(u.part, u.filename): u for u in store.run_uploads(s, run_id=r.id)}
    if (part, filename) in done:
        u = done[(part, filename)]
        return {"complete": True, "received": u.nbytes, "sha256": u.sha256}
    p = _partial_path(svc, r, part, filename)
    return {"complete": False, "received": p.stat().st_size if p.exists() else 0, "sha256": None}


def upload_file(
    svc: Service,
    *,
    run: str,
    part: str,
    filename: str,
    chunks: Iterable[bytes],
    offset: int = 0,
    final: bool = True,
    expect_sha256: str | None = None,
) -> dict[str, Any]:
    """Receive (part of) one file. ``offset`` must equal the bytes already received; ``final`` ends it."""
    check_file_name(part, filename)
    r = _pending_run(svc, run)
    st = upload_status(svc, run=run, part=part, filename=filename)
    if st["complete"]:
        # a retry of a finished file: drain and compare
        h, n = hashlib.sha256(), 0
        for c in chunks:
            h.update(c)
            n += len(c)
        if offset == 0 and h.hexdigest() != st["sha256"]:
            raise ConflictError(f"{part}/{filename} was already uploaded with different content")
        return {**st, "created": False}
    if offset != st["received"]:
        raise ConflictError(f"{part}/{filename}: offset {offset} but {st['received']} bytes were received so far")
    cap = svc.settings.max_upload_bytes
    p = _partial_path(svc, r, part, filename)
    with open(p, "ab") as f:
        # One writer per file: a retry that overlaps the original request (a client timeout) must not
        # interleave bytes with it. The lock dies with the process, so a crash never blocks a resume.
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConflictError(f"{part}/{filename}: another upload of this file is in progress") from None
        try:
            same = os.path.samestat(os.fstat(f.fileno()), os.stat(p))
        except FileNotFoundError:
            same = False
        if not same:  # the upload that held the lock finished this file meanwhile
            raise ConflictError(f"{part}/{filename}: uploaded concurrently; ask for its status and retry")
        size = os.fstat(f.fileno()).st_size
        if offset != size:
            raise ConflictError(f"{part}/{filename}: offset {offset} but {size} bytes were received so far")
        try:
            for c in chunks:
                size += len(c)
                if size > cap:
                    p.unlink(missing_ok=True)
                    raise InputError(f"{part}/{filename}: larger than the {cap}-byte upload limit")
                f.write(c)
            f.flush()
        except OSError as exc:  # disk full: free what this file took, say so
            p.unlink(missing_ok=True)
            raise StorageError(f"{part}/{filename}: cannot store the upload: {exc.strerror or exc}") from None
        if not final:
            return {"complete": False, "received": size, "sha256": None, "created": False}

        def read() -> Iterable[bytes]:
            with open(p, "rb") as f:
                while b := f.read(1 << 20):
                    yield b

        try:
            sha, n, new = svc.blobs.put(read(), expect_sha256=expect_sha256)
        except ValidatorError as exc:
            p.unlink(missing_ok=True)
            raise type(exc)(f"{part}/{filename}: {exc}") from None
        try:
            with svc.session() as s, s.begin():
                store.blob_gc_lock(s, exclusive=False)  # no collection deletes blobs until this commits
                alive = s.get(Run, r.id)
                if alive is None or alive.status != "pending" or alive.name != r.name:
                    raise NotFoundError(f"run {r.name!r} is no longer pending (finalized, or expired unfinished)")
                if not svc.blobs.exists(sha):  # found present, then collected before this transaction began
                    svc.blobs.put(read(), expect_sha256=sha)
                store.add_blobs(s, blobs={sha: n})
                created = store.add_upload(s, run_id=r.id, part=part, filename=filename, sha256=sha, nbytes=n)
        except NotFoundError:
            p.unlink(missing_ok=True)
            svc.discard_blobs([sha] if new else [])
            raise
        # the run's activity: this file's last byte (before its partial goes, so that expiry always sees one)
        leave_marker(activity_marker(svc.settings.staging_dir, r.id, _run_key(r)))
        p.unlink(missing_ok=True)
    return {"complete": True, "received": n, "sha256": sha, "created": created}


def finalize(svc: Service, *, run: str) -> RunSummary:
    """Validate the uploaded bundle and make the run visible, atomically."""
    r = _pending_run(svc, run)
    with svc.session() as s:
        ups = list(store.run_uploads(s, run_id=r.id))
    if not any(u.part == ROOT_PART for u in ups):
        raise InputError(f"run {r.name!r}: {MANIFEST} was not uploaded")
    svc.settings.staging_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=temp_prefix("finalize"), dir=svc.settings.staging_dir))
    try:
        for u in ups:
            dest = tmp / MANIFEST if u.part == ROOT_PART else tmp / "parts" / u.part / u.filename
            dest.parent.mkdir(parents=True, exist_ok=True)
            src = svc.blobs.path(u.sha256)
            try:
                os.link(src, dest)
            except FileNotFoundError:  # collected: the run expired while this finalize began
                raise NotFoundError(f"run {r.name!r} expired unfinished; push it again") from None
            except OSError:
                shutil.copyfile(src, dest)
        for part_dir in (tmp / "parts").iterdir() if (tmp / "parts").exists() else []:
            names = {p.name for p in part_dir.iterdir()}
            if PART_FILE not in names and not names <= {"acceptance.jsonl", "logprobs.jsonl"}:  # records-only parts are whole
                raise InputError(f"run {r.name!r}: part {part_dir.name!r} has no {PART_FILE} (upload incomplete)")
        with cycle_collector_paused():
            view = read_bundle(tmp)
            view.location = f"upload:{r.id}"
            summary = svc.ingest_view(view, name=r.name, pending=r.id)
        activity_marker(svc.settings.staging_dir, r.id, _run_key(r)).unlink(missing_ok=True)
        return summary
    except ValidatorError as exc:  # messages name files in the staging folder: never show the server's paths
        msg = str(exc).replace(str(tmp) + os.sep, "").replace(str(tmp), "the upload")
        raise type(exc)(f"run {r.name!r}: {msg}" if r.name not in msg else msg) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
