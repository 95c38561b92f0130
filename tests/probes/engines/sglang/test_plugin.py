"""The plugin at work on the fake DFlash path: loading through the launcher, per-request steps, acceptance,
draft K/V shards that line up across TP layouts (a D-only TP8 run vs a TP2 run), and PP partial sums with
the capture-coverage check (and the "capture only on the last PP rank" bug caught)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from probes.core.capture import ProbeWarning
from probes.engines.sglang import activate, check_coverage, deactivate, read_reports
from probes.engines.sglang.launch import environment
from tests.paths import ROOT
from validator.runs.reassembly import group_logical
from validator.runs.sources import open_path

from .fake_sglang import CAPTURE, HEAD_DIM, KV_HEADS

PP1_POINTS = "target.hidden,ctx.project,draft.kv,draft.logits,accept"


def part(bundle: Path, name: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((bundle / "parts" / name / "part.json").read_text())
    return doc


def test_launcher_end_to_end(fake_sglang: Path, tmp_path: Path) -> None:
    bundle = tmp_path / "run"
    base = {k: v for k, v in os.environ.items() if not k.startswith(("VALIDATOR_", "PYTHONPATH", "FAKE_"))}
    env = environment(
        {
            **base,
            "PYTHONPATH": f"{fake_sglang}{os.pathsep}{ROOT}",
            "VALIDATOR_PROBE_BUNDLE": str(bundle),
            "VALIDATOR_PROBE_RUN_NAME": "donly",
            "VALIDATOR_PROBE_LABELS": "topology=D:TP1",
            "VALIDATOR_SGLANG_ROLE": "decode",
            "VALIDATOR_SGLANG_POINTS": PP1_POINTS,
            "VALIDATOR_SGLANG_REQUIRED": "selected",
        }
    )
    r = subprocess.run(
        [sys.executable, "-m", "probes.engines.sglang.launch", "--module", "fake_server"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    manifest = json.loads((bundle / "manifest.json").read_text())["run"]
    assert manifest["name"] == "donly" and manifest["labels"]["topology"] == "D:TP1"
    assert manifest["labels"]["engine"] == "sglang" and manifest["labels"]["sglang_version"] == "0.5.23+fake"
    pts = manifest["sglang"]["points"]
    assert pts["ctx.project"]["active"] and pts["ctx.project"]["selected"] and pts["ctx.project"]["required"]
    assert not pts["pp.send"]["selected"] and not pts["draft.kv_steps"]["selected"]
    doc = part(bundle, "decode-pp0-tp0")
    rep = doc["extra"]["probe"]["sglang"]
    assert rep["wrapped"]["ctx.project"] == {
        "sglang.srt.models.dflash.DFlashDraftModel.project_target_hidden": "wrapped"
    }
    assert rep["never_reached"] == [] and rep["first_error"] is None and rep["forwards"] == 3
    names = Counter(t["name"] for t in doc["tensors"])
    assert names == {
        "target.hidden": 18,
        "target.features": 18,
        "ctx.pre_norm": 6,
        "ctx.normed": 6,
        "draft.k": 12,
        "draft.v": 12,
        "draft.hidden": 4,
        "draft.logits": 4,
        "draft.tokens": 4,
    }
    k = [t for t in doc["tensors"] if t["name"] == "draft.k"]
    prefill = {(t["coords"]["request"], t["coords"]["layer"]): t for t in k if t["coords"]["step"] == 0}
    assert prefill[("req-a", 0)]["coords"]["tokens"] == [0, 5] and prefill[("req-bb", 1)]["coords"]["tokens"] == [0, 3]
    assert prefill[("req-a", 0)]["shape"] == [5, KV_HEADS, HEAD_DIM]
    feats = {t["coords"]["layer"] for t in doc["tensors"] if t["name"] == "target.features"}
    assert feats == set(CAPTURE)
    acc = [json.loads(x) for x in (bundle / "parts" / "decode-pp0-tp0" / "acceptance.jsonl").read_text().splitlines()]
    assert [(a["request_id"], a["step"], len(a["proposed"])) for a in acc] == [
        ("req-a", 1, 3),
        ("req-bb", 1, 3),
        ("req-a", 2, 3),
        ("req-bb", 2, 3),
    ]
    # decode step 1: prefix 5 and 3, fixed accept pattern (5 + i) % 4 -> 1, 2; committed rows = accepted + 1
    step1 = {t["coords"]["request"]: t for t in k if t["coords"]["step"] == 1 and t["coords"]["layer"] == 0}
    assert [a["accepted"] for a in acc[:2]] == [1, 2]
    assert step1["req-a"]["coords"]["tokens"] == [5, 7] and step1["req-bb"]["coords"]["tokens"] == [3, 6]
    view = open_path(bundle)
    assert view.has_acceptance and len(group_logical(view.tensors)) == len(doc["tensors"])


def run_ranks(
    fake: Path,
    bundle: Path,
    monkeypatch: pytest.MonkeyPatch,
    *,
    tp: int,
    role: str,
    points: str = PP1_POINTS,
    pp: int = 1,
    driver: Any = None,
) -> None:
    """Play every rank of a run in this process, one after the other (each its own part)."""
    import fake_server

    env = {
        "VALIDATOR_PROBE_BUNDLE": str(bundle),
        "VALIDATOR_PROBE_RUN_NAME": bundle.name,
        "VALIDATOR_SGLANG_ROLE": role,
        "VALIDATOR_SGLANG_POINTS": points,
        "VALIDATOR_PROBE_DRAIN": "inline",
    }
    monkeypatch.setenv("FAKE_TP_SIZE", str(tp))
    monkeypatch.setenv("FAKE_PP_SIZE", str(pp))
    for stage in range(pp):
        for rank in range(tp):
            monkeypatch.setenv("FAKE_TP_RANK", str(rank))
            monkeypatch.setenv("FAKE_PP_RANK", str(stage))
            assert activate(env, search_path=[str(fake)], register_atexit=False) is not None
            (driver or fake_server.main)()
            deactivate()


def test_draft_kv_heads_line_up_across_tp_layouts(
    fake_sglang: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FAKE_DECODE_STEPS", "1")
    a, b = tmp_path / "pd-tp2", tmp_path / "donly-tp8"
    run_ranks(fake_sglang, a, monkeypatch, tp=2, role="prefill")
    run_ranks(fake_sglang, b, monkeypatch, tp=8, role="decode")
    va, vb = open_path(a), open_path(b)
    ka = {lt.label: lt for lt in group_logical(va.tensors).values() if lt.name == "draft.k"}
    kb = {lt.label: lt for lt in group_logical(vb.tensors).values() if lt.name == "draft.k"}
    assert ka.keys() == kb.keys() and len(ka) == 8
    one = ka["draft.k [step=0 req=req-a tok=0:5 layer=1]"]
    assert {str(r.shard) for r in one.shards} == {"split(dim=1, rank=0, size=2)", "split(dim=1, rank=1, size=2)"}
    other = kb["draft.k [step=0 req=req-a tok=0:5 layer=1]"]
    assert "split(dim=1, rank=3, size=4, replica=1, replicas=2)" in {str(r.shard) for r in other.shards}
    for label, lt in ka.items():
        x, y = lt.materialize(), kb[label].materialize()
        assert x.shape == y.shape and x.shape[1:] == (KV_HEADS, HEAD_DIM)
        assert torch.allclose(x, y, atol=1e-5), label  # different GEMM shapes: not bitwise
        assert not kb[label].notes  # replicas of each head agree
    # and through the comparison the CLI runs
    from validator.app.cli import main

    rc = main(["--home", str(tmp_path / "home"), "compare", str(a), str(b), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 3 and doc["verdict"] == "inconclusive"  # 4 verify steps: too few to judge acceptance
    # "(closest: ...)" follows where a pair's rel_l2 is not 0: the two TP layouts' GEMMs round alike on some CPUs only
    assert any(r.startswith("all 54 pairs within their limits") for r in doc["reasons"]), doc["reasons"]


PP_POINTS = "target.hidden,ctx.project,ctx.partial,ctx.write,pp.send,draft.kv"


def pp_driver(buggy: bool) -> Any:
    def drive() -> None:
        import fake_server
        import torch
        from sglang.srt.distributed.parallel_state import get_pp_group
        from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
        from sglang.srt.model_executor.model_runner import ModelRunner
        from sglang.srt.models.dflash import DFlashDraftModel
        from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2

        pp = get_pp_group()
        stage, n = pp.rank_in_group, pp.world_size
        span = [(0, 4), (4, 8)][stage]
        tgt = ModelRunner(lambda: fake_server.Target(*span, stage == n - 1, buggy))
        tgt.load_model()
        tgt.model.set_dflash_layers_to_capture(list(CAPTURE))
        pool = MHATokenToKVPool(64, 2, KV_HEADS, HEAD_DIM)
        draft = ModelRunner(lambda: DFlashDraftModel(16, CAPTURE, 2, KV_HEADS, HEAD_DIM), True, pool)
        draft.load_model()
        g = torch.Generator().manual_seed(5)
        embed = torch.randn(32, 16, generator=g)
        worker = DFlashWorkerV2(tgt, draft, embed, SimpleNamespace(weight=torch.randn(32, 16, generator=g)), 4)
        lens = [5, 3]
        batch = SimpleNamespace(
            reqs=[SimpleNamespace(rid="req-a"), SimpleNamespace(rid="req-bb")],
            extend_lens=lens,
            prefix_lens=[0, 0],
            input_ids=[torch.arange(k) % 32 for k in lens],
            forward_mode=SimpleNamespace(is_extend=lambda: True),
        )
        proxy = STATE.get("proxy")
        out = worker.forward_batch_generation(batch, pp_proxy_tensors=proxy)
        STATE["proxy"] = out if stage < n - 1 else None

    return drive


STATE: dict[str, Any] = {}


def run_pp(fake: Path, bundle: Path, monkeypatch: pytest.MonkeyPatch, buggy: bool) -> list[str]:
    STATE.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_ranks(fake, bundle, monkeypatch, tp=1, pp=2, role="prefill", points=PP_POINTS, driver=pp_driver(buggy))
    return [str(w.message) for w in caught if issubclass(w.category, ProbeWarning)]


def test_pp_partial_sums_and_coverage(fake_sglang: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_DECODE_STEPS", "0")
    pp1 = tmp_path / "pp1"
    run_ranks(fake_sglang, pp1, monkeypatch, tp=1, role="prefill", points="target.hidden,ctx.project,draft.kv")
    good, bad = tmp_path / "pp2", tmp_path / "pp2-bug"
    msgs = run_pp(fake_sglang, good, monkeypatch, buggy=False)
    assert any("never reached" in m and "ctx.write" in m for m in msgs)  # stage 0 writes no draft KV: said so
    run_pp(fake_sglang, bad, monkeypatch, buggy=True)

    s0, s1 = part(good, "prefill-pp0-tp0"), part(good, "prefill-pp1-tp0")
    assert {(t["name"], t["coords"].get("layer")) for t in s0["tensors"] if t["name"] == "target.features"} == {
        ("target.features", 1)
    }
    partial = [t for t in s1["tensors"] if t["name"] == "ctx.partial"]
    assert {json.dumps(t["shard"], sort_keys=True) for t in partial} == {
        json.dumps({"kind": "partial", "index": 1, "count": 2}, sort_keys=True)
    }
    assert {t["name"] for t in s0["tensors"]} >= {"pp.send.dspark_ctx_acc", "ctx.partial", "target.hidden"}

    cov = check_coverage(read_reports(good))
    assert cov.ok, cov.lines()
    assert cov.stages == {0: (0, 4), 1: (4, 8)} and cov.capture_layers == CAPTURE
    cov_bad = check_coverage(read_reports(bad))
    assert not cov_bad
    assert any("layer 1: stage 0 owns it but SGLang does not capture it there" in p for p in cov_bad.problems)
    from probes.engines.sglang.__main__ import main as probes_main

    assert probes_main(["coverage", str(bad)]) == 1 and probes_main(["coverage", str(good)]) == 0

    # the PP run's summed projection and draft K/V match the PP1 run; with the bug they do not
    def logical(bundle: Path, name: str) -> dict[str, Any]:
        return {lt.label: lt for lt in group_logical(open_path(bundle).tensors).values() if lt.name == name}

    ref, got, wrong = (logical(b, "ctx.pre_norm") for b in (pp1, good, bad))
    assert ref.keys() == got.keys() == wrong.keys() and len(ref) == 2
    for label in ref:
        assert ref[label].materialize().allclose(got[label].materialize(), atol=1e-5)
        assert not ref[label].materialize().allclose(wrong[label].materialize(), atol=1e-3)
    summed = logical(good, "ctx.partial")
    for label, lt in summed.items():
        assert lt.kind == "partial" and len(lt.shards) == 2
        assert lt.materialize().allclose(
            ref[label.replace("ctx.partial", "ctx.pre_norm")].materialize().double(), atol=1e-5
        )
    kref, kgot = logical(pp1, "draft.k"), logical(good, "draft.k")
    assert kref.keys() == kgot.keys()
    for label in kref:
        assert kref[label].materialize().allclose(kgot[label].materialize(), atol=1e-5)

    # `validator compare` of the buggy PP run fails on coverage, whatever the tensors say
    from validator.judging.compare import compare_runs

    c = compare_runs(open_path(pp1), open_path(bad))
    assert c.verdict == "fail"
    assert any("B: capture coverage: layer 1" in r for r in c.reasons)
    assert open_path(good).manifest["coverage"]["ok"] is True


def test_close_file_closes_idle_ranks(fake_sglang: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SGLang SIGKILLs its scheduler processes: the part is closed by the close file, not by an exit handler."""
    import time

    import fake_server

    monkeypatch.setenv("FAKE_DECODE_STEPS", "1")
    flag, bundle = tmp_path / "close-now", tmp_path / "run"
    env = {
        "VALIDATOR_PROBE_BUNDLE": str(bundle),
        "VALIDATOR_SGLANG_POINTS": "ctx.project,accept",
        "VALIDATOR_SGLANG_CLOSE_FILE": str(flag),
    }
    plugin = activate(env, search_path=[str(fake_sglang)], register_atexit=False)
    assert plugin is not None
    fake_server.main()
    plugin.watch_close_file(0.05)
    assert not (bundle / "parts" / "pp0-tp0" / "part.json").exists()
    flag.touch()
    deadline = time.monotonic() + 10
    while not plugin.closed and time.monotonic() < deadline:
        time.sleep(0.02)
    assert plugin.closed and (bundle / "parts" / "pp0-tp0" / "part.json").exists()
    assert (bundle / "parts" / "pp0-tp0" / "acceptance.jsonl").exists()
    deactivate()
    from probes.core.config import ProbeConfigError

    with pytest.raises(ProbeConfigError, match="already exists"):
        activate(env, search_path=[str(fake_sglang)], register_atexit=False)
