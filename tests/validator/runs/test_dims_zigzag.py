"""Context-parallel zigzag on a packed token dimension (``t[cp:zigzag]``, SGLang's THD layout): each sequence
of length L is cut into 2n chunks, CP rank r holding chunks r and 2n-1-r of every sequence, one sequence after
another; the reader puts them back with the step's ``seq_lens`` (or Megatron's ``cu_seqlens_q``). The dumps are
written in the dumper's file format (the SGLang plugin cannot run context parallel on CPU)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.validator.runs.test_dumper_dims import _write
from validator.runs.dims import LayoutError, parse_dims, plan_layout
from validator.runs.dumper import read_dumper_dir
from validator.runs.reassembly import group_logical

LENS = [8, 4]  # two packed sequences of different lengths


def _zigzag(full: torch.Tensor, lens: list[int], cp: int, n: int) -> torch.Tensor:
    """CP rank ``cp`` of ``n``'s tokens: chunks cp and 2n-1-cp of each sequence, sequence after sequence."""
    out = []
    for seq in full.split(lens):
        chunks = seq.chunk(2 * n)
        out += [chunks[cp], chunks[2 * n - 1 - cp]]
    return torch.cat(out)


def _run(d: Path, full: torch.Tensor, lens_field: tuple[str, list[int]] | None, tp: int = 1) -> None:
    d.mkdir()
    for rank in range(2 * tp):
        cp, t = rank // tp, rank % tp
        w = full.shape[1] // tp
        mine = _zigzag(full, LENS, cp, 2)[:, t * w : (t + 1) * w].clone()
        info = {"cp_rank": cp, "cp_size": 2, "tp_rank": t, "tp_size": tp}
        _write(d, rank, "x", mine, "t[cp:zigzag] h[tp]" if tp > 1 else "t[cp:zigzag] h", info)
        if lens_field is not None:
            _write(d, rank, lens_field[0], torch.tensor(lens_field[1], dtype=torch.int64), None, info)


def _x(d: Path) -> tuple[torch.Tensor | None, list[str]]:
    view = read_dumper_dir(d)
    got = [lt for lt in group_logical(view.tensors).values() if lt.name == "x"]
    full = got[0].materialize() if len(got) == 1 else None  # kept per rank: one tensor per rank
    return full, view.manifest["sglang_dumper"]["unassembled"]


@pytest.mark.parametrize(
    ("field", "tp"), [(("seq_lens", LENS), 1), (("seq_lens", LENS), 2), (("cu_seqlens_q", [0, 8, 12]), 1)]
)
def test_packed_zigzag_is_put_back_per_sequence(tmp_path: Path, field: tuple[str, list[int]], tp: int) -> None:
    full = torch.randn(sum(LENS), 6, generator=torch.Generator().manual_seed(0))
    one = tmp_path / "cp1"
    one.mkdir()
    _write(one, 0, "x", full, "t h", {"cp_rank": 0, "cp_size": 1})
    _run(tmp_path / "cp2", full, field, tp)
    (single, _), (got, problems) = _x(one), _x(tmp_path / "cp2")
    assert problems == [] and single is not None and got is not None
    assert got.dtype == single.dtype and torch.equal(got, single)
    # the plain zigzag of a sequence dimension would not give it: the per-sequence order matters
    assert not torch.equal(torch.cat([_zigzag(full, LENS, c, 2) for c in range(2)]), full)


@pytest.mark.parametrize(
    ("field", "says"),
    [
        (None, "dumped no seq_lens or cu_seqlens_q"),
        (("seq_lens", [6, 6]), "length(s) [6, 6] not a positive multiple of 2 x 2"),
        (("seq_lens", [8, 8]), "they sum to 16, the 2 ranks hold [6] tokens each"),
    ],
)
def test_lengths_missing_or_not_fitting_are_reported(
    tmp_path: Path, field: tuple[str, list[int]] | None, says: str
) -> None:
    full = torch.arange(sum(LENS) * 2, dtype=torch.float32).view(-1, 2)
    _run(tmp_path / "cp2", full, field)
    got, problems = _x(tmp_path / "cp2")
    assert got is None and len(problems) == 1  # x kept per rank; the lengths fields themselves assemble
    assert (
        problems[0].startswith("x (step 0)") and "zigzag order on dimension 't'" in problems[0] and says in problems[0]
    )
    assert problems[0].endswith("kept per rank")


def test_ranks_disagreeing_on_the_lengths_are_reported(tmp_path: Path) -> None:
    full = torch.arange(sum(LENS) * 2, dtype=torch.float32).view(-1, 2)
    _run(tmp_path / "cp2", full, ("seq_lens", LENS))
    _write(tmp_path / "cp2", 1, "seq_lens", torch.tensor([4, 8]), None, {"cp_rank": 1, "cp_size": 2})
    got, problems = _x(tmp_path / "cp2")
    assert got is None and "its ranks dumped different seq_lens" in problems[0]


def test_plan_layout_carries_the_lengths() -> None:
    dims = parse_dims("t[cp:zigzag,sp] h")
    axes = [{"cp": (c, 2), "sp": (s, 2)} for c in range(2) for s in range(2)]
    lay = plan_layout(dims, axes, [(3, 4)] * 4, [0, 1, 2, 3], [8, 4], "seq_lens of step 0")
    assert [(o.axis, o.seq_lens) for o in lay.ops] == [("sp", None), ("cp", (8, 4))]
    assert "zigzag per sequence" in lay.ops[1].describe()
    with pytest.raises(LayoutError, match="another split of the dimension is outside it"):
        plan_layout(parse_dims("t[sp,cp:zigzag] h"), axes, [(3, 4)] * 4, [0, 1, 2, 3], [8, 4])
    with pytest.raises(LayoutError, match=r"from seq_lens of step 0 do not fit"):
        plan_layout(dims, axes, [(2, 4)] * 4, [0, 1, 2, 3], [8, 4], "seq_lens of step 0")
