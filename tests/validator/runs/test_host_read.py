"""A comparison reads its small float tensors as NumPy (``numerics.host.HostArray``), without torch, and gives
the JSON that reading every tensor into torch gives, byte for byte: on every dtype a file can hold (the
integer and bool ones, and the pairs too large for the NumPy pass, go through torch either way), in every
shape, with NaN and infinities, from plain files, bundles and the store, with and without a noise floor."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from tests.factories import tensors, write_stack_bundle, write_tp_bundle
from validator.judging.compare import compare_runs
from validator.judging.policy import Policy
from validator.numerics.backends.small import NUMPY_MAX
from validator.numerics.host import HostArray
from validator.runs.reassembly import group_logical, materialize_many
from validator.runs.sources import open_path
from validator.runs.view import RunView
from validator.service import Service
from validator.settings import Settings

FLOATS = ["float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2"]
OTHERS = ["int64", "int32", "int8", "uint8", "bool"]
SHAPES = [(), (0,), (1,), (5,), (16, 64), (3, 4, 5), (NUMPY_MAX,), (NUMPY_MAX + 1,)]


def _drifted(shape: tuple[int, ...], seed: int, noise: float) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(shape, generator=g, dtype=torch.float64)
    b = a * (1 + noise * torch.randn(shape, generator=g, dtype=torch.float64))
    fa, fb = a.view(-1), b.view(-1)
    for i, v in enumerate([math.nan, math.inf, -math.inf]):  # past the first few elements: NaN and infinities
        if fa.numel() > 20 + 3 * i:
            fa[10 + 3 * i] = v
            fb[11 + 3 * i] = v
            fa[12 + 3 * i] = fb[12 + 3 * i] = v
    return a, b


def _write_files(d: Path, noise: float, seed: int) -> tuple[Path, Path]:
    """Two files of the same tensors, B drifted by ``noise``: every dtype in every shape, and pairs of two
    dtypes (a more precise reference: its rounding floor)."""
    sa: dict[str, torch.Tensor] = {}
    sb: dict[str, torch.Tensor] = {}
    for i, shape in enumerate(SHAPES):
        a, b = _drifted(shape, seed + i, noise)
        for dtype in FLOATS:
            key = f"{dtype}.s{i}"
            sa[key], sb[key] = a.to(getattr(torch, dtype)), b.to(getattr(torch, dtype))
        for dtype in OTHERS:
            key = f"{dtype}.s{i}"
            clean = torch.nan_to_num(a * 40, nan=0.0, posinf=100.0, neginf=-100.0)
            sa[key] = (clean > 0) if dtype == "bool" else clean.abs().to(getattr(torch, dtype))
            sb[key] = sa[key].clone()
            if sb[key].numel() > 3:
                sb[key].view(-1)[3] = not bool(sa[key].view(-1)[3]) if dtype == "bool" else sa[key].view(-1)[3] + 1
        for ref, cand in [
            ("float64", "float32"),
            ("float32", "bfloat16"),
            ("float64", "float16"),
            ("float32", "float8_e4m3fn"),
        ]:
            key = f"{ref}-{cand}.s{i}"
            sa[key], sb[key] = a.to(getattr(torch, ref)), b.to(getattr(torch, cand))
    sa["shape-mismatch"], sb["shape-mismatch"] = torch.zeros(4, 3), torch.zeros(3, 4)
    pa, pb = d / f"a{seed}.safetensors", d / f"b{seed}.safetensors"
    save_file({k: v.clone() for k, v in sa.items()}, str(pa))  # (a float64 tensor is its own .to(float64))
    save_file({k: v.clone() for k, v in sb.items()}, str(pb))
    return pa, pb


def _through_torch(view: RunView) -> RunView:
    """The same run, each tensor readable only by loading it into torch (as every tensor was read before)."""
    refs = [dataclasses.replace(r, location=None, read_into=None) for r in view.tensors]
    return dataclasses.replace(view, tensors=refs)


FLOORED = Policy.from_dict({"rule": [{"match": "*", "floor_multiple": 1.5}]})  # measures the rounding floors


def _json(a: RunView, b: RunView, floor: tuple[RunView, RunView] | None = None, policy: Policy | None = None) -> str:
    return json.dumps(compare_runs(a, b, floor=floor, policy=policy).to_dict(), indent=2, sort_keys=True)


def test_small_tensors_read_as_numpy_compare_as_torch_tensors(tmp_path: Path) -> None:
    a, b = _write_files(tmp_path, 1e-2, seed=0)
    fa, fb = _write_files(tmp_path, 1e-3, seed=50)
    va, vb, vfa, vfb = (open_path(p) for p in (a, b, fa, fb))
    ta, tb, tfa, tfb = (_through_torch(v) for v in (va, vb, vfa, vfb))
    assert _json(va, vb) == _json(ta, tb)
    got = _json(va, vb, policy=FLOORED)
    assert got == _json(ta, tb, policy=FLOORED)
    assert _json(va, vb, (vfa, vfb), FLOORED) == _json(ta, tb, (tfa, tfb), FLOORED)
    labels = {p["label"]: p for p in json.loads(got)["pairs"]}
    assert labels["shape-mismatch"]["status"] == "error"
    for pair in ("float32-bfloat16.s4", "float64-float16.s5", "float32-float8_e4m3fn.s4"):
        assert labels[pair]["floor_kind"] == "rounding", labels[pair]
    assert labels["bfloat16.s4"]["metrics"]["nonfinite_a"] == 6  # NaN, +Inf, -Inf: one A has alone, one both have


def _raw(t: torch.Tensor) -> torch.Tensor:
    return torch.empty(t.numel(), dtype=t.dtype).copy_(t.reshape(-1)).view(torch.uint8)


def test_what_is_read_as_numpy(tmp_path: Path) -> None:
    a, _ = _write_files(tmp_path, 1e-2, seed=0)
    logical = list(group_logical(open_path(a).tensors).values())
    got = dict(zip((t.name for t in logical), materialize_many(logical)))
    for t in logical:
        host = isinstance(got[t.name], HostArray)
        assert host == (t.dtype in FLOATS and math.prod(t.shape()) <= NUMPY_MAX), t.name
        want = t.materialize()
        loaded = got[t.name].to_torch() if isinstance(got[t.name], HostArray) else got[t.name]
        assert isinstance(loaded, torch.Tensor) and loaded.dtype == want.dtype and loaded.shape == want.shape
        assert torch.equal(_raw(loaded), _raw(want)), t.name


@pytest.mark.parametrize("tp", [1, 2])
def test_bundles_compare_as_through_torch(tmp_path: Path, tp: int) -> None:
    full = tensors(seed=3)
    a = open_path(write_tp_bundle(tmp_path, "a", full, tp=tp, noise=0.0))
    b = open_path(write_tp_bundle(tmp_path, "b", full, tp=tp, noise=1e-2, seed=7))
    assert _json(a, b) == _json(_through_torch(a), _through_torch(b))
    sa = open_path(write_stack_bundle(tmp_path, "sa", layers=6))
    sb = open_path(write_stack_bundle(tmp_path, "sb", layers=6, fault_layer=3))
    assert _json(sa, sb) == _json(_through_torch(sa), _through_torch(sb))


def test_stored_runs_compare_as_through_torch(tmp_path: Path) -> None:
    a, b = _write_files(tmp_path, 1e-2, seed=0)
    svc = Service(Settings(home=tmp_path / "home"))
    try:
        svc.ingest(a, name="ra")
        svc.ingest(b, name="rb")
        ra, rb = svc.resolve("ra"), svc.resolve("rb")
        assert all(r.read_into is not None for r in ra.tensors)
        assert _json(ra, rb) == _json(_through_torch(ra), _through_torch(rb))
    finally:
        svc.close()
