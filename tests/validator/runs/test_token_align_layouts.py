"""Token alignment of ``b s`` layouts (validator/runs/token_align.py): dumps written by the real SGLang 0.5.23
dumper (tests/validator/runs/token_align_dumps.py: ``bs-a`` a right-padded ``[2, 6]`` batch marked by
``attention_mask``, ``bs-b`` chunked, left-padded, sequence-major, padding marked by position -1) pair token by
token with each other and with the flat ``t`` run ``align-a`` of tests/validator/runs/sglang0523_dumps.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from tests.validator.runs.sglang0523_dumps import DECODED, PROMPTS, H, expected_hidden, written_dumps
from validator.app.cli import main
from validator.runs.dumper import read_dumper_dir
from validator.runs.token_align import align_views, token_sequences


@pytest.fixture(scope="module")
def dumps(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return written_dumps(tmp_path_factory.mktemp("bs"))


def test_b_s_batches_are_read_row_by_row_without_padding(dumps: Path) -> None:
    for exp in ("bs-a", "bs-b"):
        seqs, problems = token_sequences(read_dumper_dir(dumps / exp))
        assert problems == []
        assert {k: s.ids for k, s in seqs.items()} == {
            f"{exp}-p0": PROMPTS["p0"] + DECODED["p0"],
            f"{exp}-p1": PROMPTS["p1"] + DECODED["p1"],
        }
    seqs, _ = token_sequences(read_dumper_dir(dumps / "bs-b"))
    # rows count batch-major (b * S + s): step 1 is [2, 4], p0 left-padded by 2; step 2 has p1 in row 0
    assert seqs["bs-b-p0"].rows == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 1), (3, 0)]
    assert seqs["bs-b-p1"].rows[:5] == [(1, 4), (1, 5), (1, 6), (1, 7), (2, 0)]


@pytest.mark.parametrize(("a", "b"), [("align-a", "bs-a"), ("align-a", "bs-b"), ("bs-a", "bs-b")])
def test_b_s_runs_pair_token_by_token_with_flat_ones(dumps: Path, a: str, b: str) -> None:
    va, vb = align_views(read_dumper_dir(dumps / a), read_dumper_dir(dumps / b))
    report = vb.manifest["token_alignment"]
    assert [(r["a"], r["b"], r["tokens"]) for r in report["requests"]] == [
        (f"{a}-p0", f"{b}-p0", 8),
        (f"{a}-p1", f"{b}-p1", 6),
    ]
    assert report["unmatched"] == report["problems"] == report["left_out"] == []
    assert len(va.tensors) == len(vb.tensors) == 2
    for ta, tb in zip(va.tensors, vb.tensors, strict=True):
        assert ta.coords == tb.coords and ta.shape == tb.shape == (8 if ta.coords.request.endswith("p0") else 6, H)
        want = expected_hidden(ta.coords.request.removeprefix(f"{a}-"))
        for got in (ta.load(), tb.load()):  # padding rows (1e3) taken for tokens would be far off
            assert got.shape == want.shape and float((got.double() - want).norm() / want.norm()) < 1e-6


def test_a_changed_padded_batch_fails_only_its_request(
    dumps: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bs-b"
    shutil.copytree(dumps / "bs-b", bad)
    f = next(bad.glob("step=1___*name=hidden*"))  # [s=4, b=2, h]: p0 left-padded in b=0, p1 in b=1
    doc = torch.load(f, weights_only=True)
    doc["value"][0, 0] += 5.0  # padding of p0: not a token, changes nothing
    doc["value"][3, 1] += 0.05  # p1's position 3
    torch.save(doc, f)
    home = str(tmp_path / "home")
    assert main(["--home", home, "compare", str(dumps / "align-a"), str(bad), "--align-tokens", "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert {p["label"]: p["status"] for p in out["pairs"]} == {
        "hidden [req=align-a-p0 tok=0:8 layer=0]": "pass",
        "hidden [req=align-a-p1 tok=0:6 layer=0]": "fail",
    }


def test_positions_that_skip_inside_a_b_s_row_are_a_problem(dumps: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bs-a"
    shutil.copytree(dumps / "bs-a", bad)
    f = next(bad.glob("step=0___*name=attention_mask*"))
    doc = torch.load(f, weights_only=True)
    doc["value"][0, 2] = 0  # p0's position 2 marked as padding: its positions skip from 1 to 3
    torch.save(doc, f)
    seqs, problems = token_sequences(read_dumper_dir(bad))
    assert problems == [
        "step 0: batch row 0: its unpadded positions are not consecutive or do not end at its seq_lens; the row is not aligned",
        "request bs-a-p0: position 0 was never dumped; its tokens from there on are not aligned",
    ]
    # p0's decode rows (positions 6 and 7) have nothing before them; p1, the next row of the batch, is whole
    assert seqs["bs-a-p0"].ids == [] and seqs["bs-a-p1"].ids == PROMPTS["p1"] + DECODED["p1"]


def test_batch_fields_kept_per_rank_are_reported(dumps: Path, tmp_path: Path) -> None:
    # a second rank dumped another batch's input_ids in step 0 and its dumps say no DP rank: the reader keeps
    # both ranks' input_ids apart, and the step is not aligned (not read from one rank's copy)
    d = tmp_path / "two"
    shutil.copytree(dumps / "align-a", d)
    meta = torch.load(next(d.glob("step=0___rank=0___*name=input_ids*")), weights_only=True)["meta"]
    torch.save(
        {"value": torch.tensor([1, 2, 3]), "meta": meta}, d / "step=0___rank=1___dump_index=1___name=input_ids.pt"
    )
    seqs, problems = token_sequences(read_dumper_dir(d))
    assert problems[0] == (
        "step 0: input_ids differ between ranks and were kept per rank (a batch per rank, as with "
        "DP attention, needs each dump's DP rank); the step is not aligned"
    )
    assert all(s.ids == [] for s in seqs.values())  # positions 0 .. 5 were in step 0
