"""Token alignment across DP attention on dumps written by the real SGLang 0.5.23 dumper
(tests/validator/runs/token_align_dumps.py: ``dp-a``, attention TP 2 x attention DP 2, each DP rank serving
one prompt; ``dp-ref``, the same tensors on one rank, batched as ``align-a``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from tests.validator.runs.sglang0523_dumps import DECODED, PROMPTS, written_dumps
from validator.app.cli import main
from validator.runs.dumper import read_dumper_dir
from validator.runs.token_align import align_views, token_sequences


@pytest.fixture(scope="module")
def dumps(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return written_dumps(tmp_path_factory.mktemp("dp"))


def test_each_dp_rank_keeps_its_own_batch(dumps: Path) -> None:
    view = read_dumper_dir(dumps / "dp-a")
    info = view.manifest["sglang_dumper"]
    assert info["unassembled"] == [] and info["rids"] == {}
    assert info["dp_rids"]["0"] == {"0": ["dp-a-p0"], "1": ["dp-a-p1"]} and info["dp_rids"]["3"] == {
        "0": [],
        "1": ["dp-a-p1"],
    }
    # step 0: both DP ranks hold rows, one tensor each (attn_q joined over the DP rank's two TP ranks)
    assert {t.coords.label() for t in view.tensors if t.name == "attn_q" and t.coords.step == 0} == {
        "step=0 layer=0 dp=0",
        "step=0 layer=0 dp=1",
    }
    seqs, problems = token_sequences(view)
    assert problems == [] and {k: s.ids for k, s in seqs.items()} == {
        f"dp-a-{r}": PROMPTS[r] + DECODED[r] for r in PROMPTS
    }


def test_a_dp_attention_run_pairs_token_by_token(
    dumps: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = align_views(read_dumper_dir(dumps / "dp-ref"), read_dumper_dir(dumps / "dp-a"))
    report = b.manifest["token_alignment"]
    assert [(r["a"], r["b"], r["tokens"]) for r in report["requests"]] == [
        ("dp-ref-p0", "dp-a-p0", 8),
        ("dp-ref-p1", "dp-a-p1", 6),
    ]
    assert report["unmatched"] == report["problems"] == report["left_out"] == []
    assert sorted(t.name for t in b.tensors) == ["attn_q", "attn_q", "hidden", "hidden", "mlp_out", "mlp_out"]
    for ta, tb in zip(a.tensors, b.tensors, strict=True):
        assert (ta.name, ta.coords, ta.shape) == (tb.name, tb.coords, tb.shape)
        assert torch.allclose(ta.load(), tb.load(), rtol=1e-5, atol=1e-5)
    home = str(tmp_path / "home")
    for other in ("dp-ref", "align-a"):  # align-a has hidden only: attn_q and mlp_out are unpaired there
        code = main(["--home", home, "compare", str(dumps / other), str(dumps / "dp-a"), "--align-tokens", "--json"])
        pairs = json.loads(capsys.readouterr().out)["pairs"]
        assert code == (0 if other == "dp-ref" else 1)
        assert {p["label"]: p["status"] for p in pairs if p["label"].startswith("hidden")} == {
            f"hidden [req={other}-p0 tok=0:8 layer=0]": "pass",
            f"hidden [req={other}-p1 tok=0:6 layer=0]": "pass",
        }


def test_a_changed_row_on_one_dp_rank_fails_its_request_only(
    dumps: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "dp-a"
    shutil.copytree(dumps / "dp-a", bad)
    for f in bad.glob("step=1___rank=[23]___*name=hidden*"):  # DP rank 1's two attention TP ranks: p1's chunk
        doc = torch.load(f, weights_only=True)
        doc["value"][1] += 0.05  # p1's position 3
        torch.save(doc, f)
    assert (
        main(["--home", str(tmp_path / "h"), "compare", str(dumps / "dp-ref"), str(bad), "--align-tokens", "--json"])
        == 1
    )
    got = {p["label"]: p["status"] for p in json.loads(capsys.readouterr().out)["pairs"]}
    assert (
        got["hidden [req=dp-ref-p0 tok=0:8 layer=0]"] == "pass"
        and got["hidden [req=dp-ref-p1 tok=0:6 layer=0]"] == "fail"
    )
    assert got["mlp_out [req=dp-ref-p1 tok=0:6 layer=0]"] == "pass"


def test_a_user_tag_named_dp_is_renamed_only_beside_dp_batches(tmp_path: Path) -> None:
    def write(d: Path, rank: int, meta: dict[str, object]) -> None:
        d.mkdir(exist_ok=True)
        torch.save(
            {"value": torch.arange(3) + rank, "meta": meta},
            d / f"step=0___rank={rank}___dump_index=1___name=input_ids___dp=7.pt",
        )

    plain = tmp_path / "plain"
    write(plain, 0, {})
    (t,) = read_dumper_dir(plain).tensors
    assert t.coords.label() == "step=0 dp=7"  # no DP axis: the user's tag is the coordinate, as before
    split = tmp_path / "split"
    for r in range(2):
        write(split, r, {"sglang_parallel_info": {"attn_dp_rank": r, "attn_dp_size": 2}})
    view = read_dumper_dir(split)
    assert sorted(t.coords.label() for t in view.tensors) == ["step=0 dp=0 tag_dp=7", "step=0 dp=1 tag_dp=7"]
    assert [t.load().tolist() for t in view.tensors] == [[0, 1, 2], [1, 2, 3]]
