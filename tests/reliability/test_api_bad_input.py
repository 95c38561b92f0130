"""Bad input over HTTP: schema-driven fuzzing (schemathesis, in-process), oversized and chunked bodies, and
broken bundles uploaded file by file. Every answer is a 4xx with a message, never a 500, and nothing
half-written becomes visible."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode

from probes.core.bundle import MANIFEST
from tests.factories import tensors, write_tp_bundle
from tests.reliability.helpers import AUTH, TOKEN, Server, bundle_files
from validator.app.api import create_app
from validator.service import Service
from validator.settings import Settings

FUZZ = settings(deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))


@pytest.fixture
def seeded(tmp_path: Path, db_url: str | None) -> Iterator[Service]:
    """A store with two complete runs ("ref", "cand"), one with acceptance records, and a pending one."""
    svc = Service(Settings(home=tmp_path / "home", database_url=db_url, tokens=(TOKEN,), max_upload_bytes=1 << 16))
    full = tensors()
    svc.ingest(write_tp_bundle(tmp_path, "ref", full, tp=2))
    cand = write_tp_bundle(tmp_path, "cand", full, tp=4, noise=0.01)
    (cand / "parts" / "tp0" / "acceptance.jsonl").write_text(
        '{"request_id": "q", "step": 0, "proposed": [1, 2], "accepted": 1}\n')
    svc.ingest(cand)
    from validator.service import uploads

    uploads.create_pending(svc, name="pend")
    yield svc
    svc.close()


def _case_strategy(schema: Any) -> st.SearchStrategy[Any]:
    """Every operation, positive and negative, with path parameters sometimes naming real objects."""
    strategies = []
    for result in schema.get_all_operations():
        op = result.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            strategies.append(op.as_strategy(generation_mode=mode))
            if "{ref}" in op.path:
                strategies.append(
                    st.sampled_from(["ref", "cand", "pend", "1", "../ref"]).flatmap(
                        lambda ref, op=op, mode=mode: op.as_strategy(generation_mode=mode, path_parameters={"ref": ref})
                    )
                )
    known = st.sampled_from(["ref", "cand", "1", "2", "pend"])
    _floats = st.floats(allow_nan=False, allow_infinity=False)  # JSON bodies cannot carry NaN or Inf
    policies = st.one_of(
        st.none(),
        st.dictionaries(st.sampled_from(["missing", "rule", "acceptance", "bogus"]),
                        st.one_of(st.integers(), st.text(max_size=5), st.lists(st.dictionaries(
                            st.sampled_from(["match", "rel_l2_max", "nonfinite", "floor_multiple", "cosine_min"]),
                            st.one_of(_floats, st.integers(-2, 2), st.text(max_size=4)), max_size=3), max_size=2),
                            st.dictionaries(st.text(max_size=8), st.one_of(_floats, st.integers(), st.text(max_size=3)), max_size=3)),
                        max_size=3),
    )
    targeted = []  # comparisons and gates of the seeded runs: a quarter of the cases, however many routes exist
    for op_path, keys in (("/api/v1/comparisons", ("a", "b")), ("/api/v1/gates", ("baseline", "candidate"))):
        op = schema[op_path]["POST"]
        targeted.append(
            st.tuples(known, known, policies, st.one_of(st.none(), st.lists(known, min_size=2, max_size=2))).flatmap(
                lambda t, op=op, keys=keys: op.as_strategy(
                    body={keys[0]: t[0], keys[1]: t[1], "policy": t[2], "floor": t[3]}
                )
            )
        )
    general, aimed = st.one_of(strategies), st.one_of(targeted)
    return st.integers(0, 3).flatmap(lambda i: aimed if i == 0 else general)  # (one_of would flatten a weighting)


def test_schema_fuzz_never_500(seeded: Service) -> None:
    app = create_app(seeded.settings, service=seeded)
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    seen: Counter[tuple[str, str, int]] = Counter()

    @given(case=_case_strategy(schema))
    @settings(FUZZ, max_examples=250)
    def run(case: Any) -> None:
        r = case.call(headers=AUTH)
        seen[(case.method, case.operation.path, r.status_code)] += 1
        assert r.status_code < 500, (case.method, case.formatted_path, case.query, case.body, r.status_code, r.text[:500])
        if r.status_code >= 400:
            detail = r.json().get("detail")
            assert detail, r.text  # a message, not an empty error

    run()
    assert any(s == 200 for (_, p, s) in seen if p.endswith("gates")), seen  # the fuzz reached real gates
    # the seeded runs are intact, and any run the fuzz managed to finalize is whole
    runs = seeded.list_runs()
    assert {"ref", "cand"} <= {r.name for r in runs}
    for r in runs:
        assert seeded.show_run(r.name)["n_tensors"] == r.n_tensors


# -- oversized bodies --------------------------------------------------------------------------------------


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    svc = Service(Settings(home=tmp_path / "home", tokens=(TOKEN,), max_json_bytes=4096, max_upload_bytes=1 << 16))
    app = create_app(svc.settings, service=svc)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t", headers=AUTH) as c:
        yield c
    svc.close()


def _big_body(n: int) -> bytes:
    return json.dumps({"name": "r", "labels": {"pad": "x" * n}}).encode()


async def _chunks(data: bytes, size: int = 1000) -> AsyncIterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]


@pytest.mark.anyio
@pytest.mark.parametrize(
    "headers, chunked",
    [({"content-type": "application/json"}, False), ({"content-type": "application/json"}, True), ({}, True),
     ({"content-type": "Application/JSON; charset=utf-8"}, True), ({"content-type": "text/plain"}, True),
     ({"content-type": "application/merge-patch+json"}, False)],
    ids=["declared", "chunked", "chunked-no-type", "chunked-odd-case", "chunked-text", "declared-json-suffix"],
)
async def test_huge_json_bodies_are_capped(client: httpx.AsyncClient, headers: dict[str, str], chunked: bool) -> None:
    body = _big_body(50_000)
    for path in ("/api/v1/runs", "/api/v1/comparisons", "/api/v1/gates"):
        r = await client.post(path, content=_chunks(body) if chunked else body, headers=headers)
        assert r.status_code == 413, (path, r.status_code, r.text[:200])
        assert "4096" in r.json()["detail"]
    assert (await client.get("/api/v1/runs/r/files/p0/part.json")).status_code == 404  # no run was created


@pytest.mark.anyio
async def test_bodies_under_the_cap_and_malformed_json(client: httpx.AsyncClient) -> None:
    r = await client.post("/api/v1/runs", content=_chunks(_big_body(100), size=7), headers={"content-type": "application/json"})
    assert r.status_code == 201, r.text
    r = await client.post("/api/v1/runs", content=b"9" * 5000, headers={"content-length": "5000x"})
    assert r.status_code == 413
    for bad in (b"[" * 4000, b'{"name": "x", "labels": ' + b"[" * 2000, b"\xff\xfe", b'{"name": 1e999999}', b"{}" * 10):
        r = await client.post("/api/v1/runs", content=bad, headers={"content-type": "application/json"})
        assert 400 <= r.status_code < 500, (bad[:20], r.status_code, r.text[:200])
    # uploads are not JSON: they stream past the JSON cap, up to the upload cap
    data = b"x" * 20_000
    r = await client.put("/api/v1/runs/r/files/p0/acceptance.jsonl", content=_chunks(data))
    assert r.status_code == 200 and r.json()["received"] == len(data), r.text


def test_chunked_body_cap_on_a_real_server(tmp_path: Path) -> None:
    """The same cap through uvicorn's HTTP parser, with a body that never declares its length."""
    server = Server(tmp_path / "home")
    try:
        with server.client() as c:
            r = c.post("/runs", content=iter([b'{"name": "r", "labels": {"pad": "'] + [b"x" * 65536] * 40 + [b'"}}']),
                       headers={"content-type": "application/json"})
            assert r.status_code == 413, r.text
            r = c.post("/runs", json={"name": "ok"})  # the server is fine afterwards
            assert r.status_code == 201, r.text
    finally:
        server.stop()


# -- broken bundles uploaded over the API --------------------------------------------------------------------


async def _upload_all(c: httpx.AsyncClient, name: str, bundle: Path) -> None:
    for part, f in bundle_files(bundle):
        r = await c.put(f"/runs/{name}/files/{part}/{f.name}", content=f.read_bytes())
        assert r.status_code == 200, r.text


def _api(svc: Service) -> httpx.AsyncClient:
    app = create_app(svc.settings, service=svc)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t/api/v1", headers=AUTH)


@pytest.mark.parametrize(
    "breakage, needle",
    [
        ("truncate-tensors", "truncated"),
        ("record-traversal-name", "not allowed"),
        ("record-traversal-file", "bad file name"),
        ("record-dtype-mismatch", "in the file but"),
        ("bad-acceptance", "acceptance.jsonl line 1"),
        ("bad-manifest", MANIFEST),
        ("missing-part-json", "has no part.json"),
        ("long-label", "label"),
        ("nul-in-coords", "coord"),
    ],
)
@pytest.mark.anyio
async def test_broken_uploads_refused_on_finalize(tmp_path: Path, db_url: str | None, breakage: str, needle: str) -> None:
    bundle = write_tp_bundle(tmp_path, "b", tensors(), tp=2)
    part = bundle / "parts" / "tp0"
    pj = part / "part.json"
    doc = json.loads(pj.read_text())
    if breakage == "truncate-tensors":
        f = part / "tensors-00000.safetensors"
        f.write_bytes(f.read_bytes()[:-5])
    elif breakage == "record-traversal-name":
        doc["tensors"][0]["name"] = "../../x"
    elif breakage == "record-traversal-file":
        doc["tensors"][0]["file"] = "../tp1/tensors-00000.safetensors"
    elif breakage == "record-dtype-mismatch":
        doc["tensors"][0]["dtype"] = "float32"
    elif breakage == "bad-acceptance":
        (part / "acceptance.jsonl").write_text('{"request_id": 5}\n')
    elif breakage == "bad-manifest":
        (bundle / MANIFEST).write_text('{"format": "nope"}')
    elif breakage == "missing-part-json":
        pj.unlink()
    elif breakage == "long-label":
        m = json.loads((bundle / MANIFEST).read_text())
        m["run"]["labels"]["k" * 300] = "v" * 5000
        (bundle / MANIFEST).write_text(json.dumps(m))
    elif breakage == "nul-in-coords":
        doc["tensors"][0]["coords"]["extra"] = {"where": "a\0b" + "z" * 2000}
    if pj.exists():
        pj.write_text(json.dumps(doc))
    svc = Service(Settings(home=tmp_path / "home", database_url=db_url, tokens=(TOKEN,)))
    try:
        async with _api(svc) as c:
            assert (await c.post("/runs", json={"name": "b"})).status_code == 201
            await _upload_all(c, "b", bundle)
            r = await c.post("/runs/b/finalize")
            assert 400 <= r.status_code < 500, (r.status_code, r.text)
            assert needle in r.json()["detail"], r.json()
            assert (await c.get("/runs")).json()["data"] == []
            assert (await c.get("/runs/b")).status_code == 404
        staging = svc.settings.staging_dir
        # nothing left but the still-pending run's activity marker (validator.service.expiry)
        assert [p.name for p in staging.iterdir() if p.suffix != ".active"] == [] if staging.exists() else True
    finally:
        svc.close()


@pytest.mark.parametrize(
    "labels",
    [{"k" * 101: "v"}, {"k": "v" * 501}, {"k\0": "v"}, {"k": "a\0b"}, {"": "v"}],
    ids=["long-key", "long-value", "nul-key", "nul-value", "empty-key"],
)
@pytest.mark.anyio
async def test_bad_labels_are_4xx(tmp_path: Path, db_url: str | None, labels: dict[str, str]) -> None:
    svc = Service(Settings(home=tmp_path / "home", database_url=db_url, tokens=(TOKEN,)))
    try:
        async with _api(svc) as c:
            r = await c.post("/runs", json={"name": "r", "labels": labels})
            assert 400 <= r.status_code < 500, (r.status_code, r.text)
            assert (await c.get("/runs/r/files/p0/part.json")).status_code == 404
    finally:
        svc.close()


@pytest.mark.anyio
async def test_odd_references_are_404_not_500(tmp_path: Path, db_url: str | None) -> None:
    """NUL (PostgreSQL refuses it in a query), ids past the INTEGER range, non-ASCII digits."""
    svc = Service(Settings(home=tmp_path / "home", database_url=db_url, tokens=(TOKEN,)))
    try:
        async with _api(svc) as c:
            for ref in ("a%00b", "2147483648", "99999999999999999999999", "%C2%B2", "-1", "%2e%2e"):
                for path in (f"/runs/{ref}", f"/runs/{ref}/tensors", f"/runs/{ref}/files/p0/part.json"):
                    r = await c.get(path)
                    assert r.status_code in (400, 404, 422), (path, r.status_code, r.text)
                r = await c.post(f"/runs/{ref}/finalize")
                assert r.status_code in (400, 404, 422), (ref, r.status_code, r.text)
            for cid in ("2147483648", "9223372036854775808", "-5"):
                r = await c.get(f"/comparisons/{cid}")
                assert r.status_code in (404, 422), (cid, r.status_code, r.text)
            r = await c.get("/runs", params={"label": "k=a\0b"})
            assert r.status_code == 200 and r.json()["data"] == []
            for body in ({"a": "a\0", "b": "b"}, {"a": "1", "b": "2147483648"}):
                r = await c.post("/comparisons", json=body)
                assert r.status_code == 404, r.text
            r = await c.post("/runs", json={"name": "a\0b"})
            assert r.status_code == 400, r.text
    finally:
        svc.close()
