"""The replica notes of a pair measured in ranges (the Ray assembly path, run here without a cluster) are the
notes the whole pair's ``materialize()`` leaves, declared copies included: one function writes both."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from probes import BundleWriter, ShardSpec
from probes.core.shards import Replication
from validator.executors.assembly import portable
from validator.executors.planning import plan_ranges, rounding_dtype
from validator.executors.tasks import measure_range, merge_measured
from validator.judging.compare import PairToMeasure, measure_pair
from validator.runs.reassembly import LogicalTensor, group_logical
from validator.runs.sources import open_path


def _bundle(tmp_path: Path, name: str, off: float) -> Path:
    """``x`` replicated on 3 ranks, rank 2's copy off by ``off`` in its last 100 elements."""
    x = torch.randn(64, 32, generator=torch.Generator().manual_seed(0))
    path = tmp_path / name
    for r in range(3):
        y = x.clone()
        if r == 2:
            y.view(-1)[-100:] += off
        with BundleWriter(path, run_name=name, part=f"r{r}") as w:
            w.add("x", y, shard=ShardSpec.replicated(r, 3))
    return path


def _declared(t: LogicalTensor, replication: Replication) -> LogicalTensor:
    """``t`` with its copies recorded as a layout with ``replication`` would record them (SGLang's dumper does
    this from its dims; its own files are not readable by Ray workers, a bundle's are)."""
    shards = [dataclasses.replace(r, shard=dataclasses.replace(r.shard, replication=replication)) for r in t.shards]
    return LogicalTensor(t.name, t.coords, shards, list(t.notes))


@pytest.mark.parametrize("replication", ["declared", "assumed", None])
def test_ranges_note_differing_copies_as_the_whole_pair_does(tmp_path: Path, replication: Replication | None) -> None:
    (la,) = group_logical(open_path(_bundle(tmp_path, "a", 0.0)).tensors).values()
    (lb,) = group_logical(open_path(_bundle(tmp_path, "b", 0.25)).tensors).values()
    if replication is not None:
        la, lb = _declared(la, replication), _declared(lb, replication)
    whole = measure_pair(
        LogicalTensor(la.name, la.coords, la.shards), LogicalTensor(lb.name, lb.coords, lb.shards), False
    )
    pa, pb = portable(la, None), portable(lb, None)
    assert all(type(r) is type(s) for r, s in zip(pa.shards + pb.shards, la.shards + lb.shards))  # kept for the workers
    spans = plan_ranges(la.shape(), 8, 4 << 10)
    assert len(spans) > 1
    results = [got for lo, hi in spans for got in measure_range(pa, pb, rounding_dtype(la, lb, False), lo, hi, None)]
    merged = merge_measured(PairToMeasure(pa, pb, False), results)
    assert merged.notes == whole.notes and len(whole.notes) == 1  # only B's rank 2 differs, in the last range
    (note,) = whole.notes
    assert "rank=2" in note and "max |diff| 0.25" in note
    assert note.startswith("B: declared replicas disagree: " if replication == "declared" else "B: replicas disagree: ")
