"""The projection report: pairs and points compared, table and JSON forms, the command-line entry points."""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from probes.core.bundle import BundleWriter
from probes.workloads.projection import ProjectionConfig, make_hidden_states, run_probe
from tests.paths import ROOT
from validator.workloads.projection_report import (
    add_arguments,
    build_report,
    config_from_args,
    format_table,
    run_from_args,
    run_projection_report,
)

SMALL = ProjectionConfig(
    hidden=96,
    layers=16,
    capture_layers=(3, 6, 9, 14),
    pp=4,
    draft_layers=2,
    kv_heads=2,
    head_dim=16,
    tokens=32,
    seed=1,
)
SMALL_ARGS = [
    "--hidden",
    "96",
    "--layers",
    "16",
    "--capture-layers",
    "3,6,9,14",
    "--pp",
    "4",
    "--draft-layers",
    "2",
    "--kv-heads",
    "2",
    "--head-dim",
    "16",
    "--tokens",
    "32",
    "--seed",
    "1",
    "--device",
    "cpu",
]


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args(argv)


def test_report_pairs_points_and_floor() -> None:
    report = run_projection_report(SMALL, device="cpu")
    assert report.ok and bool(report)
    assert report.pairs() == [
        ("concat", "ref"),
        ("partial-bf16", "ref"),
        ("partial-fp32", "ref"),
        ("partial-bf16", "concat"),
        ("partial-fp32", "concat"),
    ]
    points = [c.point for c in report.comparisons if (c.candidate, c.reference) == ("concat", "ref")]
    assert points == ["ctx.pre_norm", "ctx.normed", "draft.k[0]", "draft.v[0]", "draft.k[1]", "draft.v[1]"]
    for c in report.comparisons:
        m = c.metrics
        assert m.nonfinite_mismatch == 0
        assert m.rel_l2 < 2e-2 and m.cosine > 0.9995
        if c.reference == "ref":
            assert m.dtype_a == "float64" and c.ulp_vs_rounded_ref is not None
            assert c.floor_ratio is not None
            if c.candidate == "concat":
                assert c.floor_ratio == pytest.approx(1.0)
        else:
            assert c.floor_ratio is None and m.max_ulp is not None
    # fp32 accumulation lands on the single GEMM far more closely than bf16 accumulation
    by = {(c.candidate, c.reference, c.point): c.metrics.rel_l2 for c in report.comparisons}
    assert by[("partial-fp32", "concat", "ctx.pre_norm")] < by[("partial-bf16", "concat", "ctx.pre_norm")]
    # stage view: one row per partial path and stage, error grows (weakly) along the pipeline for bf16
    assert len(report.stage_view) == 2 * 4
    bf = [s.metrics.rel_l2 for s in report.stage_view if s.candidate == "partial-bf16"]
    assert bf[-1] >= bf[0]
    assert report.run["tolerances"] == {"atol": 1e-5, "rtol": 1.6e-2, "used_for": "pass_ratio"}


def test_to_dict_is_strict_json_and_table_has_every_section() -> None:
    report = build_report(run_probe(SMALL, device="cpu"))
    data = report.to_dict()
    text = json.dumps(data, allow_nan=False)
    back = json.loads(text)
    assert back["probe"] == "projection" and back["ok"] is True
    assert back["config"]["capture_layers"] == [3, 6, 9, 14]
    assert back["layout"]["sizes"] == [4, 4, 4, 4]
    assert back["handoff_bytes"]["bf16"]["bytes_per_token_per_stage"] == 96 * 2
    assert back["handoff_bytes"]["fp32"]["bytes_per_token_per_stage"] == 96 * 4
    assert back["kernels"] == {"rmsnorm": "torch", "rope": "torch"}
    assert {s["candidate"] for s in back["summary"]} == {"concat", "partial-bf16", "partial-fp32"}
    table = format_table(report)
    for needle in (
        "Summary",
        "Per capture point",
        "Stage view",
        "PP hand-off",
        "partial-bf16 | concat",
        "draft.v[1]",
        "split 4,4,4,4 (even)",
        "kernels rmsnorm=torch rope=torch",
    ):
        assert needle in table, needle


def test_run_from_args_writes_bundles_and_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    code = run_from_args(parse([*SMALL_ARGS, "--pp-split", "3,5,4,4", "--out", str(out), "--json"]))
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert data["layout"]["split"] == "given" and data["layout"]["sizes"] == [3, 5, 4, 4]
    assert json.loads((out / "report.json").read_text())["layout"] == data["layout"]
    assert (out / "report.md").read_text().startswith("Projection probe:")
    for p in ("concat", "partial-bf16", "partial-fp32", "ref"):
        assert (out / p / "manifest.json").is_file()
        assert data["bundles"][p] == str(out / p)


def test_run_from_args_table_without_bundles(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = run_from_args(
        parse([*SMALL_ARGS, "--paths", "concat,partial-bf16", "--out", str(tmp_path), "--no-bundles"])
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "partial-bf16 | concat" in out and "| ref |" not in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json", "report.md"]


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        (["--pp-split", "4,4,4,2"], "[14] belong to no pipeline stage"),
        (["--capture-layers", "6,3,9,14"], "out of order"),
        (["--paths", "concat,partial-int4"], "unknown path"),
    ],
)
def test_bad_configuration_exits_2(extra: list[str], match: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_from_args(parse([*SMALL_ARGS, *extra])) == 2
    assert match in capsys.readouterr().err


def test_from_bundle(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    hs = make_hidden_states(dataclasses.replace(SMALL, seed=9))
    with BundleWriter(tmp_path / "cap", run_name="cap") as w:
        for c, h in hs.items():
            w.add("target.hidden", h, layer=c)
    code = run_from_args(
        parse([*SMALL_ARGS, "--tokens", "7", "--from-bundle", str(tmp_path / "cap"), "--json"])
    )
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert data["inputs"].startswith("bundle ") and data["config"]["tokens"] == 32
    code = run_from_args(
        parse([*SMALL_ARGS, "--capture-layers", "3,6,9,15", "--from-bundle", str(tmp_path / "cap")])
    )
    assert code == 2
    assert "[15]" in capsys.readouterr().err


def test_defaults_are_kimi_k3() -> None:
    cfg = config_from_args(parse([]))
    assert cfg == ProjectionConfig()
    assert (cfg.hidden, cfg.layers, cfg.capture_layers, cfg.pp) == (7168, 93, (19, 37, 54, 66, 78, 90), 8)
    assert (cfg.draft_layers, cfg.kv_heads, cfg.head_dim, cfg.tokens, cfg.dtype) == (6, 8, 128, 8192, "bf16")


def test_report_module_imports_without_the_store_stack() -> None:
    code = (
        "import sys, validator.workloads.projection_report\n"
        "bad = [m for m in ('sqlalchemy', 'alembic', 'fastapi', 'pandas', 'flashinfer') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
