"""The real server process, pushed to by separate CLI processes, gated by the CLI."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from tests.factories import tensors, write_tp_bundle
from tests.servers import VALIDATOR as EXE
from tests.servers import validator_serve


def test_serve_push_gate_end_to_end(tmp_path: Path) -> None:
    env = {**os.environ, "VALIDATOR_HOME": str(tmp_path / "server-home"), "VALIDATOR_TOKENS": "tok"}
    with validator_serve(env, tmp_path / "server.log") as url:
        full = tensors()
        bundles = {
            "ref": write_tp_bundle(tmp_path, "ref", full, tp=4),
            "cand": write_tp_bundle(tmp_path, "cand", full, tp=32),
            "bad": write_tp_bundle(tmp_path, "bad", full, tp=4, noise=0.5),
        }
        cenv = {k: v for k, v in os.environ.items() if not k.startswith("VALIDATOR_")}
        cenv["VALIDATOR_HOME"] = str(tmp_path / "client-home")
        pushes = [
            subprocess.Popen([EXE, "--server", url, "--token", "tok", "push", str(b)], env=cenv, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
            for b in bundles.values()
        ]
        for p in pushes:
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, err
        # a wrong token is refused with a clear message and exit 2
        r = subprocess.run([EXE, "--server", url, "--token", "nope", "push", str(bundles["ref"]), "--name", "x"],
                           env=cenv, capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and "401" in r.stderr
        summary = tmp_path / "summary.md"
        junit = tmp_path / "junit.xml"
        r = subprocess.run([EXE, "--server", url, "--token", "tok", "gate", "ref", "cand", "--junit", str(junit)],
                           env={**cenv, "GITHUB_STEP_SUMMARY": str(summary)}, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert "PASS" in r.stdout and "PASS" in summary.read_text() and junit.exists()
        r = subprocess.run([EXE, "--server", url, "--token", "tok", "gate", "ref", "bad"], env=cenv,
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 1 and "FAIL" in r.stdout
        # remote compare prints what local compare prints
        remote = subprocess.run([EXE, "--server", url, "--token", "tok", "compare", "ref", "bad", "--json"], env=cenv,
                                capture_output=True, text=True, timeout=60)
        local = subprocess.run([EXE, "compare", str(bundles["ref"]), str(bundles["bad"]), "--json"], env=cenv,
                               capture_output=True, text=True, timeout=60)
        assert remote.returncode == local.returncode == 1
        rd, ld = json.loads(remote.stdout), json.loads(local.stdout)
        assert [p["rel_l2"] for p in rd["pairs"]] == [p["rel_l2"] for p in ld["pairs"]]
        r = subprocess.run([EXE, "--server", url, "--token", "tok", "compare", "ref", "missing"], env=cenv, capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 2 and "missing" in r.stderr
