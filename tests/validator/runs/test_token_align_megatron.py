"""Token alignment of runs that describe their batches Megatron's way (validator/runs/token_align.py):
``cu_seqlens_q`` and ``position_ids`` for packed sequences, ``[B, S]`` ``input_ids`` without positions. Dumps
written with the real SGLang 0.5.23 dumper under Megatron's field names (tests/validator/runs/token_align_dumps.py:
``mg-thd``, ``mg-bshd``), compared with the SGLang run ``align-a`` of tests/validator/runs/sglang0523_dumps.py."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from tests.validator.runs.sglang0523_dumps import DECODED, PROMPTS, expected_hidden, written_dumps
from validator.runs.dumper import read_dumper_dir
from validator.runs.token_align import align_views, token_sequences


@pytest.fixture(scope="module")
def dumps(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return written_dumps(tmp_path_factory.mktemp("mg"))


def test_packed_sequences_are_read_from_cu_seqlens_q(dumps: Path) -> None:
    seqs, problems = token_sequences(read_dumper_dir(dumps / "mg-thd"))
    assert problems == []  # the trailing empty sequence and the 2 padding rows after cu_seqlens_q[-1] are no tokens
    assert {k: s.ids for k, s in seqs.items()} == {
        "step0.0": PROMPTS["p0"] + DECODED["p0"],
        "step0.1": PROMPTS["p1"] + DECODED["p1"],
    }
    assert seqs["step0.1"].rows == [(0, r) for r in range(8, 14)]
    seqs, problems = token_sequences(read_dumper_dir(dumps / "mg-bshd"))
    assert problems == [] and {k: s.ids for k, s in seqs.items()} == {
        "step0.0": PROMPTS["p1"] + DECODED["p1"],
        "step0.1": PROMPTS["p0"],
    }


@pytest.mark.parametrize(("other", "tokens"), [("mg-thd", (8, 6)), ("mg-bshd", (6, 6))])
def test_megatron_layouts_pair_token_by_token_with_an_sglang_run(
    dumps: Path, other: str, tokens: tuple[int, int]
) -> None:
    a, b = align_views(read_dumper_dir(dumps / "align-a"), read_dumper_dir(dumps / other))
    report = b.manifest["token_alignment"]
    got = [(r["a"], r["tokens"]) for r in report["requests"]]  # in B's order: mg-bshd has p1 first
    assert sorted(got) == [("align-a-p0", tokens[0]), ("align-a-p1", tokens[1])]
    assert report["problems"] == report["left_out"] == [] and report["unmatched"] == []
    assert sorted(t.coords.label() for t in b.tensors) == [
        f"req=align-a-p0 tok=0:{tokens[0]} layer=0",
        f"req=align-a-p1 tok=0:{tokens[1]} layer=0",
    ]
    for ta, tb in zip(sorted(a.tensors, key=lambda t: t.coords.label()), sorted(b.tensors, key=lambda t: t.coords.label()),
                      strict=True):  # fmt: skip
        want = expected_hidden(ta.coords.request.removeprefix("align-a-"), ta.shape[0])
        assert ta.coords == tb.coords and ta.shape == tb.shape == want.shape  # s b h -> t h
        for got in (ta.load(), tb.load()):  # the padding rows (1e3) taken for tokens would be far off
            assert float((got.double() - want).norm() / want.norm()) < 1e-6


def test_position_ids_that_skip_are_a_problem(dumps: Path, tmp_path: Path) -> None:
    bad = tmp_path / "mg-thd"
    shutil.copytree(dumps / "mg-thd", bad)
    f = next(bad.glob("step=0___*name=position_ids*"))
    doc = torch.load(f, weights_only=True)
    doc["value"][0, 10] = 7  # sequence 1 (rows 8 .. 13): positions 0 1 7 3 4 5
    torch.save(doc, f)
    seqs, problems = token_sequences(read_dumper_dir(bad))
    assert problems == ["step 0: sequence 1: its position_ids are not consecutive; it is not aligned"]
    assert list(seqs) == ["step0.0"]
