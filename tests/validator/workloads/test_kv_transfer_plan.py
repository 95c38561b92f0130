"""The PD draft-KV transfer plan and its checker (the worked case of docs/sglang.md, section 6)."""

from __future__ import annotations

from pathlib import Path

import pytest

from probes.core.shards import ShardSpec
from probes.engines.sglang.heads import HeadLayoutError, head_ranks, kv_head_shard, rank_heads
from validator.workloads.kv_transfer_plan import (
    KVLayout,
    PDLayoutError,
    PlanEntry,
    check_compatible,
    check_plan,
    parse_plan,
    transfer_plan,
)

P_BASE = {"k": 1_000_000_000, "v": 1_500_000_000}
D_BASE = {"k": 2_000_000, "v": 3_000_000}


def layouts(page_layout: str = "NHD", p_tp: int = 4, d_tp: int = 32, layers: tuple[int, ...] = (0,)) -> tuple[KVLayout, KVLayout]:
    def side(tp: int, base: dict[str, int], stride: int) -> KVLayout:
        bufs = {r: {k: tuple(base[k] + r * stride + i * 10_000_000 for i in range(len(layers))) for k in "kv"} for r in range(tp)}
        return KVLayout(tp_size=tp, total_kv_heads=8, head_dim=128, dtype="bfloat16", page_size=64,
                        layers=layers, page_layout=page_layout, buffers=bufs)

    # D rank r's buffers start at 2000000 + r * 100000000: rank 0's K buffer base is exactly 2000000
    return side(p_tp, P_BASE, 50_000_000), side(d_tp, D_BASE, 100_000_000)


def flat_plan(p: KVLayout, d: KVLayout, dst_rank: int, pages: int) -> list[PlanEntry]:
    """The connector bug: the source item length for source offset, destination offset and length."""
    src = head_ranks(rank_heads(dst_rank, d.tp_size, 8)[0], p.tp_size, 8)[0]
    out = []
    for li, layer in enumerate(d.layers):
        for kind in "kv":
            for page in range(pages):
                out.append(PlanEntry(layer, page, p.buffers[src][kind][li] + page * p.page_bytes,
                                     d.buffers[dst_rank][kind][li] + page * p.page_bytes, p.page_bytes, len(out)))
    return out


def as_entries(runs: list) -> list[PlanEntry]:
    return [PlanEntry(r.layer, r.page, r.src_addr, r.dst_addr, r.length, i) for i, r in enumerate(runs)]


@pytest.mark.parametrize("page_layout", ["NHD", "HND"])
def test_worked_case_from_facts(page_layout: str) -> None:
    p, d = layouts(page_layout)
    assert p.page_bytes == 32768 and d.page_bytes == 16384
    runs = [r for r in transfer_plan(p, d, 0, pages=3) if r.kind == "k" and r.page == 2]
    assert runs[0].dst_addr == 2032768
    assert sum(r.length for r in runs) == 16384
    assert {r.src_rank for r in runs} == {0} and {r.head for r in runs} == {0}
    check = check_plan(p, d, 0, flat_plan(p, d, 0, 3))
    assert not check
    page2 = [w for w in check.wrong if w.entry.page == 2 and w.expected and w.expected.kind == "k"]
    assert len(page2) == 1
    w = page2[0]
    assert (w.entry.dst_addr, w.entry.length) == (2065536, 32768)
    assert (w.expected.dst_start, w.expected.nbytes) == (2032768, 16384)
    text = w.describe()
    assert "2065536" in text and "32768" in text and "2032768" in text and "16384" in text


@pytest.mark.parametrize("page_layout", ["NHD", "HND"])
def test_every_flat_entry_is_reported(page_layout: str) -> None:
    p, d = layouts(page_layout, layers=(0, 1, 2))
    plan = flat_plan(p, d, 5, 4)
    check = check_plan(p, d, 5, plan)
    # page 0 of a flat plan starts right, but copies a whole P page (2 heads) into a 1-head D page
    assert sorted(w.entry.index for w in check.wrong) == list(range(len(plan)))
    assert check.covered_bytes == 0 and check.expected_bytes == 3 * 2 * 4 * 16384
    assert len(check.missing) == 3 * 2 * 4


@pytest.mark.parametrize("page_layout", ["NHD", "HND"])
@pytest.mark.parametrize(("p_tp", "d_tp"), [(4, 32), (32, 4), (8, 8), (2, 8), (16, 1)])
def test_the_head_aware_plan_passes_its_own_check(page_layout: str, p_tp: int, d_tp: int) -> None:
    p, d = layouts(page_layout, p_tp, d_tp, layers=(3, 4))
    for dst in {0, d_tp // 2, d_tp - 1}:
        runs = transfer_plan(p, d, dst, pages=[0, 2, 5])
        check = check_plan(p, d, dst, as_entries(runs), pages=[0, 2, 5])
        assert check.ok, check.lines()
        assert check.covered_bytes == check.expected_bytes == 2 * 2 * 3 * d.page_bytes


def test_head_mapping_tp4_to_tp32() -> None:
    p, d = layouts("HND")
    for dst in range(32):
        (run,) = [r for r in transfer_plan(p, d, dst) if r.kind == "k"]
        head = dst // 4
        assert run.head == head and run.src_rank == head // 2
        assert run.src_addr == p.buffers[head // 2]["k"][0] + (head % 2) * 16384
        assert run.length == 16384


def test_replicated_sources_any_holder_is_accepted() -> None:
    p, d = layouts("HND", p_tp=32, d_tp=4)  # each head on 4 P ranks; D rank holds 2 heads
    runs = transfer_plan(p, d, 1, src_choice=2)
    assert {r.src_rank for r in runs} == {10, 14}
    assert check_plan(p, d, 1, as_entries(runs)).ok
    other = transfer_plan(p, d, 1, src_choice=3)
    assert check_plan(p, d, 1, as_entries(other)).ok


def test_finer_entries_missing_and_duplicate() -> None:
    p, d = layouts("HND")
    runs = transfer_plan(p, d, 3, pages=2)
    halves = []
    for r in runs:
        h = r.length // 2
        halves += [PlanEntry(r.layer, r.page, r.src_addr, r.dst_addr, h), PlanEntry(r.layer, r.page, r.src_addr + h, r.dst_addr + h, h)]
    halves = [PlanEntry(e.layer, e.page, e.src_addr, e.dst_addr, e.length, i) for i, e in enumerate(halves)]
    assert check_plan(p, d, 3, halves).ok
    dropped = check_plan(p, d, 3, halves[1:])
    assert not dropped and not dropped.wrong
    assert [(pe.page, pe.kind, n) for pe, n in dropped.missing] == [(0, "k", 8192)]
    dup = check_plan(p, d, 3, [*halves, PlanEntry(**{**halves[0].to_dict(), "index": 99})])
    assert dup.overlaps == ((0, 99, 8192),) and not dup.wrong and not dup.missing


def test_wrong_source_head_is_reported() -> None:
    p, d = layouts("HND")
    (run,) = [r for r in transfer_plan(p, d, 4) if r.kind == "v"]  # head 1: P rank 0, second head slot
    k = [r for r in transfer_plan(p, d, 4) if r.kind == "k"]
    bad = PlanEntry(run.layer, run.page, run.src_addr - 16384, run.dst_addr, run.length, 1)  # head 0 instead
    check = check_plan(p, d, 4, [PlanEntry(k[0].layer, 0, k[0].src_addr, k[0].dst_addr, k[0].length, 0), bad])
    assert [w.entry.index for w in check.wrong] == [1]
    assert "src_addr" in check.wrong[0].reasons[0] and str(run.src_addr) in check.wrong[0].reasons[0]


def test_nhd_entry_spanning_two_tokens_is_wrong() -> None:
    p, d = layouts("NHD")
    runs = [r for r in transfer_plan(p, d, 0) if r.kind == "k"]
    assert len(runs) == 64 and {r.length for r in runs} == {256}
    merged = PlanEntry(0, 0, runs[0].src_addr, runs[0].dst_addr, 512, 0)  # src is strided (2 heads per token)
    check = check_plan(p, d, 0, [merged])
    assert check.wrong and "contiguous" in check.wrong[0].reasons[0]


def test_incompatible_layouts_are_refused() -> None:
    p, d = layouts()
    with pytest.raises(PDLayoutError, match="head_dim"):
        check_compatible(p, KVLayout(tp_size=32, total_kv_heads=8, head_dim=64, layers=(0,)))
    with pytest.raises(PDLayoutError, match="layers"):
        check_compatible(p, KVLayout(tp_size=32, total_kv_heads=8, head_dim=128, layers=(1,)))
    with pytest.raises(PDLayoutError, match="dtype"):
        transfer_plan(p, KVLayout(tp_size=32, total_kv_heads=8, head_dim=128, dtype="float16", layers=(0,)), 0)
    with pytest.raises(PDLayoutError, match="split evenly"):
        KVLayout(tp_size=3, total_kv_heads=8, head_dim=128)
    with pytest.raises(PDLayoutError, match="replicate"):
        KVLayout(tp_size=12, total_kv_heads=8, head_dim=128)
    with pytest.raises(PDLayoutError, match="no K buffer addresses"):
        transfer_plan(p, KVLayout(tp_size=32, total_kv_heads=8, head_dim=128, layers=(0,)), 0)


def test_from_dict_and_parse_plan() -> None:
    lay = KVLayout.from_dict({"tp_size": 2, "total_kv_heads": 8, "head_dim": 128, "dtype": "bf16", "page_size": 64,
                              "layers": 2, "buffers": {"1": [1, 2, 3, 4]}})
    assert lay.layers == (0, 1) and lay.buffers[1] == {"k": (1, 2), "v": (3, 4)} and lay.dtype == "bfloat16"
    with pytest.raises(PDLayoutError, match="unknown layout key"):
        KVLayout.from_dict({"tp_size": 2, "total_kv_heads": 8, "head_dim": 128, "heads": 3})
    plan = parse_plan([{"layer": 0, "page": 1, "src_addr": 5, "dst_addr": 6, "length": 7, "note": "x"}])
    assert plan[0].to_dict() == {"layer": 0, "page": 1, "src_addr": 5, "dst_addr": 6, "length": 7}
    with pytest.raises(PDLayoutError, match="missing 'length'"):
        parse_plan([{"layer": 0, "page": 1, "src_addr": 5, "dst_addr": 6}])


def test_kv_head_shards_match_the_bundle_format_example() -> None:
    for r in range(4):
        assert kv_head_shard(r, 4, 8) == ShardSpec.split(1, r, 4)
    for r in range(32):
        assert kv_head_shard(r, 32, 8) == ShardSpec.split(1, r // 4, 8, replica=r % 4, replicas=4)
    assert list(rank_heads(13, 32, 8)) == [3] and head_ranks(3, 32, 8) == [12, 13, 14, 15]
    with pytest.raises(HeadLayoutError):
        kv_head_shard(0, 3, 8)


def test_cli_plan_and_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from validator.app.cli import main

    p, d = layouts("HND")
    lay = {"total_kv_heads": 8, "head_dim": 128, "dtype": "bfloat16", "page_size": 64, "layers": [0], "page_layout": "HND"}
    (tmp_path / "p.json").write_text(json.dumps({**lay, "tp_size": 4, "buffers": {"0": {"k": [P_BASE["k"]], "v": [P_BASE["v"]]}}}))
    (tmp_path / "d.json").write_text(json.dumps({**lay, "tp_size": 32, "buffers": {"0": {"k": [D_BASE["k"]], "v": [D_BASE["v"]]}}}))
    flat = [e.to_dict() for e in flat_plan(p, d, 0, 3)]
    (tmp_path / "flat.json").write_text(json.dumps(flat))
    args = ["pd-layout", "check", "--prefill", str(tmp_path / "p.json"), "--decode", str(tmp_path / "d.json"), "--dst-rank", "0"]
    assert main([*args, "--plan", str(tmp_path / "flat.json")]) == 1
    out = capsys.readouterr().out
    assert "dst_addr 2065536" in out and "expected layer 0 page 2 K: dst_addr 2032768, 16384 bytes" in out
    assert main(["pd-layout", "plan", *args[2:], "--pages", "3", "--json"]) == 0
    good = json.loads(capsys.readouterr().out)
    assert [r["dst_addr"] for r in good if r["kind"] == "k"] == [2000000, 2016384, 2032768]
    (tmp_path / "good.json").write_text(json.dumps(good))
    assert main([*args, "--plan", str(tmp_path / "good.json"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ok"] is True
    (tmp_path / "d.json").write_text(json.dumps({**lay, "tp_size": 32, "head_dim": 64}))
    assert main([*args, "--plan", str(tmp_path / "good.json")]) == 2
    assert "incompatible P/D draft KV layouts: head_dim: P 128 vs D 64" in capsys.readouterr().err
