"""Persistence: the only module that talks SQL. Keyword-only functions that take a session.

The embedded default is SQLite in WAL mode under the configured home; any SQLAlchemy URL works
(PostgreSQL in production). The schema is created and upgraded only through Alembic migrations.
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, String, cast, create_engine, delete, event, func, insert, select, text, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session, defer, sessionmaker

from validator._data import migrations_dir
from validator.errors import ConflictError, InputError, ValidatorError
from validator.store.models import Artifact, Blob, ComparisonRecord, Run, RunLabel, Tensor, Upload

__all__ = [
    "make_engine",
    "make_sessionmaker",
    "migrate",
    "downgrade",
    "get_run",
    "check_labels",
    "check_run_name",
    "check_tensor_record",
    "list_runs",
    "count_runs",
    "database_problems",
    "sqlite_integrity",
    "DamagedRowError",
    "damaged_rows",
    "blob_sizes",
    "blob_references",
    "create_run",
    "complete_run",
    "add_upload",
    "run_uploads",
    "get_comparison",
    "save_comparison",
    "interrupt_comparisons",
    "add_blobs",
    "run_tensors",
    "slot_parts",
    "shape_of",
    "unreferenced_blobs",
    "blob_gc_lock",
    "delete_blob_rows",
    "unreferenced_blob_rows",
    "pending_runs",
    "upload_blobs",
    "delete_runs",
]

class DamagedRowError(ValidatorError):
    """A stored row that cannot be read as what it holds (JSON cut short, a shape that is not a list of sizes):
    the store is damaged, not the request. CLI exit 2, HTTP 422; `validator check` lists every such row."""

    http_status = 422


_MAX_ID = 2**31 - 1  # ids are INTEGER columns: a larger number names no row (and would overflow)


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"timeout": 60})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn: Any, _: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=60000")
            cur.close()

        return engine
    return create_engine(url, pool_pre_ping=True)


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


def _alembic(engine: Engine, action: str, revision: str) -> None:
    """Run ``alembic upgrade|downgrade revision`` on ``engine``, with the migrations the package carries."""
    from alembic import command
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("sqlalchemy.url", engine.url.render_as_string(hide_password=False).replace("%", "%%"))
    with migrations_dir() as scripts, engine.begin() as conn:
        cfg.set_main_option("script_location", str(scripts))
        cfg.attributes["connection"] = conn
        getattr(command, action)(cfg, revision)


def migrate(engine: Engine, revision: str = "head") -> None:
    """Upgrade the schema (creates it on an empty database)."""
    _alembic(engine, "upgrade", revision)


def downgrade(engine: Engine, revision: str) -> None:
    _alembic(engine, "downgrade", revision)


# -- runs ---------------------------------------------------------------------------------------


# Unicode categories refused in a run name: controls (C0, DEL, C1 such as NEL), format characters (bidi
# overrides such as U+202E), line and paragraph separators, surrogates, private use, unassigned.
_NAME_REFUSED = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"})


def check_run_name(name: object) -> str:
    """A run name the store, the URLs and the dashboard can all hold: 1-200 characters, no control or
    format characters, no '/' or '\\', not '.' or '..', and not only digits (those are run ids: a name
    never shadows an id)."""
    if not isinstance(name, str) or not 1 <= len(name) <= 200:
        raise InputError("run name must be 1-200 characters")
    bad = sorted({f"U+{ord(c):04X}" for c in name if unicodedata.category(c) in _NAME_REFUSED})
    if bad:
        raise InputError(f"run name {name!r:.80} holds control or format characters ({', '.join(bad[:5])})")
    if "/" in name or "\\" in name or name in (".", ".."):
        raise InputError(f"run name {name!r:.80} must not contain '/' or '\\' nor be '.' or '..'")
    if name.isascii() and name.isdigit():
        raise InputError(f"run name {name!r} is only digits: that is how run ids are written; add a letter")
    return name


MAX_LABELS = 100  # per run: every listing shows a run's labels


def check_labels(labels: dict[str, str], *, where: str = "run") -> None:
    """Labels the columns can hold: at most MAX_LABELS, keys 1-100 characters, values at most 500, no NUL
    (PostgreSQL refuses it)."""
    if len(labels) > MAX_LABELS:
        raise InputError(f"{where}: {len(labels)} labels; a run may carry at most {MAX_LABELS}")
    for k, v in labels.items():
        if not (isinstance(k, str) and isinstance(v, str) and 1 <= len(k) <= 100 and len(v) <= 500 and "\0" not in k + v):
            raise InputError(
                f"{where}: label {k!r:.60}={v!r:.60} refused: keys must be 1-100 characters, values at most 500, without NUL"
            )


def check_tensor_record(*, name: str, coords: dict[str, Any], shard: dict[str, Any], where: str = "") -> None:
    """A tensor record the columns can hold (its coordinates and shard spec, as stored, fit in 1000 characters)."""
    if len(_slot(coords, shard)) > 1000:
        raise InputError(f"{where}tensor {name!r}: coordinates and shard spec longer than 1000 characters")


def get_run(session: Session, *, ref: str, include_pending: bool = False) -> Run | None:
    """A run by numeric id (ASCII digits: names never are, see :func:`check_run_name`), else by name."""
    if "\0" in ref:  # no name holds NUL (and PostgreSQL refuses to compare one)
        return None
    if ref.isascii() and ref.isdigit():
        where: Any = Run.id == int(ref) if int(ref) <= _MAX_ID else None  # not 2**70
    else:
        where = Run.name == ref
    if where is None:
        return None
    try:
        run = session.scalars(select(Run).where(where)).first()
    except ValueError as exc:  # the manifest's JSON does not decode
        got = session.execute(select(Run.id, Run.name).where(where)).first()
        what = f"run {got.name!r} (id {got.id})" if got else f"run {ref!r}"
        raise DamagedRowError(f"{what}: its stored manifest (runs.manifest) is damaged: {exc}; see `validator check`") from None
    if run is not None and run.status != "complete" and not include_pending:
        return None
    return run


def _complete_runs(labels: dict[str, str] | None) -> Any:
    q = select(Run).where(Run.status == "complete")
    for k, v in (labels or {}).items():
        q = q.where(Run.labels.any((RunLabel.key == k) & (RunLabel.value == v)))
    return q


def list_runs(
    session: Session, *, labels: dict[str, str] | None = None, limit: int = 100, offset: int = 0
) -> Sequence[Run]:
    """One page of complete runs carrying every label in ``labels``, newest first."""
    if any("\0" in k + v for k, v in (labels or {}).items()):
        return []  # no label holds NUL
    q = _complete_runs(labels).options(defer(Run.manifest))  # a listing never loads manifests
    return session.scalars(q.order_by(Run.id.desc()).limit(limit).offset(offset)).all()


def count_runs(session: Session, *, labels: dict[str, str] | None = None) -> int:
    """How many complete runs carry every label in ``labels`` (all pages together)."""
    if any("\0" in k + v for k, v in (labels or {}).items()):
        return 0
    return int(session.scalar(select(func.count()).select_from(_complete_runs(labels).subquery())) or 0)


def add_blobs(session: Session, *, blobs: dict[str, int]) -> None:
    """Record blobs (sha256 -> size); already known ones are left alone (safe under concurrency)."""
    if not blobs:
        return
    rows = [{"sha256": k, "nbytes": v} for k, v in blobs.items()]
    dialect = session.get_bind().dialect.name
    if dialect == "postgresql":
        stmt: Any = postgresql.insert(Blob).on_conflict_do_nothing()
    elif dialect == "sqlite":
        stmt = sqlite.insert(Blob).on_conflict_do_nothing()
    else:  # pragma: no cover - other databases
        known = set(session.scalars(select(Blob.sha256).where(Blob.sha256.in_(list(blobs)))))
        rows = [r for r in rows if r["sha256"] not in known]
        stmt = insert(Blob)
    if rows:  # one executemany: a statement built once, however many rows
        session.connection().execute(stmt, rows)


_SLOT_JSON = json.JSONEncoder(sort_keys=True, separators=(",", ":")).encode  # one encoder: ~100k records a run


def _slot(coords: dict[str, Any], shard: dict[str, Any]) -> str:
    return _SLOT_JSON({"c": coords, "s": shard})


def create_run(
    session: Session,
    *,
    name: str,
    source: str,
    manifest: dict[str, Any],
    labels: dict[str, str],
) -> Run:
    """Insert a pending run (invisible to listings and comparisons until :func:`complete_run`)."""
    check_labels(labels, where=f"run {name!r}")
    if session.scalars(select(Run.id).where(Run.name == name)).first() is not None:
        raise ConflictError(f"a run named {name!r} already exists")
    run = Run(name=name, status="pending", source=source, manifest=manifest, n_tensors=0, total_bytes=0)
    run.labels = [RunLabel(key=k, value=v) for k, v in sorted(labels.items())]
    session.add(run)
    session.flush()
    return run


def complete_run(
    session: Session,
    *,
    run: Run,
    tensors: Sequence[dict[str, Any]],
    artifacts: Sequence[dict[str, Any]] = (),
    manifest: dict[str, Any] | None = None,
    labels: dict[str, str] | None = None,
) -> Run:
    """Attach tensor records (blobs already recorded) and mark the run complete, in the caller's transaction.

    ``tensors``: dicts with name, coords, shard, dtype, shape, sha256, nbytes.
    """
    if manifest is not None:
        run.manifest = manifest
    if labels is not None:
        check_labels(labels, where=f"run {run.name!r}")
        have = run.label_dict()
        run.labels.extend(RunLabel(key=k, value=v) for k, v in sorted(labels.items()) if k not in have)
        for lb in run.labels:
            if lb.key in labels:
                lb.value = labels[lb.key]
    run.artifacts = [Artifact(kind=a["kind"], sha256=a["sha256"], nbytes=a["nbytes"]) for a in artifacts]
    run.n_tensors = len(tensors)
    run.total_bytes = sum(int(t["nbytes"]) for t in tensors)
    run.status = "complete"
    if tensors:  # one executemany on the connection (the ORM's bulk path costs ~0.1 ms a row)
        session.connection().execute(
            insert(Tensor),
            [
                {
                    "run_id": run.id,
                    "name": t["name"],
                    "slot": _slot(t["coords"], t["shard"]),
                    "coords": t["coords"],
                    "shard": t["shard"],
                    "dtype": t["dtype"],
                    "shape": list(t["shape"]),
                    "sha256": t["sha256"],
                    "nbytes": int(t["nbytes"]),
                }
                for t in tensors
            ],
        )
    session.flush()
    return run


def run_tensors(session: Session, *, run_id: int) -> Sequence[Any]:
    """A run's tensor records in capture order, as plain rows ``(name, slot, dtype, shape, sha256, nbytes)``
    (also by attribute): no ORM objects, which a run of thousands of tensors would build one by one on
    every comparison. ``slot`` holds the coordinates and shard spec as one canonical JSON text
    (:func:`slot_parts` reads it): records of one layer and step share it, so a caller decodes each once.
    ``shape`` is the JSON text of the shape (:func:`shape_of` reads it), for the same reason: most records
    of a run share a few shapes."""
    cols = (Tensor.name, Tensor.slot, Tensor.dtype, cast(Tensor.shape, String).label("shape"), Tensor.sha256, Tensor.nbytes)
    return session.execute(select(*cols).where(Tensor.run_id == run_id).order_by(Tensor.id)).all()


def slot_parts(slot: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(coords, shard) of a record's ``slot``: the dicts stored in its ``coords`` and ``shard`` columns."""
    d = json.loads(slot)
    return d["c"], d["s"]


def shape_of(shape: str) -> tuple[int, ...]:
    """The shape of a record, from the JSON text :func:`run_tensors` gives. ValueError when the text is not a
    list of sizes (a damaged row)."""
    got = json.loads(shape)
    if not isinstance(got, list) or not all(type(n) is int and n >= 0 for n in got):
        raise ValueError(f"{shape[:60]!r} is not a list of sizes")
    return tuple(got)


def unreferenced_blobs(session: Session, *, candidates: Sequence[str]) -> list[str]:
    """Which of ``candidates`` no tensor, artifact or upload row points to (safe to delete after a failed
    ingest, under :func:`blob_gc_lock` exclusive)."""
    if not candidates:
        return []
    used = set(session.scalars(select(Tensor.sha256).where(Tensor.sha256.in_(candidates))))
    used |= set(session.scalars(select(Artifact.sha256).where(Artifact.sha256.in_(candidates))))
    used |= set(session.scalars(select(Upload.sha256).where(Upload.sha256.in_(candidates))))
    return [c for c in candidates if c not in used]


_BLOB_GC_LOCK = 0x76616C62  # PostgreSQL advisory lock key ("valb")


def blob_gc_lock(session: Session, *, exclusive: bool) -> None:
    """Serialise blob deletion against transactions that start referencing blobs.

    A failed ingest deletes the blobs it created that nothing references, and a collection
    (validator.service.expiry) the blobs nothing references any more; a concurrent ingest or upload may have
    found the same content already present and be about to reference it. Deleting holds this lock
    exclusively for the whole check-and-delete; a transaction that commits references takes it shared
    first, then makes sure every blob it references exists (writing it again if it was just deleted), and
    only then commits. PostgreSQL: advisory transaction locks; SQLite: the database write lock, taken up
    front by both sides.
    """
    dialect = session.get_bind().dialect.name
    if dialect == "postgresql":
        fn = "pg_advisory_xact_lock" if exclusive else "pg_advisory_xact_lock_shared"
        session.execute(text(f"SELECT {fn}(:k)"), {"k": _BLOB_GC_LOCK})
    elif dialect == "sqlite":
        session.execute(text("UPDATE blobs SET nbytes = nbytes WHERE 0"))  # takes the write lock now


def unreferenced_blob_rows(session: Session) -> dict[str, int]:
    """Every blob row no tensor, artifact or upload points to: sha256 -> recorded size (a collection deletes
    them, under :func:`blob_gc_lock` exclusive)."""
    q = select(Blob.sha256, Blob.nbytes)
    for model in (Tensor, Artifact, Upload):
        q = q.where(~select(model.id).where(model.sha256 == Blob.sha256).exists())
    return {sha: int(n) for sha, n in session.execute(q)}


def pending_runs(session: Session, *, created_before: datetime) -> Sequence[Run]:
    """Runs still pending (uploaded, never finalized) created before ``created_before`` (aware, UTC)."""
    q = select(Run).where(Run.status == "pending", Run.created_at < created_before).order_by(Run.id)
    return session.scalars(q.options(defer(Run.manifest))).all()


def upload_blobs(session: Session, *, run_ids: Sequence[int]) -> list[str]:
    """The blobs the uploaded files of these runs are stored as."""
    if not run_ids:
        return []
    return sorted(set(session.scalars(select(Upload.sha256).where(Upload.run_id.in_(list(run_ids))))))


def delete_runs(session: Session, *, ids: Sequence[int]) -> None:
    """Delete runs with their labels, uploads, tensors and artifacts (the blobs stay: see blob_gc_lock)."""
    if not ids:
        return
    for model in (RunLabel, Upload, Tensor, Artifact):
        session.execute(delete(model).where(model.run_id.in_(list(ids))))
    session.execute(delete(Run).where(Run.id.in_(list(ids))))


def delete_blob_rows(session: Session, *, shas: Sequence[str]) -> None:
    if shas:
        session.execute(delete(Blob).where(Blob.sha256.in_(list(shas))))


# -- uploads and cached comparisons -------------------------------------------------------------


def add_upload(session: Session, *, run_id: int, part: str, filename: str, sha256: str, nbytes: int) -> bool:
    """Record an uploaded file. Returns False when the same content was already recorded (a retry);
    raises ConflictError when different content was."""
    existing = session.scalars(
        select(Upload).where(Upload.run_id == run_id, Upload.part == part, Upload.filename == filename)
    ).first()
    if existing is not None:
        if existing.sha256 != sha256:
            raise ConflictError(f"{part}/{filename} was already uploaded with different content ({existing.sha256[:12]})")
        return False
    session.add(Upload(run_id=run_id, part=part, filename=filename, sha256=sha256, nbytes=nbytes))
    session.flush()
    return True


def run_uploads(session: Session, *, run_id: int) -> Sequence[Upload]:
    return session.scalars(select(Upload).where(Upload.run_id == run_id).order_by(Upload.part, Upload.filename)).all()


def get_comparison(session: Session, *, key: str | None = None, id: int | None = None) -> ComparisonRecord | None:
    try:
        if id is not None:
            return session.get(ComparisonRecord, id) if 0 <= id <= _MAX_ID else None
        return session.scalars(select(ComparisonRecord).where(ComparisonRecord.key == key)).first()
    except ValueError as exc:  # its request or result JSON does not decode
        raise DamagedRowError(
            f"comparison {id if id is not None else key}: its stored request or result (comparisons) is damaged: {exc}; "
            "see `validator check`"
        ) from None


def save_comparison(session: Session, *, key: str, request: dict[str, Any]) -> ComparisonRecord:
    rec = ComparisonRecord(key=key, request=request, status="queued")
    session.add(rec)
    session.flush()
    return rec


def interrupt_comparisons(session: Session, *, error: str) -> int:
    """Mark every 'queued' or 'running' comparison as 'error' (after a crash, nothing is computing them)."""
    res = session.execute(
        update(ComparisonRecord)
        .where(ComparisonRecord.status.in_(("queued", "running")))
        .values(status="error", error=error)
    )
    return int(res.rowcount or 0)  # type: ignore[attr-defined]


# -- checking the store (validator.store.integrity) -------------------------------------------------


def database_problems(session: Session) -> list[str]:
    """The database's own consistency check: SQLite's integrity_check; on PostgreSQL, that the catalog reads."""
    if session.get_bind().dialect.name == "sqlite":
        got = [str(r) for r in session.scalars(text("PRAGMA integrity_check"))]
        return [] if got == ["ok"] else got
    session.scalar(select(func.count()).select_from(text("pg_catalog.pg_class")))
    return []


def sqlite_integrity(url: str) -> list[str] | None:
    """SQLite's own ``PRAGMA integrity_check`` of the database at ``url``, on a connection of its own that
    neither migrates nor writes, before anything else reads it: what it reports (empty: ok), its error when
    it cannot finish, or None when ``url`` is no SQLite file (not SQLite, in memory, or not created yet)."""
    import sqlite3

    from sqlalchemy.engine import make_url

    u = make_url(url)
    if u.get_backend_name() != "sqlite" or not u.database or u.database == ":memory:":
        return None
    from pathlib import Path

    path = Path(u.database)
    if not path.is_file():
        return None
    got: list[str] = []
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=rw", uri=True, timeout=60)
        try:
            for (line,) in conn.execute("PRAGMA integrity_check"):
                got.append(str(line))
        finally:
            conn.close()
    except (sqlite3.Error, UnicodeDecodeError) as exc:
        return [*got, f"the integrity check could not finish: {exc}"]
    return [] if got == ["ok"] else got


def damaged_rows(session: Session, *, limit: int = 20) -> list[str]:
    """Stored rows whose JSON columns the readers cannot decode: a run's manifest (an object), a tensor's shape
    (a list of sizes), coordinates and shard spec (``slot``, ``coords``, ``shard``: objects), a comparison's
    request and result. Distinct texts are decoded once; at most ``limit`` rows are named per column."""
    from probes.core.shards import Coords, ShardSpec

    out: list[str] = []

    def obj(text: str) -> None:
        if not isinstance(json.loads(text), dict):
            raise ValueError("not a JSON object")

    def slot(text: str) -> None:
        c, sh = slot_parts(text)
        Coords.from_dict(c)
        ShardSpec.from_dict(sh)

    def bad(text: str | None, parse: Any, nullable: bool = False) -> str | None:
        if text is None:
            return None if nullable else "missing"
        try:
            parse(text)
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"[:200]
        return None

    def txt(col: Any) -> Any:
        return cast(col, String)

    for col, parse in ((Tensor.shape, shape_of), (Tensor.slot, slot), (Tensor.coords, obj), (Tensor.shard, obj)):
        name = f"tensors.{col.key}"
        for (text_,) in session.execute(select(txt(col)).distinct()):
            why = bad(text_, parse)
            if why is None:
                continue
            rows = session.execute(
                select(Run.name, Tensor.name).join(Run, Run.id == Tensor.run_id).where(txt(col) == text_).limit(limit)
            )
            out += [f"run {r!r} tensor {t!r}: {name} {text_!r:.60} cannot be read ({why})" for r, t in rows]
    for rid, rname, text_ in session.execute(select(Run.id, Run.name, txt(Run.manifest)).execution_options(yield_per=64)):
        why = bad(text_, obj)
        if why:
            out.append(f"run {rname!r} (id {rid}): runs.manifest cannot be read ({why})")
    q = select(ComparisonRecord.id, txt(ComparisonRecord.request), txt(ComparisonRecord.result))
    for cid, req, res in session.execute(q.execution_options(yield_per=16)):
        for what, text_, nullable in (("request", req, False), ("result", res, True)):
            why = bad(text_, obj, nullable) if text_ != "null" or not nullable else None
            if why:
                out.append(f"comparison {cid}: comparisons.{what} cannot be read ({why})")
    return out


def blob_sizes(session: Session, *, shas: Sequence[str] | None = None) -> dict[str, int]:
    """Every blob row (or those of ``shas``): sha256 -> recorded size."""
    q = select(Blob.sha256, Blob.nbytes)
    if shas is not None:
        if not shas:
            return {}
        q = q.where(Blob.sha256.in_(list(shas)))
    return {sha: int(n) for sha, n in session.execute(q)}


def blob_references(session: Session) -> list[tuple[str, str, int]]:
    """Every row pointing at a blob, as (kind, sha256, size it records): tensors, artifacts, uploads."""
    out: list[tuple[str, str, int]] = []
    for model, kind in ((Tensor, "tensor"), (Artifact, "artifact"), (Upload, "upload")):
        out += [(kind, sha, int(n)) for sha, n in session.execute(select(model.sha256, model.nbytes))]
    return out
