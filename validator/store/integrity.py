"""Checking a store: does what the database says match what the blob store holds?

Problems found (each one line, naming the blob or file):

- the database's own check fails (SQLite ``PRAGMA integrity_check``; on PostgreSQL the catalog is read);
- a row (tensor, artifact, upload) points at a blob the blobs table does not hold, or disagrees on its size;
- a blob row's object is missing or has another size; with ``deep``, a local blob's bytes do not hash to its
  name;
- a blob row nothing points at, or (local store) a blob file with no row: an orphan;
- (local store) a file or folder in the blob directory that is not a blob (nor its write spool, ``tmp/``);
- a temporary file or staging directory left by a process that is gone;
- a stored JSON column the readers cannot decode (a manifest or a shape cut short: :func:`crud.damaged_rows`);
- a table the database cannot read (a damaged page): named, and what depends on it is not judged.

Read-only: it reports, it does not repair. It never raises for what it reads: a damaged store is its answer.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from validator.store import crud
from validator.store.blobs import LocalBlobStore, blob_files, stale_temp

__all__ = ["check_store", "database_problems"]

T = TypeVar("T")

_READ = 1 << 20


def database_problems(url: str) -> list[str] | None:
    """SQLite's own integrity check of the database at ``url``, run first, alone, before the store is opened
    (opening it migrates): its problems as ``database: ...`` lines, or None when it is not a SQLite file."""
    got = crud.sqlite_integrity(url)
    return None if got is None else [f"database: {p}" for p in got]


def _unreadable(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None)  # the driver's message, without SQLAlchemy's statement and link
    return f"{type(orig or exc).__name__}: {orig or exc}".splitlines()[0][:300]


def check_store(session: Session, blobs: Any, *, staging_dir: Path, deep: bool = True, database: bool = True) -> list[str]:
    """Every problem found in the store (empty: consistent). ``blobs``: the store's blob store. ``database``:
    run the database's own check too (False when :func:`database_problems` already did)."""
    problems: list[str] = []

    def read(what: str, fn: Callable[[], T]) -> T | None:
        try:
            return fn()
        except (SQLAlchemyError, UnicodeDecodeError) as exc:  # a damaged page: say what could not be read
            session.rollback()
            problems.append(f"database: could not read {what}: {_unreadable(exc)}")
            return None

    if database:
        got = read("the database's own check (SQLite integrity_check)", lambda: crud.database_problems(session))
        problems += [f"database: {p}" for p in got or ()]
    damaged = read("the stored JSON columns", lambda: crud.damaged_rows(session))
    problems += damaged or []
    rows = read("the blobs table", lambda: crud.blob_sizes(session))
    refs = read("the tensors, artifacts and uploads tables", lambda: crud.blob_references(session))
    used: set[str] = set()
    for what, sha, nbytes in refs or ():
        used.add(sha)
        if rows is None:
            continue
        if sha not in rows:
            problems.append(f"{what} row points at blob {sha}, which the blobs table does not hold")
        elif what != "upload" and nbytes != rows[sha]:
            problems.append(f"{what} row says blob {sha} has {nbytes} bytes, the blobs table {rows[sha]}")
    if rows is not None:
        if refs is not None:  # orphans only when every reference was read
            problems += [f"blob {sha}: no tensor, artifact or upload points at it (orphan row)" for sha in sorted(rows.keys() - used)]
        problems += _objects(blobs, rows, deep)
    for directory, kinds in _temp_dirs(blobs, staging_dir):
        problems += [f"{p}: left by a process that is gone" for p in stale_temp(directory, kinds=kinds)]
    return problems


def _objects(blobs: Any, rows: dict[str, int], deep: bool) -> list[str]:
    problems = []
    local = blobs if isinstance(blobs, LocalBlobStore) else None
    for sha, nbytes in sorted(rows.items()):
        if local is None:
            if not blobs.exists(sha):
                problems.append(f"blob {sha}: missing from the object store")
            continue
        path = local.path(sha)
        if not path.is_file():
            problems.append(f"blob {sha}: missing ({path.name} not in {path.parent.name}/)")
        elif path.stat().st_size != nbytes:
            problems.append(f"blob {sha}: {path.stat().st_size} bytes on disk, {nbytes} recorded")
        elif deep and _sha256(path) != sha:
            problems.append(f"blob {sha}: its bytes hash to something else (corrupt)")
    if local is not None:
        found, foreign = blob_files(local.root)
        problems += [f"blob file {sha[:2]}/{sha[2:]}: no row in the blobs table (orphan file)" for sha, _ in found if sha not in rows]
        problems += [f"blobs/{name}: not a blob of this store (a foreign file or folder; nothing removes it)" for name in foreign]
    return problems


def _temp_dirs(blobs: Any, staging_dir: Path) -> list[tuple[Path, tuple[str, ...]]]:
    out: list[tuple[Path, tuple[str, ...]]] = [(staging_dir, ("tmp", "finalize"))]
    for spool in (getattr(blobs, "tmp", None), getattr(getattr(blobs, "cache", None), "tmp", None)):
        if spool is not None:
            out.append((Path(spool), ("tmp",)))
    return out


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_READ):
            h.update(chunk)
    return h.hexdigest()
