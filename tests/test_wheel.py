"""A built wheel runs like the checkout: it carries the migrations and the dashboard (setup.py maps the top-level
dashboards/ and migrations/ into the package) and finds them through importlib.resources.

The wheel is built offline from a copy of the sources and installed, not editable, into a fresh virtualenv whose
only way to its dependencies (torch, SQLAlchemy, FastAPI...) is a .pth line naming this environment's
site-packages: nothing is downloaded, and the checkout is on no path (a .pth file in a directory named that way
is not run, so this environment's editable-install hook stays off). Then, from a directory outside the checkout,
`validator demo` stores and compares runs and `validator serve` answers a dashboard page and a static file.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.wheel_venv import install_wheel

ROOT = Path(__file__).resolve().parent.parent


def _run(*cmd: str | Path, cwd: Path, env: dict[str, str] | None = None, timeout: float = 120) -> str:
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, (
        f"{' '.join(map(str, cmd))}: exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
    return proc.stdout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str, server: subprocess.Popen[bytes], log: Path, timeout: float = 30) -> tuple[int, str, bytes]:
    """GET ``url``, waiting for the server to listen (it has ``timeout`` seconds, and must not exit)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                return r.status, r.headers.get("content-type", ""), r.read()
        except (ConnectionError, urllib.error.URLError):
            if server.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"validator serve: exit {server.poll()}\n{log.read_text()[-3000:]}") from None
            time.sleep(0.2)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtualenv with the wheel installed in it; returns its bin/ folder."""
    return install_wheel(tmp_path_factory.mktemp("wheel"))


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VALIDATOR_") and k != "PYTHONPATH"}
    return {**env, "VALIDATOR_HOME": str(home)}


def test_wheel_runs_demo_and_dashboard_outside_the_checkout(installed: Path, tmp_path: Path) -> None:
    env = _env(tmp_path / "home")
    where = json.loads(
        _run(
            installed / "python",
            "-c",
            "import json, validator, validator._data as d\n"
            "with d.migrations_dir() as m: print(json.dumps([validator.__file__, str(d.dashboards_dir()), str(m)]))",
            cwd=tmp_path,
            env=env,
        )
    )
    venv = str(installed.parent)
    assert all(p.startswith(venv) for p in where), where  # the wheel's copy, not the checkout's

    demo = json.loads(
        _run(installed / "validator", "demo", "--json", "--out", tmp_path / "bundles", cwd=tmp_path, env=env)
    )
    names = list(demo["runs"].values())
    assert len(names) == 4, demo["runs"]

    port = _free_port()
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        server = subprocess.Popen(
            [str(installed / "validator"), "serve", "--port", str(port)], cwd=tmp_path, env=env, stdout=out, stderr=out
        )
    try:
        status, ctype, body = _get(f"http://127.0.0.1:{port}/runs", server, log)
        assert status == 200 and ctype.startswith("text/html"), (status, ctype)
        page = body.decode()
        assert "<html" in page.lower()
        assert all(n in page for n in names), names
        status, ctype, css = _get(f"http://127.0.0.1:{port}/static/dashboard.css", server, log)
        assert status == 200 and css == (ROOT / "dashboards" / "static" / "dashboard.css").read_bytes()
        status, _, listing = _get(f"http://127.0.0.1:{port}/api/v1/runs", server, log)
        assert status == 200 and {r["name"] for r in json.loads(listing)["data"]} == set(names)
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def test_wheel_first_small_compare_compiles_nothing(installed: Path, tmp_path: Path) -> None:
    """The first comparison of two small files after the install waits for no compiler: with numba's cache
    pointed at an empty folder, nothing is compiled into it (the pass and the bootstrap run in NumPy)."""
    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(0)
    a = torch.randn(64, 64, generator=g).to(torch.bfloat16)
    save_file({"x": a}, str(tmp_path / "a.safetensors"))
    save_file({"x": (a.float() * 1.01).to(torch.bfloat16)}, str(tmp_path / "b.safetensors"))
    cache = tmp_path / "numba-cache"
    cache.mkdir()
    env = {**_env(tmp_path / "home"), "NUMBA_CACHE_DIR": str(cache)}
    out = json.loads(_run(installed / "validator", "compare", "a.safetensors", "b.safetensors", "--json", cwd=tmp_path, env=env))
    assert out["pairs"][0]["metrics"]["rel_l2"] > 0, out["pairs"][0]
    assert not any(cache.rglob("*")), sorted(cache.rglob("*"))[:5]


def test_wheel_first_large_compare_loads_the_compiled_kernels(installed: Path, tmp_path: Path) -> None:
    """The wheel carries numba's cache of the CPU engine's kernels (setup.py compiles them into it), and the
    first comparison of a pair too large for the NumPy pass loads them: nothing is compiled into the installed
    package's cache (numba would add an entry to an index), and nothing into an empty folder."""
    import torch
    from safetensors.torch import save_file

    (package,) = installed.parent.glob("lib/python*/site-packages/validator")
    indexes = {p: p.read_bytes() for p in package.rglob("*.nbi")}
    assert {"cpu._pass_parallel", "cpu._pass", "resample_compiled.ratios_many"} <= {
        p.name.split("-")[0] for p in indexes
    }, sorted(p.name for p in indexes)
    g = torch.Generator().manual_seed(0)
    a = torch.randn(1024, 1024, generator=g).to(torch.bfloat16)
    save_file({"x": a}, str(tmp_path / "a.safetensors"))
    save_file({"x": (a.float() * (1 + 1e-2 * torch.randn(1024, 1024, generator=g))).to(torch.bfloat16)}, str(tmp_path / "b.safetensors"))
    env = {k: v for k, v in _env(tmp_path / "home").items() if not k.startswith("NUMBA_")}
    out = json.loads(_run(installed / "validator", "compare", "a.safetensors", "b.safetensors", "--json", cwd=tmp_path, env=env))
    assert 5e-3 < out["pairs"][0]["metrics"]["rel_l2"] < 2e-2, out["pairs"][0]
    assert {p: p.read_bytes() for p in package.rglob("*.nbi")} == indexes
