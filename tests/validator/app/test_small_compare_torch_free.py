"""`validator compare` of small files and bundles never imports torch (issue 36: the whole process within 2x of
`validator runs`, whose time torch's import alone would double): the CLI runs in a fresh interpreter that
records where torch was first imported from. A pair that needs torch (integers, a float8 rounding floor, a
pair above the NumPy pass's size) imports it, and only then."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from tests.factories import tensors, write_tp_bundle
from tests.fresh_interpreter import run_child, torch_stack
from validator.numerics.backends.small import NUMPY_MAX

CHILD = """
import contextlib, io

from validator.app.cli import main

home, argv = sys.argv[1], json.loads(sys.argv[2])
out = io.StringIO()
with contextlib.redirect_stdout(out):
    rc = main(["--home", home, *argv])
report(rc=rc, out=out.getvalue())
"""


def _compare(home: Path, *argv: str | Path) -> dict[str, object]:
    return run_child(CHILD, str(home), json.dumps(["compare", *map(str, argv)]))


def _write(path: Path, seed: int, **extra: torch.Tensor) -> Path:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(64, 64, generator=g)
    save_file({"bf16": x.to(torch.bfloat16), "f32": x, "f16": x.to(torch.float16), "e4m3": x.to(torch.float8_e4m3fn),
               "e5m2": x.to(torch.float8_e5m2), "f64": x.double(), **extra}, str(path))  # fmt: skip
    return path


def test_comparing_small_files_and_bundles_does_not_import_torch(tmp_path: Path) -> None:
    a, b, fa, fb = (
        _write(tmp_path / f"{n}.safetensors", seed) for n, seed in (("a", 0), ("b", 1), ("fa", 2), ("fb", 3))
    )
    policy = tmp_path / "floors.toml"
    policy.write_text('[[rule]]\nmatch = "*"\nfloor_multiple = 1.5\n')
    x = torch.randn(64, 64, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    ma, mb = tmp_path / "ma.safetensors", tmp_path / "mb.safetensors"
    save_file({"x": x.float(), "y": x}, str(ma))
    save_file({"x": (x * 1.001).to(torch.bfloat16), "y": (x * 1.001).half()}, str(mb))
    ra = write_tp_bundle(tmp_path, "ra", tensors(seed=3), tp=1)
    rb = write_tp_bundle(tmp_path, "rb", tensors(seed=3), tp=1, noise=1e-2)
    home = tmp_path / "home"
    runs = [
        (a, b),
        (a, b, "--json"),
        (a, b, "--floor", fa, fb),
        (ra, rb, "--json"),
    ]
    for argv in runs:
        out = _compare(home, *argv)
        assert out["rc"] in (0, 1, 3), out
        assert not out["torch"], f"{argv}: " + torch_stack(out)
    # a float32 reference of a bfloat16 candidate, a float64 one of a float16: their rounding floors in NumPy too
    out = _compare(home, ma, mb, "--policy", policy, "--json")
    assert out["rc"] in (0, 1, 3) and not out["torch"], torch_stack(out)
    assert {p["floor_kind"] for p in json.loads(str(out["out"]))["pairs"]} == {"rounding"}


def test_pairs_that_need_torch_import_it(tmp_path: Path) -> None:
    home = tmp_path / "home"
    cases = {
        "ints": {"i": torch.arange(12, dtype=torch.int32)},
        "large": {"x": torch.randn(NUMPY_MAX + 1).to(torch.bfloat16)},
    }
    for name, content in cases.items():
        a, b = tmp_path / f"{name}-a.safetensors", tmp_path / f"{name}-b.safetensors"
        save_file(content, str(a))
        save_file({k: v + 1 for k, v in content.items()}, str(b))
        out = _compare(home, a, b, "--json")
        assert out["rc"] in (0, 1, 3), out
        assert out["torch"], name
        assert {p["label"] for p in json.loads(str(out["out"]))["pairs"]} == set(content)
