from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from sqlalchemy import inspect, select

from probes import BundleWriter
from tests.factories import tensors, write_tp_bundle
from validator.errors import InputError
from validator.store import crud as store
from validator.store.models import Blob, Run


def test_migration_upgrade_downgrade_upgrade(settings) -> None:
    """On SQLite and (when available) PostgreSQL: every revision, down to base and up again."""
    settings.home.mkdir(parents=True)
    engine = store.make_engine(settings.db_url)
    store.migrate(engine)
    tables = set(inspect(engine).get_table_names())
    assert {"runs", "run_labels", "tensors", "blobs", "artifacts", "uploads", "comparisons", "alembic_version"} <= tables
    store.downgrade(engine, "0001")
    assert "uploads" not in set(inspect(engine).get_table_names())
    store.downgrade(engine, "base")
    assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
    store.migrate(engine)
    assert {"runs", "tensors", "uploads"} <= set(inspect(engine).get_table_names())
    if engine.dialect.name == "sqlite":
        with engine.connect() as c:
            assert c.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
    engine.dispose()


def test_models_match_migrations(settings) -> None:
    """The migrated schema has every column the models declare."""
    from validator.store.models import Base

    settings.home.mkdir(parents=True)
    engine = store.make_engine(settings.db_url)
    store.migrate(engine)
    insp = inspect(engine)
    for table in Base.metadata.sorted_tables:
        cols = {c["name"] for c in insp.get_columns(table.name)}
        assert {c.name for c in table.columns} == cols, table.name
    engine.dispose()


def test_ingest_stores_same_content_once(service, tmp_path: Path) -> None:
    full = tensors()
    a = write_tp_bundle(tmp_path, "a", full, tp=4)
    b = write_tp_bundle(tmp_path, "b", full, tp=4)
    service.ingest(a)
    service.ingest(b)
    blob_files = [p for p in service.blobs.root.rglob("*") if p.is_file() and p.parent.name != "tmp"]
    with service.session() as s:
        n_blobs = len(s.scalars(select(Blob)).all())
    # ctx replicated on 4 ranks (one content) + 4 distinct k slices, shared by both runs
    assert n_blobs == 5 == len(blob_files)
    assert [r.name for r in service.list_runs()] == ["b", "a"]


def test_ingest_is_atomic_on_corrupt_tensor(service, tmp_path: Path) -> None:
    path = tmp_path / "bad"
    with BundleWriter(path, run_name="bad", part="p0") as w:
        w.add("good", torch.randn(32))
        w.add("corrupt", torch.randn(32))
    # flip bytes of the second tensor's data so its sha256 no longer matches the record
    f = path / "parts" / "p0" / "tensors-00000.safetensors"
    data = bytearray(f.read_bytes())
    data[-4:] = b"\x00\x01\x02\x03"
    f.write_bytes(bytes(data))
    with pytest.raises(InputError, match="hash mismatch"):
        service.ingest(path)
    assert service.list_runs() == []
    leftovers = [p for p in service.blobs.root.rglob("*") if p.is_file()]
    assert leftovers == []  # the good tensor's blob was created by this ingest and removed again
    with service.session() as s:
        assert s.scalars(select(Run)).all() == []


def test_incomplete_part_is_refused(service, tmp_path: Path) -> None:
    path = tmp_path / "inc"
    w = BundleWriter(path, run_name="inc", part="p0")
    w.add("x", torch.ones(2))
    w.flush()  # tensors written, but part.json never
    with pytest.raises(InputError, match="incomplete part"):
        service.ingest(path)
    assert service.list_runs() == []


def test_record_tampering_detected(service, tmp_path: Path) -> None:
    path = tmp_path / "t"
    with BundleWriter(path, run_name="t", part="p0") as w:
        w.add("x", torch.ones(2, 3))
    pj = path / "parts" / "p0" / "part.json"
    doc = json.loads(pj.read_text())
    doc["tensors"][0]["shape"] = [3, 2]
    pj.write_text(json.dumps(doc))
    with pytest.raises(InputError, match=r"float32\[2, 3\] in the file but float32\[3, 2\]"):
        service.ingest(path)


@pytest.mark.parametrize("bad", ["../evil", "a/b", "x\\y", "a\x00b", ".hidden", "%2e%2e%2fx"])
def test_path_like_tensor_names_are_refused(service, tmp_path: Path, bad: str) -> None:
    from safetensors.torch import save_file

    p = tmp_path / "plain.safetensors"
    save_file({bad: torch.ones(1)}, str(p))
    with pytest.raises(InputError, match="not allowed"):
        service.ingest(p)
    assert service.list_runs() == []


def test_stored_run_round_trips(service, tmp_path: Path) -> None:
    full = tensors()
    service.ingest(write_tp_bundle(tmp_path, "rt", full, tp=8, dtype=torch.float32), labels={"model": "m"})
    doc = service.show_run("rt")
    assert doc["labels"] == {"model": "m", "tp": "8"}
    k = next(t for t in doc["tensors"] if t["name"] == "k")
    assert k["shape"] == [8, 8, 4] and k["shards"] == 8 and k["kind"] == "split"
    c = service.compare("rt", str(tmp_path / "rt"))
    assert c.verdict == "pass" and all(p.metrics.rel_l2 == 0.0 for p in c.pairs)
    assert service.list_runs(labels={"model": "m"})[0].name == "rt"
    assert service.list_runs(labels={"model": "other"}) == []


def test_blob_deleted_by_a_failed_ingest_is_restored_by_the_one_that_references_it(service, tmp_path: Path, monkeypatch) -> None:
    """Race: ingest Y finds a tensor's blob already present (created by ingest X); X then fails and
    deletes the blobs it created before Y's references are committed. Y must not end up pointing at a
    missing blob."""
    from validator.service import core as service_mod

    t = torch.randn(64)
    path = tmp_path / "y"
    with BundleWriter(path, run_name="y", part="p0") as w:
        w.add("x", t)
    sha = json.loads((path / "parts" / "p0" / "part.json").read_text())["tensors"][0]["sha256"]
    service.blobs.put([t.numpy().tobytes()])  # X wrote it...
    original = service_mod.store.blob_gc_lock
    fired = []

    def lock(session, *, exclusive: bool) -> None:
        if not exclusive and not fired:  # ...and fails just before Y commits its references
            fired.append(True)
            service.discard_blobs([sha])
            assert not service.blobs.exists(sha)
        original(session, exclusive=exclusive)

    monkeypatch.setattr(service_mod.store, "blob_gc_lock", lock)
    service.ingest(path)
    assert fired and service.blobs.exists(sha)
    c = service.compare("y", str(path))
    assert c.verdict == "pass" and c.pairs[0].metrics.rel_l2 == 0.0


def test_stored_view_holds_the_records_coordinates_and_shards(service, tmp_path: Path) -> None:
    """A stored run's tensors carry the coordinates and shard specs of the bundle's records (decoded from
    each record's slot, once per distinct slot), whatever coordinates they use."""
    from probes.core.shards import ShardSpec
    from validator.runs.sources import open_path

    path = tmp_path / "coords"
    with BundleWriter(path, run_name="coords", part="rank0") as w:
        for layer in range(3):
            for name in ("q", "o"):  # two records per slot
                w.add(name, torch.ones(2, 4) * layer, step=1, layer=layer)
        w.add("t", torch.ones(4), request="r-é", tokens=(2, 6), engine="x", tp_rank=1, tp_size=2,
              shard=ShardSpec.split(0, 1, 2))  # fmt: skip
        w.add("t", torch.ones(4), request="r-é", tokens=(2, 6), engine="x", tp_rank=0, tp_size=2,
              shard=ShardSpec.split(0, 0, 2))  # fmt: skip
        w.add("p", torch.ones(3), pp_stage=1, shard=ShardSpec.partial(1, 2))
    service.ingest(path)
    stored = service.stored_view(service.get_run("coords")).tensors
    read = open_path(path).tensors

    def records(refs: list) -> list[tuple]:
        return sorted((r.name, repr(r.coords), str(r.shard), r.dtype, r.shape) for r in refs)

    assert records(stored) == records(read)
