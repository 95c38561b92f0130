"""Token alignment of SGLang dumper runs batched differently (validator/runs/token_align.py), on dumps written
by the real SGLang 0.5.23 dumper (tests/validator/runs/sglang0523_dumps.py: ``align-a`` prefills both prompts in
one batch, ``align-b`` chunks one prompt and prefills the other alone, ``pd/`` is a prefill server's and a
decode server's folder of one disaggregated run)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from tests.validator.runs.sglang0523_dumps import DECODED, PROMPTS, expected_hidden, written_dumps
from validator.app.cli import main
from validator.runs.dumper import read_dumper_dir
from validator.runs.token_align import Sequence, align_views, match_sequences, open_for_alignment, token_sequences


@pytest.fixture(scope="module")
def dumps(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return written_dumps(tmp_path_factory.mktemp("align"), layouts=False)


def test_requests_are_rebuilt_from_chunks_and_decode_steps(dumps: Path) -> None:
    seqs, problems = token_sequences(read_dumper_dir(dumps / "align-b"))
    assert problems == []
    assert {k: s.ids for k, s in seqs.items()} == {"align-b-p0": PROMPTS["p0"] + DECODED["p0"],
                                                   "align-b-p1": PROMPTS["p1"] + DECODED["p1"]}
    # p0: a 4-token chunk (step 0), a 2-token chunk (step 1), then decode rows in steps 3 and 4
    assert seqs["align-b-p0"].rows == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1), (3, 0), (4, 1)]


@pytest.mark.parametrize("other", ["align-b", "pd"])
def test_differently_batched_runs_pair_token_by_token(dumps: Path, other: str, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    a, b = align_views(read_dumper_dir(dumps / "align-a"), open_for_alignment(dumps / other))
    report = b.manifest["token_alignment"]
    assert [(r["a"], r["tokens"]) for r in report["requests"]] == [("align-a-p0", 8), ("align-a-p1", 6)]
    assert report["unmatched"] == report["problems"] == report["left_out"] == []
    for ta, tb in zip(a.tensors, b.tensors, strict=True):
        assert ta.coords == tb.coords and ta.coords.request is not None
        want = expected_hidden(ta.coords.request.removeprefix("align-a-"))
        for got in (ta.load(), tb.load()):  # against the independent float64 rows
            assert float((got.double() - want).norm() / want.norm()) < 1e-6
    home = str(tmp_path / "home")
    assert main(["--home", home, "compare", str(dumps / "align-a"), str(dumps / other), "--align-tokens", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["pairs"]) == 2


def test_a_changed_token_fails_and_unaligned_runs_do_not_pair(dumps: Path, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "align-b"
    shutil.copytree(dumps / "align-b", bad)
    f = next(bad.glob("step=3___*name=hidden*"))  # the decode step of p0 and p1
    doc = torch.load(f, weights_only=True)
    doc["value"][1] += 0.05  # p1's row
    torch.save(doc, f)
    home = str(tmp_path / "home")
    assert main(["--home", home, "compare", str(dumps / "align-a"), str(bad), "--align-tokens", "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert {p["label"]: p["status"] for p in out["pairs"]} == {
        "hidden [req=align-a-p0 tok=0:8 layer=0]": "pass", "hidden [req=align-a-p1 tok=0:6 layer=0]": "fail"}
    assert main(["--home", home, "compare", str(dumps / "align-a"), str(dumps / "align-b")]) == 1  # step by step
    capsys.readouterr()
    assert main(["--home", home, "compare", str(dumps / "align-a"), str(dumps / "pd")]) == 2
    assert "holds 2 SGLang dump folders (pd-decode, pd-prefill); name one of them, or compare with --align-tokens" in (
        capsys.readouterr().err)


def test_without_aux_dumps_alignment_is_refused(dumps: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "plain"
    d.mkdir()
    torch.save({"value": torch.ones(3, 2), "meta": {"dims": "t h"}}, d / "step=0___rank=0___dump_index=1___name=x.pt")
    assert main(["--home", str(tmp_path / "h"), "compare", str(d), str(dumps / "align-a"), "--align-tokens"]) == 2
    assert "token alignment needs input_ids, positions and seq_lens" in capsys.readouterr().err


def test_matching_is_by_token_ids() -> None:
    a = {"x": Sequence("x", [1, 2, 3]), "y": Sequence("y", [1, 2, 3, 4, 5]), "z": Sequence("z", [9])}
    b = {"q": Sequence("q", [1, 2, 3, 4]), "r": Sequence("r", [1, 2, 3]), "s": Sequence("s", [8])}
    got = [(sa.key, sb.key, n) for sa, sb, n in match_sequences(a, b)]
    # q: no equal ids, the longest prefix relation is y (4 tokens); r: x has its exact ids; s: nothing
    assert got == [("y", "q", 4), ("x", "r", 3)]


def test_a_stored_run_aligns_with_a_folder(dumps: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home = str(tmp_path / "home")  # the ingested run keeps the dims and rids in its manifest
    assert main(["--home", home, "ingest", "--format", "sglang-dumper", str(dumps / "align-a"), "--name", "donly"]) == 0
    capsys.readouterr()
    assert main(["--home", home, "compare", "donly", str(dumps / "pd"), "--align-tokens", "--json"]) == 0
    assert {p["label"] for p in json.loads(capsys.readouterr().out)["pairs"]} == {
        "hidden [req=align-a-p0 tok=0:8 layer=0]", "hidden [req=align-a-p1 tok=0:6 layer=0]"}
