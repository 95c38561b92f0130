from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from probes import BundleWriter, ShardSpec
from tests.factories import tensors, write_tp_bundle
from validator.errors import InputError
from validator.judging.compare import compare_runs
from validator.runs.reassembly import group_logical
from validator.runs.sources import open_path


def _logical(view):
    return {lt.name: lt for lt in group_logical(view.tensors).values()}


def test_tp_split_reassembles_bitwise(tmp_path: Path) -> None:
    full = tensors()
    view = open_path(write_tp_bundle(tmp_path, "tp4", full, tp=4, dtype=torch.float32))
    lt = _logical(view)
    assert torch.equal(lt["k"].materialize(), full["k"])
    assert torch.equal(lt["ctx"].materialize(), full["ctx"])
    assert lt["k"].shape() == tuple(full["k"].shape)


def test_tp4_vs_tp32_same_logical_tensor(tmp_path: Path) -> None:
    """8 KV heads: TP4 holds 2 heads per rank, TP32 one head replicated on 4 ranks."""
    full = tensors(heads=8)
    a = open_path(write_tp_bundle(tmp_path, "p-tp4", full, tp=4))
    b = open_path(write_tp_bundle(tmp_path, "d-tp32", full, tp=32))
    assert len(b.tensors) == 64
    c = compare_runs(a, b)
    assert c.verdict == "pass", c.reasons
    assert {p.name for p in c.pairs} == {"ctx", "k"}
    assert all(p.metrics is not None and p.metrics.rel_l2 == 0.0 for p in c.pairs)
    assert not c.only_a and not c.only_b


def test_replica_disagreement_is_reported(tmp_path: Path) -> None:
    x = torch.randn(4, 4)
    path = tmp_path / "rep"
    for r in range(3):
        with BundleWriter(path, run_name="rep", part=f"r{r}") as w:
            w.add("x", x + (0.5 if r == 2 else 0.0), shard=ShardSpec.replicated(r, 3))
    lt = _logical(open_path(path))["x"]
    assert torch.equal(lt.materialize(), x)
    assert len(lt.notes) == 1 and "replicas disagree" in lt.notes[0] and "rank=2" in lt.notes[0]


def test_split_replica_disagreement_is_reported(tmp_path: Path) -> None:
    full = tensors()
    path = write_tp_bundle(tmp_path, "tp16", full, tp=16, dtype=torch.float32)
    # corrupt one replica: rewrite part tp5 (head 2, replica 1) with different values
    import shutil

    shutil.rmtree(path / "parts" / "tp5")
    with BundleWriter(path, run_name="tp16", part="tp5") as w:
        w.add("ctx", full["ctx"], step=0, tp_rank=5, tp_size=16, shard=ShardSpec.replicated(5, 16))
        w.add("k", full["k"][:, 2:3] * 2, step=0, layer=0, tp_rank=5, tp_size=16,
              shard=ShardSpec.split(1, 2, 8, replica=1, replicas=2))
    lt = _logical(open_path(path))["k"]
    assert torch.equal(lt.materialize(), full["k"])
    assert any("replicas disagree" in n for n in lt.notes)


def test_pp_partial_sum_in_stage_order_with_silent_stage(tmp_path: Path) -> None:
    pieces = {0: torch.randn(4, 8, dtype=torch.float64), 1: torch.randn(4, 8, dtype=torch.float64),
              3: torch.randn(4, 8, dtype=torch.float64)}  # stage 2 owns no capture layer
    path = tmp_path / "pp"
    for s, t in pieces.items():
        with BundleWriter(path, run_name="pp", part=f"pp{s}") as w:
            w.add("proj", t, step=0, pp_stage=s, shard=ShardSpec.partial(s, 4))
    lt = _logical(open_path(path))["proj"]
    expected = ((pieces[0] + pieces[1]) + pieces[3])
    assert torch.equal(lt.materialize(), expected)
    assert any("stages [2]" in n for n in lt.notes)


@pytest.mark.parametrize(
    "specs, msg",
    [
        ([ShardSpec.split(0, 0, 3), ShardSpec.split(0, 2, 3)], "rank(s) [1] of 3 missing"),
        ([ShardSpec.split(0, 0, 2), ShardSpec.replicated(1, 2)], "mix kinds"),
        ([ShardSpec.split(0, 0, 2), ShardSpec.split(0, 1, 3)], "disagree on their count"),
        ([ShardSpec.full(), ShardSpec.full()], "full copies"),
    ],
)
def test_impossible_layouts_are_refused(tmp_path: Path, specs: list[ShardSpec], msg: str) -> None:
    path = tmp_path / "bad"
    for i, spec in enumerate(specs):
        with BundleWriter(path, run_name="bad", part=f"p{i}") as w:
            w.add("x", torch.zeros(2, 2), shard=spec)
    with pytest.raises(InputError, match=re.escape(msg)):
        group_logical(open_path(path).tensors)


def test_shard_spec_text_round_trip() -> None:
    for spec in (ShardSpec.full(), ShardSpec.split(1, 3, 8, replica=2, replicas=4), ShardSpec.replicated(0, 2),
                 ShardSpec.partial(7, 8)):
        assert ShardSpec.parse(str(spec)) == spec
        assert ShardSpec.from_dict(spec.to_dict()) == spec
