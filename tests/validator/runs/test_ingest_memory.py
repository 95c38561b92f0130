"""Ingest does not import torch, so its peak memory is the bytes it streams, not torch's ~260 MB of RSS.

Each ingest runs in a fresh interpreter (this one has long imported torch). The inputs are written here, in
the parent. Peak RSS is the child's VmHWM from /proc/self/status: ``ru_maxrss`` would carry this (large)
process's high-water mark across fork+exec.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from probes import BundleWriter
from tests.factories import tensors, write_tp_bundle
from tests.fresh_interpreter import run_child, torch_stack

CHILD = """
from pathlib import Path

face, home, paths = sys.argv[1], sys.argv[2], sys.argv[3:]
runs = []
if face == "cli":
    from validator.app.cli import main

    for p in paths:
        rc = main(["--home", home, "ingest", p, "--json"])
        if rc != 0:
            raise SystemExit(f"validator ingest {p}: exit {rc}")
else:
    from validator.settings import Settings
    from validator.service import Service

    svc = Service(Settings(home=Path(home)))
    runs = [svc.ingest(p).to_dict() for p in paths]
    svc.close()
hwm_kb = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
report(runs=runs, peak_mb=hwm_kb / 1024)
"""


def _ingest_in_child(face: str, home: Path, *paths: Path) -> dict[str, Any]:
    out = run_child(CHILD, face, str(home), *map(str, paths))
    assert not out["torch"], "ingest " + torch_stack(out)
    return out


def _safetensors(path: Path, seed: int = 0) -> Path:
    t = tensors(seed)
    save_file({"hidden": t["ctx"].to(torch.bfloat16), "k": t["k"], "ids": torch.arange(5)}, str(path))
    return path


def test_bundle_ingest_does_not_import_torch(tmp_path: Path) -> None:
    bundle = write_tp_bundle(tmp_path, "b", tensors(), tp=2)  # replicated + split shards, two parts
    out = _ingest_in_child("service", tmp_path / "home", bundle)
    (run,) = out["runs"]
    assert run["name"] == "b" and run["n_tensors"] == 4 and run["source"] == "bundle"


def test_safetensors_ingest_does_not_import_torch(tmp_path: Path) -> None:
    f = _safetensors(tmp_path / "one.safetensors")
    d = tmp_path / "dir"
    d.mkdir()
    _safetensors(d / "a.safetensors", seed=1)
    save_file({"other": torch.ones(3, dtype=torch.float16)}, str(d / "b.safetensors"))
    out = _ingest_in_child("service", tmp_path / "home", f, d)
    one, many = out["runs"]
    assert (one["name"], one["n_tensors"], one["source"]) == ("one", 3, "safetensors")
    assert (many["name"], many["n_tensors"]) == ("dir", 4)
    assert one["total_bytes"] == 8 * 16 * 2 + 8 * 8 * 4 * 4 + 5 * 8


def test_acceptance_and_full_bundle_ingest_do_not_import_torch(tmp_path: Path) -> None:
    """Partial sums, acceptance records and GSM8K rows in a bundle; a bare acceptance .jsonl file."""
    from tests.validator.app.dashboard.sample import RATES_REF, gsm8k_rows, write_model_bundle

    bundle = write_model_bundle(tmp_path, "rich", tp=2, noise=0.0, acceptance=RATES_REF, gsm8k=gsm8k_rows("ref"))
    jsonl = bundle / "parts" / "acceptance" / "acceptance.jsonl"
    out = _ingest_in_child("service", tmp_path / "home", bundle, jsonl)
    rich, acc = out["runs"]
    assert rich["name"] == "rich" and rich["n_tensors"] > 0
    assert (acc["name"], acc["source"], acc["n_tensors"]) == ("acceptance", "jsonl", 0)


def test_cli_ingest_does_not_import_torch(tmp_path: Path) -> None:
    bundle = write_tp_bundle(tmp_path, "b", tensors(), tp=2)
    home = tmp_path / "home"
    _ingest_in_child("cli", home, bundle, _safetensors(tmp_path / "one.safetensors"))
    from validator.service import Service
    from validator.settings import Settings

    svc = Service(Settings(home=home))
    try:
        assert sorted(r.name for r in svc.list_runs()) == ["b", "one"]
        t = svc.stored_view(svc.get_run("one")).tensors
        assert {r.name: r.dtype for r in t} == {"hidden": "bfloat16", "k": "float32", "ids": "int64"}
        assert torch.equal(next(r for r in t if r.name == "ids").load(), torch.arange(5))
    finally:
        svc.close()


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmHWM from /proc")
def test_ingest_peak_rss_is_bounded(tmp_path: Path) -> None:
    """256 MB in 32 MB tensors: the peak is the interpreter, the store's imports and one streaming buffer."""
    n, per = 8, 32 << 20
    with BundleWriter(tmp_path / "big", run_name="big", max_file_bytes=2 * per) as w:
        for i in range(n):
            w.add(f"layer{i}.hidden", torch.full((per // 2,), float(i), dtype=torch.bfloat16), step=0)
    out = _ingest_in_child("service", tmp_path / "home", tmp_path / "big")
    assert out["runs"][0]["total_bytes"] == n * per
    assert out["peak_mb"] < 200, f"ingest of {n * per >> 20} MB peaked at {out['peak_mb']:.0f} MB of RSS"
