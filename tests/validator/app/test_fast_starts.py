"""Commands that do not compute never import torch, and comparing plain files never opens the store.

`validator --help`, `runs` and `show`, and the API's and dashboard's read routes, run in a fresh interpreter
(this one has long imported torch) that records where torch was first imported from, for the failure message.
The store they read is written here, in the parent. A comparison of two .safetensors files (and a noise floor
of two more) runs with a home that does not exist: it must still not exist afterwards, and neither Alembic nor
SQLAlchemy must have been imported.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from tests.fresh_interpreter import run_child, torch_stack
from validator.service import Service
from validator.settings import Settings

CHILD = """
import contextlib, io

face, home, items = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
results = []
if face == "cli":
    from validator.app.cli import main

    for argv in items:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            try:
                rc = main(["--home", home, *argv])
            except SystemExit as exc:  # --help
                rc = exc.code
        results.append([rc, out.getvalue()])
else:
    from pathlib import Path

    from fastapi.testclient import TestClient

    from validator.app.api import create_app
    from validator.settings import Settings

    with TestClient(create_app(Settings(home=Path(home)))) as client:
        results = [[r.status_code, r.text] for r in map(client.get, items)]
report(results=results)
"""


def _child(face: str, home: Path, items: list[Any]) -> dict[str, Any]:
    return run_child(CHILD, face, str(home), json.dumps(items))


def _files(d: Path, seed: int) -> Path:
    g = torch.Generator().manual_seed(seed)
    path = d / f"run{seed}.safetensors"
    save_file({"hidden": torch.randn(16, 64, generator=g).to(torch.bfloat16), "k": torch.randn(8, generator=g)}, str(path))
    return path


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    """A home with runs 'ra' and 'rb' and their comparison; returns (home, comparison id)."""
    d = tmp_path_factory.mktemp("fast")
    svc = Service(Settings(home=d / "home"))
    try:
        svc.ingest(_files(d, 0), name="ra", labels={"model": "m"})
        svc.ingest(_files(d, 1), name="rb")
        rec = svc.cached_comparison("ra", "rb", background=False)
        assert rec["status"] == "done", rec
        return d / "home", int(rec["id"])
    finally:
        svc.close()


def test_cli_commands_that_do_not_compute_do_not_import_torch(stored: tuple[Path, int]) -> None:
    home, _ = stored
    commands = [["--help"], ["runs"], ["runs", "--json", "--label", "model=m"], ["show", "ra"], ["show", "rb", "--json"]]
    out = _child("cli", home, commands)
    assert not out["torch"], torch_stack(out)
    assert [rc for rc, _ in out["results"]] == [0] * len(commands), out["results"]
    help_text, runs, runs_json, show, show_json = (text for _, text in out["results"])
    assert "usage: validator" in help_text
    assert "ra" in runs and "rb" in runs
    assert [r["name"] for r in json.loads(runs_json)["runs"]] == ["ra"]
    assert "hidden" in show and "bfloat16" in show
    assert {t["name"] for t in json.loads(show_json)["tensors"]} == {"hidden", "k"}


def test_read_routes_do_not_import_torch(stored: tuple[Path, int]) -> None:
    home, cid = stored
    urls = [
        "/api/v1/runs",
        "/api/v1/runs/ra",
        "/api/v1/runs/ra/tensors",
        f"/api/v1/comparisons/{cid}",
        "/runs",
        "/runs?format=json",
        "/runs/ra",
        f"/comparisons/{cid}",
        f"/comparisons/{cid}?format=json",
    ]
    out = _child("api", home, urls)
    assert not out["torch"], torch_stack(out)
    assert [status for status, _ in out["results"]] == [200] * len(urls), list(zip(urls, out["results"]))
    assert json.loads(out["results"][3][1])["status"] == "done"


def test_comparing_plain_files_never_opens_the_store(tmp_path: Path) -> None:
    a, b, fa, fb = (_files(tmp_path, seed) for seed in (0, 1, 2, 3))
    home = tmp_path / "no-home"
    out = _child("cli", home, [["compare", str(a), str(b), "--json"], ["compare", str(a), str(b), "--floor", str(fa), str(fb)]])
    (rc, text), (rc_floor, _) = out["results"]
    # a verdict either way (3: inconclusive, which a few random elements against a random floor may be)
    assert rc in (0, 1, 3) and rc_floor in (0, 1, 3), out["results"]
    assert {p["label"] for p in json.loads(text)["pairs"]} == {"hidden", "k"}
    assert not out["alembic"], "the store was opened (Alembic imported)"
    assert not out["sqlalchemy"], "the store's stack was imported (SQLAlchemy)"
    assert not home.exists(), sorted(p.name for p in home.rglob("*"))
