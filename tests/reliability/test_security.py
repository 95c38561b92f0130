"""Security checks: tokens on every mutating route, escaping on every dashboard page, no unpickling in the
package, and names that never become paths, whatever the entry point."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from safetensors.torch import save_file
from starlette.routing import Mount

from probes import BundleWriter
from probes.core.bundle import MANIFEST
from tests.factories import tensors, write_tp_bundle
from tests.reliability.helpers import AUTH, REPO, TOKEN, bundle_files, check_blob_store, tree
from validator.app.api import create_app
from validator.app.cli import main
from validator.service import Service
from validator.settings import Settings

pytestmark = pytest.mark.anyio
MUTATING = {"POST", "PUT", "PATCH", "DELETE"}


def _api_client(svc: Service, **kw: Any) -> httpx.AsyncClient:
    app = create_app(svc.settings, service=svc)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t", **kw)


@pytest.fixture
def svc(tmp_path: Path) -> Any:
    s = Service(Settings(home=tmp_path / "home", tokens=(TOKEN,)))
    yield s
    s.close()


# -- tokens ------------------------------------------------------------------------------------------------------


def _all_routes(app: Any) -> list[tuple[str, str]]:
    """Every (method, path) the app serves, from its routing table (not only the OpenAPI schema: the
    dashboard's routes are left out of the schema)."""

    def walk(routes: Any, prefix: str) -> Any:
        for r in routes:
            if hasattr(r, "original_router"):  # FastAPI >= 0.16x keeps included routers as one entry
                yield from walk(r.original_router.routes, prefix + getattr(r.include_context, "prefix", ""))
            elif getattr(r, "methods", None) and not isinstance(r, Mount):
                yield from ((m, prefix + r.path) for m in sorted(r.methods))
            else:
                raise AssertionError(f"route {r!r} of an unknown kind: teach this walk about it")

    out = list(walk(app.routes, ""))
    assert ("GET", "/compare") in out and ("GET", "/api/v1/runs") in out, out  # dashboard and API both walked
    return out


def _fill(path: str) -> str:
    return re.sub(r"\{(\w+)(:\w+)?\}", lambda m: {"part": "p0", "filename": "part.json", "id": "1", "index": "0"}.get(m.group(1), "r"), path)


async def test_every_mutating_route_needs_the_token(svc: Service) -> None:
    app = create_app(svc.settings, service=svc)
    routes = _all_routes(app)
    mutating = [(m, p) for m, p in routes if m in MUTATING]
    assert {p for _, p in mutating} >= {"/api/v1/runs", "/api/v1/runs/{ref}/files/{part}/{filename}",
                                        "/api/v1/runs/{ref}/finalize", "/api/v1/comparisons", "/api/v1/gates"}
    async with _api_client(svc) as c:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"},
                        {"Authorization": "Bearer"}, {"Authorization": f"Bearer {TOKEN}x"}, {"Authorization": f"bearer  {TOKEN[:-1]}"}):
            for method, path in mutating:
                for body in ({"json": {}}, {"content": b"x" * 10}):
                    r = await c.request(method, _fill(path), headers=headers, **body)
                    assert r.status_code == 401, (method, path, headers, r.status_code, r.text[:200])
        # a refused write changed nothing
        assert svc.list_runs() == [] and not (svc.settings.staging_dir.exists() and any(svc.settings.staging_dir.iterdir()))
        # the right token passes the check (whatever the route then says about the body)
        for method, path in mutating:
            r = await c.request(method, _fill(path), headers=AUTH, json={})
            assert r.status_code != 401, (method, path)


async def test_reads_are_closed_when_protected(tmp_path: Path) -> None:
    s = Service(Settings(home=tmp_path / "home", tokens=(TOKEN,), protect_reads=True))
    try:
        async with _api_client(s) as c:
            for method, path in _all_routes(create_app(s.settings, service=s)):
                if method != "GET" or path in ("/api/v1/health", "/openapi.json", "/docs", "/docs/oauth2-redirect",
                                               "/redoc", "/static/{name}"):
                    continue
                r = await c.get(_fill(path))
                assert r.status_code == 401, (path, r.status_code)
    finally:
        s.close()


# -- dashboard escaping -----------------------------------------------------------------------------------------

XSS = "<script>alert(1)</script>"
IMG = "<img src=x onerror=alert(2)>"
XSS_NAME = "<script>alert(1)"  # run names cannot hold '/', so no closing tag


async def test_dashboard_escapes_run_data(tmp_path: Path, svc: Service) -> None:
    """A run label, run name, manifest field and acceptance request id carrying markup are shown as text on
    every page (and inside JSON blocks cannot close the script element)."""
    full = tensors()
    ref = write_tp_bundle(tmp_path, "ref", full, tp=2)
    cand = write_tp_bundle(tmp_path, "cand", full, tp=2, noise=0.3)
    for b in (ref, cand):
        (b / "parts" / "tp0" / "acceptance.jsonl").write_text(json.dumps(
            {"request_id": XSS, "step": 0, "proposed": [1, 2], "accepted": 1, "prompt_hash": IMG}) + "\n")
        m = json.loads((b / MANIFEST).read_text())
        m["run"]["notes"] = XSS
        (b / MANIFEST).write_text(json.dumps(m))
    svc.ingest(ref, name=f"ref{XSS_NAME}", labels={"model": XSS, "k": IMG, f"<b>{IMG}</b>": "v"})
    svc.ingest(cand, name=f"cand{IMG}", labels={"model": XSS})
    async with _api_client(svc, follow_redirects=True) as c:
        pages = ["/runs", f"/runs?model={XSS}", "/runs/1", "/runs/2", f"/runs/{XSS}", f"/runs/ref{XSS_NAME}",
                 f"/compare?a=ref{XSS_NAME}&b=cand{IMG}", "/comparisons/1", "/comparisons/1/pairs/0", "/comparisons/1/pairs/1",
                 "/comparisons/1/acceptance", f"/compare?a={XSS}&b=x", f"/runs?label={IMG}"]
        seen_html = 0
        for page in pages:
            r = await c.get(page)
            assert r.status_code < 500, (page, r.status_code, r.text[:300])
            if not r.headers.get("content-type", "").startswith("text/html"):
                continue
            seen_html += 1
            html = r.text
            assert "<script>alert" not in html and "<img src=x" not in html and "<b><img" not in html, page
            # every <script> element is one of ours: no injected one, and JSON blocks never contain "</script"
            for body in re.findall(r"<script[^>]*>(.*?)</script>", html, flags=re.S):
                assert "<" not in body or "</" not in body, (page, body[:200])
            assert "default-src 'none'" in r.headers.get("content-security-policy", ""), page
        assert seen_html >= 6, seen_html
        r = await c.get("/runs/1")
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in r.text  # shown, as text


# -- no unpickling ----------------------------------------------------------------------------------------------

# (dotted call target, keyword that makes it safe when it is the constant True) -- None: never safe
_FORBIDDEN: dict[str, str | None] = {
    "pickle.load": None, "pickle.loads": None, "pickle.Unpickler": None, "_pickle.load": None, "_pickle.loads": None,
    "cPickle.load": None, "cPickle.loads": None, "dill.load": None, "dill.loads": None, "cloudpickle.load": None,
    "cloudpickle.loads": None, "joblib.load": None, "shelve.open": None, "marshal.load": None, "marshal.loads": None,
    "pandas.read_pickle": None, "yaml.load": None, "yaml.load_all": None, "yaml.unsafe_load": None, "yaml.full_load": None,
    "torch.jit.load": None, "torch.package.PackageImporter": None, "torch.load": "weights_only",
}


def _violations(source: str, filename: str) -> list[str]:
    tree_ = ast.parse(source, filename)
    alias: dict[str, str] = {}
    for node in ast.walk(tree_):
        if isinstance(node, ast.Import):
            for a in node.names:
                alias[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                alias[a.asname or a.name] = f"{node.module}.{a.name}"
    alias.setdefault("np", "numpy")
    alias.setdefault("pd", "pandas")
    out = []
    for node in ast.walk(tree_):
        if not isinstance(node, ast.Call):
            continue
        parts: list[str] = []
        f = node.func
        while isinstance(f, ast.Attribute):
            parts.append(f.attr)
            f = f.value
        if not isinstance(f, ast.Name):
            continue
        parts.append(alias.get(f.id, f.id))
        name = ".".join(reversed(parts))
        kw = {k.arg: k.value for k in node.keywords if k.arg}
        where = f"{filename}:{node.lineno}: {name}"
        if name in _FORBIDDEN:
            safe_kw = _FORBIDDEN[name]
            v = kw.get(safe_kw) if safe_kw else None
            if not (isinstance(v, ast.Constant) and v.value is True):
                out.append(where)
        elif name in ("numpy.load", "numpy.lib.format.read_array"):
            v = kw.get("allow_pickle")
            if v is not None and not (isinstance(v, ast.Constant) and v.value is False):
                out.append(where + " with allow_pickle")
        elif name.endswith((".read_pickle", ".from_pickle")) or name in ("eval", "exec"):
            out.append(where)
    return out


def test_the_scanner_catches_each_pattern() -> None:
    bad = """
import pickle, marshal, yaml, shelve
import numpy as np
import torch as T
from torch import load as tl
from pickle import loads as pl
import pandas
pickle.load(f); pickle.loads(b); marshal.loads(b); yaml.load(s); shelve.open(p)
np.load(p, allow_pickle=True); np.load(p, allow_pickle=flag)
T.load(p); T.load(p, weights_only=False); tl(p); pl(b); pandas.read_pickle(p); x.read_pickle(p)
"""
    good = """
import numpy as np, torch, yaml, json
np.load(p); np.load(p, allow_pickle=False); torch.load(p, weights_only=True); yaml.safe_load(s); json.loads(s)
"""
    assert len(_violations(bad, "bad.py")) == 13, _violations(bad, "bad.py")
    assert _violations(good, "good.py") == []


def test_no_unpickling_in_the_package() -> None:
    """Nothing in validator/ or probes/ unpickles; the only torch.load allowed is weights_only=True."""
    found = []
    files = sorted((REPO / "validator").rglob("*.py")) + sorted((REPO / "probes").rglob("*.py"))
    assert len(files) > 20
    for p in files:
        found += _violations(p.read_text(), str(p.relative_to(REPO)))
    assert found == [], found


# -- names never become paths -----------------------------------------------------------------------------------

_EVIL = ["../../../../evil", "..", "/etc/passwd", "a/../../b", "..\\..\\evil", "a\0b", "%2e%2e%2fevil", "..%2Fevil",
         "a%5C..%5Cevil", "C:\\evil", "~root/evil"]
_HOME_FILE = re.compile(
    r"validator\.db(-wal|-shm|-journal)?|blobs|blobs/tmp|blobs/[0-9a-f]{2}|blobs/[0-9a-f]{2}/[0-9a-f]{62}|staging"
    r"|staging/([0-9]+\.)?[0-9a-f]{64}\.partial|staging/[0-9]+\.[0-9a-f]{32}\.active|staging/expired\.[0-9a-f]{64}|cache|cache/tmp"
)


def _home_is_clean(home: Path) -> None:
    for rel in tree(home):
        assert _HOME_FILE.fullmatch(rel), f"unexpected path in the store: {rel}"
    if (home / "blobs").exists():
        check_blob_store(home / "blobs")


def _no_escape(root: Path, before: set[str], home: Path) -> None:
    store = str(home.relative_to(root))
    new = {p for p in tree(root) - before if p != store and not p.startswith(store + "/")}
    assert new == set(), new
    for p in ("/evil", "/tmp/evil", "/root/evil"):
        assert not Path(p).exists(), p


def test_traversal_names_through_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    deep = tmp_path / "a" / "b" / "c"
    deep.mkdir(parents=True)
    home = deep / "home"
    before = tree(tmp_path)
    # run names, labels and label values with separators: stored as text
    b = write_tp_bundle(deep, "ok", tensors(), tp=1)
    before = tree(tmp_path)
    for i, evil in enumerate(_EVIL):
        if "\0" in evil:
            continue  # not passable on a command line
        code = main(["--home", str(home), "ingest", str(b), "--name", f"{evil}{i}", "--label", f"k={evil}", "--label", f"{evil}=v"])
        out, err = capsys.readouterr()
        assert code in (0, 2), err
        if code == 2:
            assert err.count("\n") == 1
    # bundle records naming traversal files and keys, and plain safetensors keys
    for field in ("file", "key", "name"):
        for evil in ("../../../../evil.safetensors", "../ok/parts/tp0/tensors-00000.safetensors", "/etc/passwd"):
            bad = deep / f"bad-{field}"
            if bad.exists():
                import shutil

                shutil.rmtree(bad)
            with BundleWriter(bad, run_name="bad", part="p0") as w:
                w.add("t", torch.zeros(2), step=0)
            pj = bad / "parts" / "p0" / "part.json"
            doc = json.loads(pj.read_text())
            doc["tensors"][0][field] = evil
            pj.write_text(json.dumps(doc))
            before_bad = tree(tmp_path)
            assert main(["--home", str(home), "ingest", str(bad)]) == 2
            assert capsys.readouterr()[1].count("\n") == 1
            assert tree(tmp_path) == before_bad
    plain = deep / "plain"
    plain.mkdir()
    for i, evil in enumerate(_EVIL):
        save_file({evil: torch.zeros(1)}, str(plain / f"f{i}.safetensors"))
        assert main(["--home", str(home), "ingest", str(plain / f"f{i}.safetensors")]) == 2
        capsys.readouterr()
    made = {str(p.relative_to(tmp_path)) for p in [plain, *plain.iterdir(), *deep.glob("bad-*"), *deep.glob("bad-*/**/*")]}
    _no_escape(tmp_path, before | made, home)
    _home_is_clean(home)


async def test_traversal_names_through_the_api(tmp_path: Path, svc: Service) -> None:
    deep = tmp_path / "a" / "b"
    deep.mkdir(parents=True)
    bundle = write_tp_bundle(deep, "up", tensors(), tp=1)
    before = tree(tmp_path)
    home = svc.settings.home
    async with _api_client(svc, headers=AUTH) as c:
        # run names and labels with separators are text, never paths
        for i, evil in enumerate(_EVIL):
            r = await c.post("/api/v1/runs", json={"name": f"{evil}-{i}", "labels": {"k": evil, "x" + evil[:50]: "v"}})
            assert r.status_code in (201, 400, 422), (evil, r.status_code, r.text)
        # part and file names with separators, raw and encoded, on the pending run "up"
        assert (await c.post("/api/v1/runs", json={"name": "up"})).status_code == 201
        for evil in [e.replace("\0", "%00") for e in _EVIL] + ["%2e%2e", "%2F", "..%00", "part.json%00.safetensors",
                                                           "tensors-00000.safetensors/..", "."]:
            for part, fname in ((evil, "part.json"), ("p0", evil), (evil, evil), ("_root", evil)):
                url = f"/api/v1/runs/up/files/{part}/{fname}"
                r = await c.put(url, content=b'{"x": 1}')
                assert r.status_code in (400, 404, 405, 422), (url, r.status_code, r.text)
                r = await c.get(url)  # (a client normalizes raw ".." segments: this may land on /runs)
                assert r.status_code < 500 and "received" not in r.text, (url, r.status_code, r.text)
        # a bundle whose records point outside their part: refused at finalize, nothing assembled outside
        files = bundle_files(bundle)
        for part, f in files:
            data = f.read_bytes()
            if f.name == "part.json":
                doc = json.loads(data)
                doc["tensors"][0]["file"] = "../../../../../../tmp/evil.safetensors"
                data = json.dumps(doc).encode()
            assert (await c.put(f"/api/v1/runs/up/files/{part}/{f.name}", content=data)).status_code == 200
        r = await c.post("/api/v1/runs/up/finalize")
        assert r.status_code == 400 and "bad file name" in r.json()["detail"], r.text
        # runs named by paths are not opened over the API or the dashboard
        for a in (str(bundle), str(bundle / MANIFEST), "/etc/passwd"):
            r = await c.post("/api/v1/comparisons", json={"a": a, "b": a})
            assert r.status_code == 404, r.text
            r = await c.get("/compare", params={"a": a, "b": a})
            assert r.status_code in (400, 404), r.status_code
    _no_escape(tmp_path, before, home)
    _home_is_clean(home)
