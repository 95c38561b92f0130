"""Shard specs: how copies came to be copies (``replication``), in the dict form records and bundles keep."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from probes import BundleWriter
from probes.core.shards import ShardSpec, ShardSpecError
from validator.runs.sources import open_path


def test_replication_is_written_only_when_set() -> None:
    plain = [
        ShardSpec.full(),
        ShardSpec.replicated(1, 2),
        ShardSpec.split(0, 1, 2),
        ShardSpec.partial(0, 2),
        ShardSpec.split(1, 0, 2, replica=1, replicas=2),
    ]
    # the dict forms of specs without it are what they were, key for key
    assert [s.to_dict() for s in plain] == [
        {"kind": "full"},
        {"kind": "replicated", "index": 1, "count": 2},
        {"kind": "split", "index": 1, "count": 2, "dim": 0},
        {"kind": "partial", "index": 0, "count": 2},
        {"kind": "split", "index": 0, "count": 2, "dim": 1, "replica": 1, "replicas": 2},
    ]
    assert all(ShardSpec.from_dict(s.to_dict()) == s and s.replication is None for s in plain)
    declared = ShardSpec.replicated(1, 2, replication="declared")
    assumed = ShardSpec.split(1, 0, 2, replica=1, replicas=2, replication="assumed")
    assert declared.to_dict() == {"kind": "replicated", "index": 1, "count": 2, "replication": "declared"}
    assert assumed.to_dict()["replication"] == "assumed"
    for s in (declared, assumed):
        assert ShardSpec.from_dict(json.loads(json.dumps(s.to_dict()))) == s
    assert str(declared) == "replicated(rank=1, size=2)"  # the text form (notes, listings) leaves it out


@pytest.mark.parametrize(
    ("d", "problem"),
    [
        ({"kind": "replicated", "index": 0, "count": 2, "replication": "maybe"}, "replication must be one of"),
        ({"kind": "replicated", "index": 0, "count": 2, "replication": True}, "replication must be one of"),
        ({"kind": "full", "replication": "declared"}, "for copies only"),
        ({"kind": "partial", "index": 0, "count": 2, "replication": "assumed"}, "for copies only"),
        ({"kind": "split", "index": 0, "count": 2, "dim": 0, "replication": "declared"}, "for copies only"),
    ],
)
def test_replication_refused_where_it_cannot_be(d: dict[str, object], problem: str) -> None:
    with pytest.raises(ShardSpecError, match=problem):
        ShardSpec.from_dict(d)


def test_a_bundle_without_the_field_reads_as_before(tmp_path: Path) -> None:
    x = torch.arange(6, dtype=torch.float32)
    for r in range(2):
        with BundleWriter(tmp_path / "b", run_name="b", part=f"r{r}") as w:
            w.add("x", x + r, shard=ShardSpec.replicated(r, 2), step=0)
    part = json.loads((tmp_path / "b" / "parts" / "r1" / "part.json").read_text())
    assert [t["shard"] for t in part["tensors"]] == [{"kind": "replicated", "index": 1, "count": 2}]
    refs = open_path(tmp_path / "b").tensors
    assert sorted((r.shard for r in refs), key=lambda s: s.index) == [
        ShardSpec.replicated(0, 2),
        ShardSpec.replicated(1, 2),
    ]
    assert all(r.shard.replication is None for r in refs)


def test_a_bundle_keeps_declared_replication(tmp_path: Path) -> None:
    """A probe that declares its copies replicated writes it into the bundle, and the run reads it back."""
    x = torch.arange(6, dtype=torch.float32)
    for r in range(2):
        with BundleWriter(tmp_path / "b", run_name="b", part=f"r{r}") as w:
            w.add("x", x, shard=ShardSpec.replicated(r, 2, replication="declared"), step=0)
            w.add("y", x, shard=ShardSpec.replicated(r, 2), step=0)  # undeclared
    part = json.loads((tmp_path / "b" / "parts" / "r1" / "part.json").read_text())
    shards = {t["name"]: t["shard"] for t in part["tensors"]}
    assert shards == {
        "x": {"kind": "replicated", "index": 1, "count": 2, "replication": "declared"},
        "y": {"kind": "replicated", "index": 1, "count": 2},
    }
    refs = open_path(tmp_path / "b").tensors
    assert {(r.name, r.shard.index, r.shard.replication) for r in refs} == {
        ("x", 0, "declared"),
        ("x", 1, "declared"),
        ("y", 0, None),
        ("y", 1, None),
    }
