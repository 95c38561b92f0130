"""SGLang 0.5.23 dumps: file-name tags, and ``dims``-driven unsharding (validator/runs/dims.py).

The TP dumps are written by the real 0.5.23 dumper (tests/validator/runs/sglang0523_dumps.py says how it is
loaded without SGLang's server stack), one of them by two processes in a gloo process group; layouts the SGLang plugin cannot produce on CPU (context parallel with
zigzag order, Megatron's metadata) are written here in the dumper's file format.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.paths import ROOT
from validator.app.cli import main
from validator.runs.dims import LayoutError, parse_dims, plan_layout
from validator.runs.dumper import parse_dump_name, read_dumper_dir
from validator.runs.reassembly import group_logical

SCRIPT = Path(__file__).with_name("sglang0523_dumps.py")
SIDE = ROOT / ".venv" / "sglang-versions" / "0.5.23" / "sglang" / "srt" / "debug_utils" / "dumper.py"


@pytest.fixture(scope="module")
def d23(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not SIDE.exists():
        pytest.skip(f"sglang 0.5.23 is not unpacked at {SIDE.parents[4]} (scripts/setup installs it)")
    out = tmp_path_factory.mktemp("d23")
    got = subprocess.run([sys.executable, str(SCRIPT), str(out), "tp"], capture_output=True, text=True, timeout=120)
    assert got.returncode == 0, got.stderr[-3000:]
    return out


def _logical(path: Path, **kw: object) -> dict[str, torch.Tensor]:
    return {lt.label: lt.materialize() for lt in group_logical(read_dumper_dir(path, **kw).tensors).values()}  # type: ignore[arg-type]


def test_the_0523_file_names_and_metadata(d23: Path) -> None:
    names = sorted(p.name for p in (d23 / "tp2").iterdir())
    tags = parse_dump_name(names[0])
    assert (
        tags is not None and list(tags)[:3] == ["step", "rank", "dump_index"] and tags["recompute_status"] == "disabled"
    )
    view = read_dumper_dir(d23 / "tp2")
    assert {r.coords.step for r in view.tensors} == {0, 1}  # step= counts from 0
    assert {r.coords.layer for r in view.tensors} == {0, 1, None}
    assert all("recompute_status" not in dict(r.coords.extra) for r in view.tensors)  # bookkeeping, not identity
    m = view.manifest["sglang_dumper"]
    assert m["dims"]["mlp_down"] == "t h[tp:partial]" and m["unassembled"] == []
    assert sum("num_tokens" in s for s in m["skipped"]) == 4


@pytest.mark.parametrize("tp2", ["tp2", "tp2-gloo"])  # ranks played in turn; two processes in a gloo group
def test_tp2_unshards_to_the_tp1_tensors(d23: Path, tp2: str) -> None:
    one, two = _logical(d23 / "tp1"), _logical(d23 / tp2)
    kinds = {lt.name: lt.kind for lt in group_logical(read_dumper_dir(d23 / tp2).tensors).values()}
    assert kinds == {
        "hidden": "replicated",
        "attn_q": "split",
        "mlp_up": "split",
        "mlp_down": "partial",
        "mlp_out": "replicated",
        "logits": "replicated",
    }
    assert one.keys() == two.keys() and len(one) == 22
    for k, a in one.items():
        b = two[k]
        assert a.shape == b.shape, k
        # independent float64 check: the unsharded tensor against the single-rank one
        err = float((b.double() - a.double()).norm() / a.double().norm())
        assert err < 1e-6, (k, err)
    assert two["mlp_down [step=0 layer=0]"].dtype == torch.float64  # partial sums are added in float64


def test_split_overrides_the_dims(d23: Path) -> None:
    two = _logical(d23 / "tp2", split={"mlp_up": 0})
    assert two["mlp_up [step=0 layer=0]"].shape == (10, 4)  # as told: rank slices stacked along dim 0


def test_undeclared_axis_and_differing_copies_are_reported(
    d23: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    view = read_dumper_dir(d23 / "tp2-bad")
    problems = view.manifest["sglang_dumper"]["unassembled"]
    assert len(problems) == 4 and all("mlp_gate" in p and "tp (size 2)" in p and "kept per rank" in p for p in problems)
    home = str(tmp_path / "home")
    assert main(["--home", home, "compare", str(d23 / "tp1"), str(d23 / "tp2"), "--json"]) == 0
    capsys.readouterr()
    assert main(["--home", home, "compare", str(d23 / "tp1"), str(d23 / "tp2-bad"), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    notes = [n for p in doc["pairs"] for n in p.get("notes", []) if "replicas disagree" in n]
    assert len(notes) == 2 and all("rank=1" in n and "rank=0" in n for n in notes)  # the two ranks named
    differing = [p for p in doc["pairs"] if any("replicas disagree" in n for n in p.get("notes", []))]
    assert {p["name"] for p in differing} == {"hidden"}  # '# tp:replicated': declared, so a differing copy fails
    assert [p["status"] for p in differing] == ["fail", "fail"]
    assert all(
        any("declared replicas disagree" in r and "rank=1" in r and "rank=0" in r for r in p["reasons"])
        for p in differing
    )
    assert len(doc["only_b"]) == 8 and all("mlp_gate" in str(t) for t in doc["only_b"])  # kept per rank, unpaired
    assert main(["--home", home, "ingest", "--format", "sglang-dumper", str(d23 / "tp2-bad"), "--name", "bad"]) == 0
    assert capsys.readouterr().err.count("validator: warning: mlp_gate") == 4  # ingest says why


def test_a_stored_run_fails_declared_copies_as_the_folder_does(
    d23: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home = str(tmp_path / "home")
    assert main(["--home", home, "ingest", "--format", "sglang-dumper", str(d23 / "tp2-bad"), "--name", "bad"]) == 0
    capsys.readouterr()
    got = {}
    for b in (str(d23 / "tp2-bad"), "bad"):  # the folder itself, and the run stored from it
        assert main(["--home", home, "compare", str(d23 / "tp1"), b, "--json"]) == 1
        got[b] = json.loads(capsys.readouterr().out)["pairs"]
    direct, stored = got[str(d23 / "tp2-bad")], got["bad"]
    assert {p["label"]: p["status"] for p in stored} == {p["label"]: p["status"] for p in direct}
    failed = [p for p in stored if p["status"] == "fail"]
    assert {p["name"] for p in failed} == {"hidden"} and len(failed) == 2
    for p in failed:  # the copies named by their ranks (the stored record keeps no file name)
        (reason,) = [r for r in p["reasons"] if "replicas disagree" in r]
        assert reason.startswith("B: declared replicas disagree: run 'bad' ") and reason in p["notes"]
        assert "(replicated(rank=1, size=2)) differs from" in reason and reason.count("rank=0, size=2") == 1
    assert main(["--home", home, "show", "bad", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert {t["kind"] for t in shown["tensors"] if t["name"] == "hidden"} == {"replicated"}


def test_ingest_reads_the_dims(d23: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home = str(tmp_path / "home")
    assert main(["--home", home, "ingest", "--format", "sglang-dumper", str(d23 / "tp2"), "--name", "tp2"]) == 0
    capsys.readouterr()
    assert main(["--home", home, "show", "tp2", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert {t["kind"] for t in shown["tensors"] if t["name"] == "mlp_down"} == {"partial"}
    assert main(["--home", home, "compare", str(d23 / "tp1"), "tp2"]) == 0


def test_data_parallel_ranks_without_data_are_dropped(d23: Path) -> None:
    one, dp = _logical(d23 / "tp1"), _logical(d23 / "tp2-dp2")
    for k in ("hidden [step=1 layer=1]", "mlp_up [step=0 layer=1]", "mlp_down [step=1 layer=0]"):
        assert float((dp[k].double() - one[k].double()).norm() / one[k].double().norm()) < 1e-6
    probs = read_dumper_dir(d23 / "tp2-dp2").manifest["sglang_dumper"]["unassembled"]
    assert len(probs) == 2 and all(p.startswith("logits") and "different shapes" in p for p in probs)  # no dims


def _write(
    d: Path,
    rank: int,
    name: str,
    value: torch.Tensor,
    dims: str | None,
    info: dict[str, int],
    key: str = "megatron_parallel_info",
) -> None:
    meta: dict[str, object] = {"step": 0, "rank": rank, "name": name, key: info}
    if dims is not None:
        meta["dims"] = dims
    torch.save(
        {"value": value, "meta": meta},
        d / f"step=0___rank={rank}___dump_index=1___name={name}___recompute_status=disabled.pt",
    )


def test_context_parallel_zigzag_under_tensor_parallel(tmp_path: Path) -> None:
    # a sequence of 8 in 4 chunks of 2: CP rank c holds chunks c and 3-c (zigzag); TP splits the 6 features
    full = torch.arange(8 * 6, dtype=torch.float32).view(8, 6)
    d = tmp_path / "cp"
    d.mkdir()
    chunks = full.chunk(4)
    for rank in range(4):
        cp, tp = rank // 2, rank % 2
        mine = torch.cat([chunks[cp], chunks[3 - cp]])[:, tp * 3 : tp * 3 + 3].clone()
        info = {"cp_rank": cp, "cp_size": 2, "tp_rank": tp, "tp_size": 2}
        _write(d, rank, "x", mine, "s[cp:zigzag] h[tp]", info)
        _write(d, rank, "y", mine, "s[cp:zigzag] h[tp]" if rank != 3 else "s[cp] h[tp]", info)
        _write(d, rank, "z", mine, "t[cp:zigzag] h[tp]", info)  # packed sequences: their lengths are unknown
    view = read_dumper_dir(d)
    lt = next(lt for lt in group_logical(view.tensors).values() if lt.name == "x")
    assert lt.kind == "split" and torch.equal(lt.materialize(), full)
    problems = view.manifest["sglang_dumper"]["unassembled"]
    assert "different dims" in problems[0] and "zigzag order on dimension 't'" in problems[1]


def _differing_copies(tmp_path: Path, dims: str | None) -> Path:
    """A TP 2 dump whose rank 1 copy of ``x`` is off by 1e-3: declared replicated by the dims, or dumped without
    dims (as 0.5.9 dumps are: read as copies, a guess, since such a tensor may really be split)."""
    d = tmp_path / "copies"
    d.mkdir()
    x = torch.arange(6, dtype=torch.float32).view(2, 3)
    for rank in (0, 1):
        _write(d, rank, "x", x + 1e-3 * rank, dims, {"tp_rank": rank, "tp_size": 2}, key="sglang_parallel_info")
    return d


@pytest.mark.parametrize("dims", ["t h # tp:replicated", None])
def test_differing_copies_fail_only_where_declared(
    tmp_path: Path, dims: str | None, capsys: pytest.CaptureFixture[str]
) -> None:
    d = _differing_copies(tmp_path, dims)
    (lt,) = group_logical(read_dumper_dir(d).tensors).values()
    assert (
        lt.kind == "replicated" and [r.shard.replication for r in lt.shards] == ["declared" if dims else "assumed"] * 2
    )
    assert main(["--home", str(tmp_path / "home"), "compare", str(d), str(d), "--json"]) == (1 if dims else 0)
    (pair,) = json.loads(capsys.readouterr().out)["pairs"]
    notes = [n for n in pair["notes"] if "replicas disagree" in n]  # A's and B's: the same files
    what = "declared replicas disagree" if dims else "replicas disagree"
    assert [n[:3] for n in notes] == ["A: ", "B: "] and all(n[3:].startswith(what) for n in notes)
    assert all("rank=1" in n and "rank=0" in n for n in notes)
    if dims:
        assert pair["status"] == "fail" and all(n in pair["reasons"] for n in notes)
    else:  # assumed copies: a note, the pair judged on rank 0's copy
        assert pair["status"] == "pass" and not any("replicas disagree" in r for r in pair["reasons"])


@pytest.mark.parametrize("dims", ["t h # tp:replicated", None])
def test_stored_copies_keep_how_they_were_replicated(
    tmp_path: Path, dims: str | None, capsys: pytest.CaptureFixture[str]
) -> None:
    d = _differing_copies(tmp_path, dims)
    home = str(tmp_path / "home")
    assert main(["--home", home, "ingest", "--format", "sglang-dumper", str(d), "--name", "copies"]) == 0
    capsys.readouterr()
    assert main(["--home", home, "compare", str(d), "copies", "--json"]) == (1 if dims else 0)
    (pair,) = json.loads(capsys.readouterr().out)["pairs"]
    notes = [n for n in pair["notes"] if "replicas disagree" in n]
    what = "declared replicas disagree" if dims else "replicas disagree"
    assert [n[:3] for n in notes] == ["A: ", "B: "] and all(n[3:].startswith(what) for n in notes)
    assert pair["status"] == ("fail" if dims else "pass")
    assert (notes[1] in pair["reasons"]) == bool(dims)


def test_layout_problems_name_what_is_wrong(tmp_path: Path) -> None:
    d = tmp_path / "gap"
    d.mkdir()
    for rank in (0, 2):  # TP 3, rank 1's dump missing
        _write(d, rank, "x", torch.ones(2, 2), "t h[tp]", {"tp_rank": rank, "tp_size": 3}, key="sglang_parallel_info")
    assert (
        "incomplete: 2 of the 3 ranks over tp dumped it (tp ranks missing)"
        in read_dumper_dir(d).manifest["sglang_dumper"]["unassembled"][0]
    )
    d = tmp_path / "twins"
    d.mkdir()
    for rank in (0, 1):  # two ranks, nothing in their metadata tells them apart
        _write(d, rank, "x", torch.ones(2, 2), "t h[tp]", {})
    assert "ranks 0 and 1 both hold the slot" in read_dumper_dir(d).manifest["sglang_dumper"]["unassembled"][0]
    with pytest.raises(LayoutError, match="shape \\[2, 2\\] has 2 dimensions, dims 't h d' names 3"):
        plan_layout(parse_dims("t h d"), [{}], [(2, 2)], [0])


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("t h[xp]", "unknown parallel axis 'xp'"),
        ("t h[tp] # tp:replicated", "both sharded and replicated"),
        ("t h[tp:sum]", "unknown qualifier"),
        ("t t", "used twice"),
        ("t # tp", "cannot read 'tp' after '#'"),
        ("", "names no dimension"),
        ("t (a)[tp]", "bad fused dimension"),
    ],
)
def test_dims_grammar_errors(text: str, problem: str) -> None:
    with pytest.raises(LayoutError, match=problem.replace("[", "\\[").replace("(", "\\(")):
        parse_dims(text)


def test_dims_grammar() -> None:
    d = parse_dims("b s[cp:zigzag,sp] (nh*hd)[tp:partial] 1 # ep:replicated dp:=attn_dp")
    assert d.names == ("b", "s", "nh*hd", "1") and d.dp_axis == "attn_dp" and d.replicated == {"ep"}
    assert [m.axis for m in d.modifiers[1]] == ["cp", "sp"] and d.modifiers[1][0].zigzag and d.modifiers[2][0].partial


def test_a_recomputed_forward_is_a_copy_of_the_original(tmp_path: Path) -> None:
    # activation checkpointing: one rank dumps the tensor in the original forward and again in the recompute
    d = tmp_path / "recompute"
    d.mkdir()
    for i, status in enumerate(("original", "recompute")):
        meta = {"step": 0, "rank": 0, "dims": "t h", "recompute_pseudo_rank": i, "recompute_pseudo_size": 2}
        torch.save(
            {"value": torch.ones(2, 3) * (1 + i / 100), "meta": meta},
            d / f"step=0___rank=0___dump_index={i + 1}___name=x___recompute_status={status}.pt",
        )
    (lt,) = group_logical(read_dumper_dir(d).tensors).values()
    assert lt.kind == "replicated" and lt.coords.extra == ()  # no call= numbering: the same call, twice
    assert torch.equal(lt.materialize(), torch.ones(2, 3)) and "replicas disagree" in lt.notes[0]


def test_splits_and_sums_with_replicated_groups(tmp_path: Path) -> None:
    # world 4 = TP 2 x EP 2; the EP ranks hold copies. `f`: TP slices (rank 3's copy off); `o`: TP addends
    full, parts = torch.arange(12, dtype=torch.float32).view(3, 4), torch.randn(2, 3, 4, dtype=torch.float64)
    d = tmp_path / "ep"
    d.mkdir()
    for rank in range(4):
        tp, ep = rank % 2, rank // 2
        info = {"tp_rank": tp, "tp_size": 2, "moe_ep_rank": ep, "moe_ep_size": 2}
        _write(
            d,
            rank,
            "f",
            full[:, 2 * tp : 2 * tp + 2] + (rank == 3),
            "t f[tp] # moe_ep:replicated",
            info,
            key="sglang_parallel_info",
        )
        _write(d, rank, "o", parts[tp].clone(), "t h[tp:partial] # moe_ep:replicated", info, key="sglang_parallel_info")
    lts = {lt.name: lt for lt in group_logical(read_dumper_dir(d).tensors).values()}
    f, o = lts["f"], lts["o"]
    assert f.kind == "split" and {(r.shard.index, r.shard.replica, r.shard.replicas) for r in f.shards} == {
        (0, 0, 2),
        (1, 0, 2),
        (0, 1, 2),
        (1, 1, 2),
    }
    assert torch.equal(f.materialize(), full) and len(f.notes) == 1 and "rank=3" in f.notes[0]
    assert o.kind == "replicated" and len(o.shards) == 2  # per EP copy, the TP addends summed on load
    assert torch.allclose(o.materialize().double(), parts.sum(0)) and o.notes == []
