"""The projection probe: layout checks, the three paths, pass-through stages and the bundles it writes."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from probes.core.bundle import BundleWriter, tensor_sha256
from probes.workloads.projection import (
    Kernels,
    ProjectionConfig,
    ProjectionConfigError,
    compute_path,
    default_paths,
    even_split,
    load_hidden_states,
    make_hidden_states,
    make_weights,
    parse_pp_split,
    plan_layout,
    run_probe,
    select_kernels,
    torch_rmsnorm,
    torch_rope,
)

# Small shapes with the deployment's structure: 6 capture layers, PP4 with two stages owning none.
SMALL = ProjectionConfig(
    hidden=128,
    layers=24,
    capture_layers=(9, 13, 14, 17, 20, 22),
    pp=4,
    draft_layers=2,
    kv_heads=2,
    head_dim=32,
    tokens=48,
    seed=3,
)
PASS_ON = dataclasses.replace(SMALL, capture_layers=(7, 10, 20), pp=4)  # stages 0 and 2 own no capture layer


def rel_l2(ref: torch.Tensor, x: torch.Tensor) -> float:
    r = ref.double()
    return float((x.double() - r).norm() / r.norm())


# -- layout -----------------------------------------------------------------------------------


def test_default_layout_is_sglang_even_split_of_kimi_k3() -> None:
    lay = plan_layout(ProjectionConfig())
    assert lay.sizes == [12, 12, 12, 12, 12, 11, 11, 11]
    assert lay.split_source == "even"
    owned = {s.stage: s.capture_layers for s in lay.stages}
    assert owned == {0: (), 1: (19,), 2: (), 3: (37,), 4: (54,), 5: (66,), 6: (78,), 7: (90,)}
    assert [s.features for s in lay.stages if s.features] == [(0,), (1,), (2,), (3,), (4,), (5,)]
    assert lay.first_contributing_stage == 1


def test_parse_pp_split_sizes_and_ranges() -> None:
    assert parse_pp_split("3,2,1") == ((0, 3), (3, 5), (5, 6))
    assert parse_pp_split("0:3, 3:5,5:6") == ((0, 3), (3, 5), (5, 6))
    assert even_split(7, 3) == ((0, 3), (3, 5), (5, 7))
    with pytest.raises(ProjectionConfigError, match="mixes"):
        parse_pp_split("0:3,3")
    with pytest.raises(ProjectionConfigError, match="cannot parse"):
        parse_pp_split("a,b")


def test_given_split_is_recorded() -> None:
    lay = plan_layout(dataclasses.replace(SMALL, pp_split=parse_pp_split("10,4,5,5")))
    assert lay.split_source == "given"
    assert lay.sizes == [10, 4, 5, 5]
    assert [s.capture_layers for s in lay.stages] == [(9,), (13,), (14, 17), (20, 22)]
    assert lay.stages[2].features == (2, 3)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        # the split stops at layer 21: capture layer 22 is in no stage
        ({"pp_split": parse_pp_split("6,6,6,4")}, r"capture layer\(s\) \[22\] belong to no pipeline stage"),
        # a gap in explicit ranges holding capture layer 13
        ({"pp_split": ((0, 12), (14, 18), (18, 21), (21, 24))}, r"\[13\] belong to no pipeline stage"),
        # a gap with no capture layer in it is refused too
        ({"pp_split": ((0, 6), (8, 12), (12, 18), (18, 24))}, r"layer\(s\) 6-7 are in no stage"),
        ({"pp_split": ((0, 10), (8, 12), (12, 18), (18, 24))}, r"more than one stage"),
        ({"pp_split": ((6, 12), (0, 6), (12, 18), (18, 24))}, r"not in layer order"),
        ({"pp_split": parse_pp_split("12,12")}, r"2 stages, PP size is 4"),
        ({"pp_split": ((0, 12), (12, 12), (12, 18), (18, 24))}, r"owns no layers"),
        ({"norm": "per_stage"}, r"applied once, after the full sum"),
        ({"capture_layers": (13, 9, 14, 17, 20, 22)}, r"out of order \(13 before 9\)"),
        ({"capture_layers": (9, 13, 13, 17)}, r"listed twice"),
        ({"capture_layers": (9, 24)}, r"capture layer 24 is out of range"),
        ({"capture_layers": ()}, r"no capture layers"),
        ({"head_dim": 31}, r"must be even"),
        ({"dtype": "int8"}, r"unknown dtype"),
        ({"pp": 30}, r"cannot split 24 layers over 30"),
    ],
)
def test_structural_errors(change: dict[str, Any], match: str) -> None:
    with pytest.raises(ProjectionConfigError, match=match):
        plan_layout(dataclasses.replace(SMALL, **change))


def test_checks_run_before_any_arithmetic(monkeypatch: pytest.MonkeyPatch) -> None:
    import probes.workloads.projection as mod

    def boom(*_: object, **__: object) -> None:
        raise AssertionError("inputs were built before the layout was checked")

    monkeypatch.setattr(mod, "make_hidden_states", boom)
    monkeypatch.setattr(mod, "make_weights", boom)
    with pytest.raises(ProjectionConfigError, match="per_stage"):
        run_probe(dataclasses.replace(SMALL, norm="per_stage"), device="cpu")
    with pytest.raises(ProjectionConfigError, match="unknown path"):
        run_probe(SMALL, device="cpu", paths=["concat", "partial-int8"])


def test_error_is_a_value_error() -> None:
    assert issubclass(ProjectionConfigError, ValueError)


# -- the paths --------------------------------------------------------------------------------


def test_hidden_states_are_seeded_and_have_outlier_channels() -> None:
    a = make_hidden_states(SMALL)
    b = make_hidden_states(SMALL)
    assert list(a) == list(SMALL.capture_layers)
    assert all(torch.equal(a[c], b[c]) for c in a)
    h = a[9].float()
    assert h.dtype == torch.float32 and a[9].dtype == torch.bfloat16
    col = h.abs().mean(0)
    assert float(col.max() / col.median()) > 8  # a few channels 10-100x the rest
    w = make_weights(SMALL)
    assert w.fc.shape == (128, 6 * 128)
    assert w.kv[0].shape == (2 * 2 * 32, 128)
    assert abs(float(w.hidden_norm.float().mean()) - 1) < 0.05


def test_paths_agree_within_bf16_bounds() -> None:
    run = run_probe(SMALL, device="cpu")
    assert list(run.paths) == ["concat", "partial-bf16", "partial-fp32", "ref"]
    ref = run.paths["ref"]
    assert ref.pre_norm.dtype == torch.float64 and ref.k[0].dtype == torch.float64
    for name in ("concat", "partial-bf16", "partial-fp32"):
        p = run.paths[name]
        assert p.pre_norm.dtype == torch.bfloat16
        assert p.k[0].shape == (SMALL.tokens, SMALL.kv_heads, SMALL.head_dim)
        assert rel_l2(ref.pre_norm, p.pre_norm) < 1e-2
        assert rel_l2(ref.normed, p.normed) < 1e-2
        for i in range(SMALL.draft_layers):
            assert rel_l2(ref.k[i], p.k[i]) < 2e-2
            assert rel_l2(ref.v[i], p.v[i]) < 2e-2
        assert rel_l2(run.paths["concat"].normed, p.normed) < 1e-2
    # float32 hand-off is as close to the single GEMM as float32 rounding allows
    assert rel_l2(run.paths["concat"].pre_norm, run.paths["partial-fp32"].pre_norm) < 2e-3
    # the float64 running sum after the last stage is the reference pre-norm projection
    assert rel_l2(ref.pre_norm, ref.stages[-1].running) < 1e-12


@pytest.mark.parametrize("dtype", ["fp64", "fp32"])
def test_concat_equals_partial_in_high_precision(dtype: str) -> None:
    cfg = dataclasses.replace(SMALL, dtype=dtype)
    run = run_probe(cfg, device="cpu", paths=["concat", f"partial-{dtype}"])
    c, p = run.paths["concat"], run.paths[f"partial-{dtype}"]
    bound = 1e-12 if dtype == "fp64" else 1e-5
    assert rel_l2(c.pre_norm, p.pre_norm) < bound
    assert rel_l2(c.normed, p.normed) < bound
    for i in range(cfg.draft_layers):
        assert rel_l2(c.k[i], p.k[i]) < bound
        assert rel_l2(c.v[i], p.v[i]) < bound


def test_stage_without_capture_layer_passes_the_sum_on() -> None:
    lay = plan_layout(PASS_ON)
    assert [s.capture_layers for s in lay.stages] == [(), (7, 10), (), (20,)]
    run = run_probe(PASS_ON, device="cpu", paths=["partial-bf16", "ref"])
    st = run.paths["partial-bf16"].stages
    assert st[0].partial is None and not st[0].running.any()
    assert st[2].partial is None and st[2].running is st[1].running
    assert st[1].partial is not None and st[3].partial is not None
    assert torch.equal(st[1].running, st[1].partial)  # 0 + x is exact
    assert torch.equal(st[3].running, st[1].running + st[3].partial)
    assert torch.equal(run.paths["partial-bf16"].pre_norm, st[3].running)
    assert rel_l2(run.paths["ref"].pre_norm, run.paths["partial-bf16"].pre_norm) < 1e-2


def test_partial_fp32_keeps_stage_outputs_in_fp32() -> None:
    lay = plan_layout(SMALL)
    hs = make_hidden_states(SMALL)
    w = make_weights(SMALL)
    res = compute_path(
        "partial-fp32",
        [hs[c] for c in SMALL.capture_layers],
        w,
        SMALL,
        lay,
        select_kernels("torch", torch.device("cpu")),
    )
    assert res.accum_dtype == "fp32"
    assert all(s.running.dtype == torch.float32 for s in res.stages)
    assert res.pre_norm.dtype == torch.bfloat16  # rounded once, where hidden_norm consumes it


def test_paths_list_and_defaults() -> None:
    assert default_paths(SMALL) == ("concat", "partial-bf16", "partial-fp32", "ref")
    assert default_paths(dataclasses.replace(SMALL, dtype="float32")) == ("concat", "partial-fp32", "ref")
    with pytest.raises(ProjectionConfigError, match="twice"):
        run_probe(SMALL, device="cpu", paths=["concat", "concat"])


# -- kernels ----------------------------------------------------------------------------------


def test_kernel_selection_on_cpu() -> None:
    k = select_kernels("auto", torch.device("cpu"))
    assert k.describe() == {"rmsnorm": "torch", "rope": "torch"}
    with pytest.raises(ProjectionConfigError, match="CUDA"):
        select_kernels("flashinfer", torch.device("cpu"))
    with pytest.raises(ProjectionConfigError, match="kernels must be"):
        select_kernels("triton", torch.device("cpu"))


def test_torch_rmsnorm_and_rope_match_definitions() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 3, 16, generator=g, dtype=torch.float64)
    w = torch.rand(16, generator=g, dtype=torch.float64) + 0.5
    expect = x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6) * w
    torch.testing.assert_close(torch_rmsnorm(x, w, 1e-6), expect)
    # neox RoPE == multiplying (x[:d/2] + i x[d/2:]) by exp(i * pos * theta^(-2j/d))
    y = torch_rope(x, 100.0)
    pos = torch.arange(5, dtype=torch.float64)[:, None, None]
    freq = 100.0 ** (-torch.arange(0, 16, 2, dtype=torch.float64) / 16)
    z = torch.complex(x[..., :8], x[..., 8:]) * torch.polar(torch.ones((), dtype=torch.float64), pos * freq)
    torch.testing.assert_close(y, torch.cat([z.real, z.imag], dim=-1))
    torch.testing.assert_close(y[0], x[0])  # position 0 is the identity
    yb = torch_rope(x.to(torch.bfloat16), 100.0)
    assert yb.dtype == torch.bfloat16 and rel_l2(y, yb) < 1e-2


class _FakeFlashinfer:
    """Stands in for flashinfer with the documented semantics of the two calls the probe makes:
    ``norm.rmsnorm(input [n, d], weight, eps)`` and ``rope.apply_rope_with_cos_sin_cache_inplace(positions,
    query [nnz, Hq*D], key [nnz, Hk*D], head_size, cos_sin_cache [max_pos, D] = cat(cos, sin), is_neox)``,
    which rotates query and key in place."""

    class norm:
        @staticmethod
        def rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
            assert x.dim() == 2
            return torch_rmsnorm(x, w, eps)

    class rope:
        @staticmethod
        def apply_rope_with_cos_sin_cache_inplace(
            positions: torch.Tensor,
            query: torch.Tensor,
            key: torch.Tensor,
            head_size: int,
            cos_sin_cache: torch.Tensor,
            is_neox: bool = True,
        ) -> None:
            assert is_neox and cos_sin_cache.dtype == torch.float32 and positions.dtype == torch.int64
            half = cos_sin_cache.shape[1] // 2
            cos = cos_sin_cache[positions, :half][:, None, :]
            sin = cos_sin_cache[positions, half:][:, None, :]
            for t in (query, key):
                v = t.view(t.shape[0], -1, head_size).float()
                x1, x2 = v[..., :half], v[..., half:]
                t.copy_(torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).reshape(t.shape))


def test_flashinfer_wrapper_plumbing_leaves_inputs_alone() -> None:
    k = Kernels(_FakeFlashinfer(), "fake")
    assert k.describe() == {"rmsnorm": "flashinfer fake", "rope": "flashinfer fake"}
    g = torch.Generator().manual_seed(1)
    x = torch.randn(40, 3, 32, generator=g).to(torch.bfloat16)
    w = (1 + 0.1 * torch.randn(32, generator=g)).to(torch.bfloat16)
    x0 = x.clone()
    torch.testing.assert_close(k.rmsnorm(x, w, 1e-6), torch_rmsnorm(x, w, 1e-6))
    torch.testing.assert_close(k.rope(x, 1e4), torch_rope(x, 1e4), atol=0.02, rtol=0.01)
    assert torch.equal(x, x0)  # the in-place kernel worked on a copy
    # float64 (the reference path) never goes to the kernels
    xd = x.double()
    assert torch.equal(k.rope(xd, 1e4), torch_rope(xd, 1e4))


# -- bundles ----------------------------------------------------------------------------------


def _records(bundle: Path) -> list[dict[str, Any]]:
    part = json.loads((bundle / "parts" / "part0" / "part.json").read_text())
    recs: list[dict[str, Any]] = part["tensors"]
    return recs


def test_bundles_are_readable(tmp_path: Path) -> None:
    run = run_probe(PASS_ON, tmp_path, device="cpu", prefix="t")
    assert set(run.bundles) == {"concat", "partial-bf16", "partial-fp32", "ref"}
    for name, root in run.bundles.items():
        root_p = Path(root)
        assert root_p == tmp_path / name
        man = json.loads((root_p / "manifest.json").read_text())
        assert man["format"] == "validator-bundle"
        assert man["run"]["name"] == f"t-{name}"
        labels = man["run"]["labels"]
        assert labels["topology"] == "pp4" and labels["dtype"] == "bf16" and labels["tokens"] == "48"
        assert labels["seed"] == "3" and labels["path"] == name and labels["kernels"] == "rmsnorm=torch,rope=torch"
        assert man["run"]["kernels"] == {"rmsnorm": "torch", "rope": "torch"}
        # the single GEMM has no running sum: no accumulation label (never the string "None")
        assert labels.get("accum") == {"concat": None, "ref": "fp64"}.get(name, name.removeprefix("partial-"))
        assert man["run"]["layout"]["sizes"] == [6, 6, 6, 6]
        recs = _records(root_p)
        files = {r["file"] for r in recs}
        data = {k: v for f in files for k, v in load_file(str(root_p / "parts" / "part0" / str(f))).items()}
        for r in recs:
            assert tensor_sha256(data[str(r["key"])]) == r["sha256"]
        names = [(r["name"], (r["coords"] or {}).get("layer")) for r in recs]
        assert ("ctx.pre_norm", None) in names and ("ctx.normed", None) in names
        assert {("draft.k", 0), ("draft.v", 0), ("draft.k", 1), ("draft.v", 1)} <= set(names)
        by_name = {r["name"]: r for r in recs}
        assert by_name["draft.k"]["shape"] == [48, 2, 32]
        expect_dtype = "float64" if name == "ref" else "bfloat16"
        assert by_name["ctx.normed"]["dtype"] == expect_dtype
        if name in ("partial-bf16", "partial-fp32", "ref"):
            partials = [r for r in recs if r["name"] == "ctx.partial"]
            assert [r["coords"]["pp_stage"] for r in partials] == [1, 3]
            assert all(
                r["shard"] == {"kind": "partial", "index": r["coords"]["pp_stage"], "count": 4} for r in partials
            )
            running = [r for r in recs if r["name"] == "ctx.running"]
            assert len(running) == 4
            # stage 2 owns no capture layer: the sum it hands on is byte-identical to the one it got
            assert running[2]["sha256"] == running[1]["sha256"]
        else:
            assert not [r for r in recs if r["name"] in ("ctx.partial", "ctx.running")]
    # a second run into the same directory is refused, not merged
    with pytest.raises(ValueError, match="already exists"):
        run_probe(PASS_ON, tmp_path, device="cpu", prefix="t", paths=["concat"])


def test_hidden_states_from_a_bundle(tmp_path: Path) -> None:
    hs = make_hidden_states(SMALL)
    with BundleWriter(tmp_path / "cap", run_name="cap") as w:
        for c, h in hs.items():
            w.add("target.hidden", h, layer=c, step=0)
        w.add("target.hidden", hs[9], layer=5, step=0)  # not a capture layer: ignored
    loaded = load_hidden_states(tmp_path / "cap", SMALL.capture_layers)
    assert all(torch.equal(loaded[c], hs[c]) for c in hs)
    a = run_probe(SMALL, device="cpu", paths=["concat"])
    b = run_probe(dataclasses.replace(SMALL, tokens=1, hidden=8), device="cpu", paths=["concat"], hidden=loaded)
    assert b.config.tokens == SMALL.tokens and b.config.hidden == SMALL.hidden
    assert torch.equal(a.paths["concat"].k[1], b.paths["concat"].k[1])
    with pytest.raises(ProjectionConfigError, match=r"capture layer\(s\) \[23\]"):
        load_hidden_states(tmp_path / "cap", (9, 23))
    with pytest.raises(ProjectionConfigError, match="no complete parts"):
        load_hidden_states(tmp_path, (9,))


def test_probe_imports_with_torch_only() -> None:
    code = (
        "import sys, probes.workloads.projection\n"
        "bad = [m for m in ('validator', 'flashinfer', 'sqlalchemy') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[3])


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a torch without CUDA")
def test_cuda_device_without_cuda_is_a_configuration_error(capsys: pytest.CaptureFixture[str]) -> None:
    from validator.workloads.projection_report import main

    assert main(["--device", "cuda", "--tokens", "8", "--hidden", "64", "--draft-layers", "1"]) == 2
    err = capsys.readouterr().err
    assert "--device cuda" in err and "no usable CUDA" in err and "Traceback" not in err
