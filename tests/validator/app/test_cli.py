from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from tests.factories import tensors, write_tp_bundle
from validator.app.cli import main


@pytest.fixture
def home(tmp_path: Path) -> list[str]:
    return ["--home", str(tmp_path / "home")]


def _run(capsys, argv: list[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_ingest_runs_show_compare(tmp_path: Path, home: list[str], capsys) -> None:
    full = tensors()
    a = write_tp_bundle(tmp_path, "ref", full, tp=4)
    b = write_tp_bundle(tmp_path, "cand", full, tp=32, noise=0.5)
    assert _run(capsys, home + ["ingest", str(a), "--label", "topology=P-TP4"])[0] == 0
    assert _run(capsys, home + ["ingest", str(b)])[0] == 0
    code, out, _ = _run(capsys, home + ["runs", "--json"])
    assert code == 0 and [r["name"] for r in json.loads(out)["runs"]] == ["cand", "ref"]
    code, out, _ = _run(capsys, home + ["runs", "--label", "topology=P-TP4"])
    assert "ref" in out and "cand" not in out
    code, out, _ = _run(capsys, home + ["show", "ref"])
    assert code == 0 and "split" in out and "replicated" in out
    junit = tmp_path / "j.xml"
    code, out, _ = _run(capsys, home + ["compare", "ref", "cand", "--json", "--junit", str(junit)])
    doc = json.loads(out)
    assert code == 1 and doc["verdict"] == "fail"
    assert {"name", "status", "rel_l2", "cosine", "max_abs"} <= set(doc["pairs"][0])
    suite = ET.parse(junit).getroot()
    assert suite.get("tests") == "2" and suite.get("failures") == "2"
    code, out, _ = _run(capsys, home + ["compare", "ref", str(a)])
    assert code == 0 and "verdict: PASS" in out


def test_compare_plain_safetensors_files_and_worst_first(tmp_path: Path, home: list[str], capsys) -> None:
    g = torch.Generator().manual_seed(0)
    base = {f"t{i}": torch.randn(64, generator=g) for i in range(3)}
    cand = {k: v.clone() for k, v in base.items()}
    cand["t1"] = cand["t1"] + 0.1 * torch.randn(64, generator=g)
    cand["t2"] = cand["t2"] + 1e-6
    cand["extra"] = torch.zeros(1)
    save_file(base, str(tmp_path / "a.safetensors"))
    save_file(cand, str(tmp_path / "b.safetensors"))
    code, out, _ = _run(capsys, home + ["compare", str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors"), "--json"])
    doc = json.loads(out)
    assert code == 1
    assert [p["name"] for p in doc["pairs"]][0] == "t1"
    assert doc["only_b"] == ["extra"] and doc["only_a"] == []
    # with a policy that only warns about one-sided tensors and loosens fp32
    pol = tmp_path / "p.toml"
    pol.write_text('missing = "warn"\n[[rule]]\nmatch = "t*"\nrel_l2_max = 0.5\n')
    code, out, _ = _run(capsys, home + ["compare", str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors"),
                                        "--policy", str(pol)])
    assert code == 0, out
    assert "only in B (1): extra" in out


def test_floor_makes_thresholds_relative(tmp_path: Path, home: list[str], capsys) -> None:
    g = torch.Generator().manual_seed(1)
    ref = torch.randn(1000, generator=g, dtype=torch.float64)
    noise = torch.randn(1000, generator=g, dtype=torch.float64)
    for name, scale in (("ref", 0.0), ("floor", 1e-3), ("ok", 1.2e-3), ("bad", 5e-3)):
        save_file({"x": ref + scale * noise}, str(tmp_path / f"{name}.safetensors"))
    f = [str(tmp_path / "ref.safetensors"), str(tmp_path / "floor.safetensors")]
    code, out, _ = _run(capsys, home + ["compare", f[0], str(tmp_path / "ok.safetensors"), "--floor", *f, "--json"])
    assert code == 0 and json.loads(out)["pairs"][0]["floor_rel_l2"] == pytest.approx(1e-3, rel=0.2)
    code, out, _ = _run(capsys, home + ["compare", f[0], str(tmp_path / "bad.safetensors"), "--floor", *f])
    assert code == 1 and "FAIL: x: 5x measured floor" in out
    # a floor that lacks the tensor: inconclusive (exit 3), never a silent pass
    save_file({"y": ref}, str(tmp_path / "other.safetensors"))
    code, out, _ = _run(capsys, home + ["compare", f[0], str(tmp_path / "ok.safetensors"), "--floor",
                                        str(tmp_path / "other.safetensors"), str(tmp_path / "other.safetensors")])
    assert code == 3 and "inconclusive" in out.lower()


@pytest.mark.parametrize(
    "setup, msg",
    [
        (lambda p: p.write_bytes(b"not a safetensors file at all"), "bad.safetensors"),
        (lambda p: save_file({"x": torch.ones(2)}, str(p)) or p.write_bytes(p.read_bytes()[:-3]), "truncated"),
    ],
)
def test_bad_input_is_one_line_exit_2(tmp_path: Path, home: list[str], capsys, setup, msg: str) -> None:
    bad = tmp_path / "bad.safetensors"
    setup(bad)
    save_file({"x": torch.ones(2)}, str(tmp_path / "good.safetensors"))
    code, out, err = _run(capsys, home + ["compare", str(tmp_path / "good.safetensors"), str(bad)])
    assert code == 2 and msg in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    code, out, err = _run(capsys, home + ["ingest", str(bad)])
    assert code == 2 and msg in err
    assert _run(capsys, home + ["runs", "--json"])[1].strip() == json.dumps({"runs": []}, indent=1)


def test_shape_mismatch_is_an_error_pair(tmp_path: Path, home: list[str], capsys) -> None:
    save_file({"x": torch.ones(2, 3)}, str(tmp_path / "a.safetensors"))
    save_file({"x": torch.ones(3, 2)}, str(tmp_path / "b.safetensors"))
    code, out, _ = _run(capsys, home + ["compare", str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors")])
    assert code == 1 and "shape mismatch: A [2, 3] vs B [3, 2]" in out


def test_unknown_run_and_usage(home: list[str], capsys) -> None:
    code, _, err = _run(capsys, home + ["show", "nope"])
    assert code == 2 and "no run named 'nope'" in err
    with pytest.raises(SystemExit) as exc:
        main(home + ["compare", "only-one"])
    assert exc.value.code == 2


def test_console_script_end_to_end(tmp_path: Path) -> None:
    """The installed `validator` entry point, as a user runs it (output not a terminal: no progress bar)."""
    full = tensors()
    a = write_tp_bundle(tmp_path, "a", full, tp=2)
    exe = Path(sys.executable).parent / "validator"
    env = {**os.environ, "VALIDATOR_HOME": str(tmp_path / "h")}
    r = subprocess.run([str(exe), "ingest", str(a)], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""  # no progress bar when not on a terminal
    r = subprocess.run([str(exe), "compare", "a", str(a), "--json"], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0 and json.loads(r.stdout)["verdict"] == "pass"
    # `python -m validator`, the same entry: a failing verdict and a usage error keep their exit codes to the end
    save_file({"x": torch.ones(8)}, str(tmp_path / "a.safetensors"))
    save_file({"x": torch.full((8,), 2.0)}, str(tmp_path / "b.safetensors"))
    cmd = [sys.executable, "-m", "validator", "compare", str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors")]
    r = subprocess.run([*cmd, "--junit", "j.xml"], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert r.returncode == 1 and "verdict: FAIL" in r.stdout and r.stderr == "", r.stdout + r.stderr
    assert ET.parse(tmp_path / "j.xml").getroot().get("failures") == "1"  # written whole before the exit
    r = subprocess.run(cmd[:4], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert r.returncode == 2 and "usage:" in r.stderr


def test_an_empty_listing_names_the_store_it_read(tmp_path: Path, capsys) -> None:
    code, out, _ = _run(capsys, ["--home", str(tmp_path / "elsewhere"), "runs"])
    assert code == 0 and f"no runs in the store at {tmp_path / 'elsewhere'}" in out and "VALIDATOR_HOME" in out
    code, out, _ = _run(capsys, ["--db", f"sqlite:///{tmp_path / 'x.db'}", "--home", str(tmp_path / "h"), "runs"])
    assert code == 0 and "x.db" in out
