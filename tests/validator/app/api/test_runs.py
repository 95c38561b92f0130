from __future__ import annotations

import hashlib
from pathlib import Path

import httpx
import pytest

from probes.core.bundle import MANIFEST
from tests.factories import tensors, write_tp_bundle
from tests.validator.app.api.helpers import push

pytestmark = pytest.mark.anyio


async def test_push_list_get_finalize(client: httpx.AsyncClient, tmp_path: Path) -> None:
    bundle = write_tp_bundle(tmp_path, "p-tp4", tensors(), tp=4)
    run = await push(client, bundle, "p-tp4")
    assert run["status"] == "complete" and run["n_tensors"] == 8
    assert run["labels"] == {"tp": "4", "via": "api"}
    r = await client.get("/api/v1/runs", params={"label": "tp=4"})
    assert [x["name"] for x in r.json()["data"]] == ["p-tp4"]
    r = await client.get("/api/v1/runs/p-tp4/tensors")
    assert {t["name"] for t in r.json()["data"]} == {"ctx", "k"}
    r = await client.post("/api/v1/runs/p-tp4/finalize")
    assert r.status_code == 409


async def test_pending_runs_are_invisible(client: httpx.AsyncClient) -> None:
    await client.post("/api/v1/runs", json={"name": "half"})
    assert (await client.get("/api/v1/runs")).json()["data"] == []
    assert (await client.get("/api/v1/runs/half")).status_code == 404
    r = await client.post("/api/v1/runs/half/finalize")
    assert r.status_code == 400 and "manifest.json was not uploaded" in r.json()["detail"]


async def test_upload_is_idempotent_and_resumable(client: httpx.AsyncClient, tmp_path: Path) -> None:
    await client.post("/api/v1/runs", json={"name": "r"})
    data = b"x" * 1000
    url = "/api/v1/runs/r/files/p0/acceptance.jsonl"
    r = await client.put(url, content=data[:300], params={"final": False})
    assert r.json() == {"complete": False, "received": 300, "sha256": None, "created": False}
    assert (await client.get(url)).json()["received"] == 300
    r = await client.put(url, content=data[:300], params={"offset": 0})
    assert r.status_code == 409 and "offset 0 but 300" in r.json()["detail"]
    sha = hashlib.sha256(data).hexdigest()
    r = await client.put(url, content=data[300:], params={"offset": 300, "sha256": sha})
    assert r.json() == {"complete": True, "received": 1000, "sha256": sha, "created": True}
    r = await client.put(url, content=data)  # a retry of the whole file: no-op
    assert r.status_code == 200 and r.json()["created"] is False
    r = await client.put(url, content=b"y" * 1000)
    assert r.status_code == 409


async def test_bad_sha_and_size_cap(client: httpx.AsyncClient) -> None:
    await client.post("/api/v1/runs", json={"name": "r"})
    r = await client.put("/api/v1/runs/r/files/p0/acceptance.jsonl", content=b"abc", params={"sha256": "0" * 64})
    assert r.status_code == 400 and "hash mismatch" in r.json()["detail"]
    r = await client.put("/api/v1/runs/r/files/p0/tensors-00000.safetensors", content=b"z" * ((1 << 20) + 1))
    assert r.status_code == 400 and "upload limit" in r.json()["detail"]
    st = (await client.get("/api/v1/runs/r/files/p0/tensors-00000.safetensors")).json()
    assert st["received"] == 0  # nothing kept of the refused upload


@pytest.mark.parametrize(
    "part, filename",
    [("..", "part.json"), ("p0", "..%2Fx"), ("p0", "evil.sh"), ("_root", "part.json"), ("a b", "part.json"),
     ("p0", "tensors-1.safetensors")],
)
async def test_client_names_never_become_paths(client: httpx.AsyncClient, part: str, filename: str, tmp_path: Path) -> None:
    await client.post("/api/v1/runs", json={"name": "r"})
    r = await client.put(f"/api/v1/runs/r/files/{part}/{filename}", content=b"{}")
    assert r.status_code in (400, 404, 405), r.text
    home = tmp_path / "home"
    names = {p.name for p in home.rglob("*")}
    assert not any(n in names for n in ("x", "evil.sh"))


async def test_corrupt_bundle_is_refused_on_finalize(client: httpx.AsyncClient, tmp_path: Path) -> None:
    bundle = write_tp_bundle(tmp_path, "b", tensors(), tp=1)
    f = bundle / "parts" / "tp0" / "tensors-00000.safetensors"
    f.write_bytes(f.read_bytes()[:-10])
    r = await client.post("/api/v1/runs", json={"name": "b"})
    for part, path in (("_root", bundle / MANIFEST), ("tp0", f), ("tp0", bundle / "parts" / "tp0" / "part.json")):
        await client.put(f"/api/v1/runs/b/files/{part}/{path.name}", content=path.read_bytes())
    r = await client.post("/api/v1/runs/b/finalize")
    assert r.status_code == 400 and "truncated" in r.json()["detail"]
    assert (await client.get("/api/v1/runs")).json()["data"] == []


async def test_acceptance_summary_route(client: httpx.AsyncClient, tmp_path: Path) -> None:
    from probes import AcceptanceRecorder
    from tests.validator.judging.acceptance_factories import make_records

    bundle = write_tp_bundle(tmp_path, "acc", tensors(), tp=1)
    with AcceptanceRecorder(bundle, part="verify") as rec:
        for r in make_records(500, [0.8, 0.6], seed=0):
            rec.record(r["request_id"], r["proposed"], r["accepted"], step=r["step"])
    await client.post("/api/v1/runs", json={"name": "acc"})
    for f in [bundle / MANIFEST, *sorted((bundle / "parts").rglob("*"))]:
        if f.is_file():
            part = "_root" if f.name == MANIFEST else f.parent.name
            r = await client.put(f"/api/v1/runs/acc/files/{part}/{f.name}", content=f.read_bytes())
            assert r.status_code == 200, r.text
    assert (await client.post("/api/v1/runs/acc/finalize")).status_code == 200
    doc = (await client.get("/api/v1/runs/acc/acceptance")).json()
    assert doc["engine_metrics"]
    assert (await client.get("/api/v1/runs/nope/acceptance")).status_code == 404


async def test_a_run_name_never_shadows_a_run_id(client: httpx.AsyncClient, tmp_path: Path) -> None:
    first = await push(client, write_tp_bundle(tmp_path, "first", tensors(), tp=1), "first")
    # a name that is the next id is refused, so "/runs/<id>" can only ever mean that id
    nxt = str(first["id"] + 1)
    r = await client.post("/api/v1/runs", json={"name": nxt})
    assert r.status_code == 400 and "only digits" in r.json()["detail"]
    second = await push(client, write_tp_bundle(tmp_path, "second", tensors(), tp=1), "second")
    assert second["id"] == first["id"] + 1
    assert (await client.get(f"/api/v1/runs/{nxt}")).json()["name"] == "second"
    assert (await client.get(f"/api/v1/runs/{first['id']}")).json()["name"] == "first"


@pytest.mark.parametrize(
    "name",
    ["a\x7fb", "a\x85b", "evil\u202eexe.txt", "tab\there", "line\u2028sep", "a/b", "..", ".", "back\\slash", "", "x" * 201, "0042"],
)
async def test_unusable_run_names_are_refused_at_creation(client: httpx.AsyncClient, name: str) -> None:
    r = await client.post("/api/v1/runs", json={"name": name})
    assert r.status_code in (400, 422), (name, r.text)
    assert (await client.get("/api/v1/runs")).json()["data"] == []


def test_file_name_patterns_take_ascii_digits_only() -> None:
    from validator.errors import InputError
    from validator.service.uploads import check_file_name

    check_file_name("p0", "tensors-00001.safetensors")
    with pytest.raises(InputError):
        check_file_name("p0", "tensors-٠٠٠٠١.safetensors")  # Arabic-Indic digits


async def test_finalize_errors_never_show_server_paths(client: httpx.AsyncClient, api_service, tmp_path: Path) -> None:
    import os

    bundle = write_tp_bundle(tmp_path, "bad", tensors(), tp=1)
    part = next((bundle / "parts").iterdir())
    shard = next(part.glob("tensors-*.safetensors"))
    shard.write_bytes(shard.read_bytes()[:-7])  # truncated: its checksum and size no longer match
    await client.post("/api/v1/runs", json={"name": "bad"})
    await client.put(f"/api/v1/runs/bad/files/_root/{MANIFEST}", content=(bundle / MANIFEST).read_bytes())
    for f in sorted(part.iterdir()):
        await client.put(f"/api/v1/runs/bad/files/{part.name}/{f.name}", content=f.read_bytes())
    r = await client.post("/api/v1/runs/bad/finalize")
    detail = r.json()["detail"]
    assert r.status_code == 400 and "bad" in detail and shard.name in detail
    home = str(api_service.settings.home)
    assert home not in detail and "/tmp" not in detail and "finalize." not in detail and str(os.getpid()) not in detail


async def test_listing_says_page_count_and_total(client: httpx.AsyncClient, tmp_path: Path) -> None:
    for i in range(4):
        await push(client, write_tp_bundle(tmp_path, f"r{i}", tensors(), tp=1), f"r{i}")
    doc = (await client.get("/api/v1/runs", params={"limit": 3})).json()
    assert doc["count"] == 3 and doc["total"] == 4 and len(doc["data"]) == 3
    doc = (await client.get("/api/v1/runs", params={"limit": 3, "offset": 3, "label": "via=api"})).json()
    assert doc["count"] == 1 and doc["total"] == 4
    assert (await client.get("/api/v1/runs", params={"label": "via=nope"})).json()["total"] == 0


async def _push_manifest(client: httpx.AsyncClient, bundle: Path, name: str, manifest: bytes) -> httpx.Response:
    await client.post("/api/v1/runs", json={"name": name})
    await client.put(f"/api/v1/runs/{name}/files/_root/{MANIFEST}", content=manifest)
    part = next((bundle / "parts").iterdir())
    for f in sorted(part.iterdir()):
        await client.put(f"/api/v1/runs/{name}/files/{part.name}/{f.name}", content=f.read_bytes())
    return await client.post(f"/api/v1/runs/{name}/finalize")


async def test_deep_or_huge_manifests_are_refused_at_upload(client: httpx.AsyncClient, tmp_path: Path) -> None:
    import json

    bundle = write_tp_bundle(tmp_path, "m", tensors(), tp=1)
    doc = json.loads((bundle / MANIFEST).read_text())
    deep = dict(doc, run={**doc["run"], "notes": json.loads("[" * 300 + "]" * 300)})
    r = await _push_manifest(client, bundle, "deep", json.dumps(deep).encode())
    assert r.status_code == 400 and "nested deeper than the 64 levels" in r.json()["detail"]
    huge = dict(doc, run={**doc["run"], "notes": {f"k{i}": i for i in range(400_000)}})  # ~7 MB
    await client.post("/api/v1/runs", json={"name": "huge"})
    r = await client.put(f"/api/v1/runs/huge/files/_root/{MANIFEST}", content=json.dumps(huge).encode())
    assert r.status_code in (400, 413)  # over this server's upload limit; a bigger limit meets the 4 MiB cap
    assert (await client.get("/api/v1/runs")).json()["total"] == 0
    # the same manifest at a sane depth is fine, and so is a sane run page
    ok = dict(doc, run={**doc["run"], "notes": json.loads("[" * 20 + "]" * 20)})
    r = await _push_manifest(client, bundle, "ok", json.dumps(ok).encode())
    assert r.status_code == 200, r.text
    assert (await client.get("/api/v1/runs/ok")).status_code == 200


async def test_label_count_is_capped(client: httpx.AsyncClient) -> None:
    r = await client.post("/api/v1/runs", json={"name": "many", "labels": {f"k{i}": "v" for i in range(101)}})
    assert r.status_code == 400 and "at most 100" in r.json()["detail"]


def test_manifest_size_cap_applies_to_every_ingest(tmp_path: Path) -> None:
    import json

    from validator.errors import InputError
    from validator.runs.sources import open_path

    bundle = write_tp_bundle(tmp_path, "m", tensors(), tp=1)
    doc = json.loads((bundle / MANIFEST).read_text())
    doc["run"]["notes"] = "x" * (5 << 20)
    (bundle / MANIFEST).write_text(json.dumps(doc))
    with pytest.raises(InputError, match="more than the 4,194,304 a manifest may hold"):
        open_path(bundle)


@pytest.mark.parametrize(
    ("column", "damage"),
    [("runs.manifest", "UPDATE runs SET manifest = substr(manifest, 1, 20) WHERE name = 'r'"),
     ("tensors.shape", "UPDATE tensors SET shape = '[256,' WHERE id = (SELECT min(id) FROM tensors)")],
)
async def test_a_damaged_row_answers_a_clear_error(
    client: httpx.AsyncClient, api_service, tmp_path: Path, column: str, damage: str
) -> None:
    """A stored manifest cut short, a shape `[256,`: every read of the run says so (422 naming run and column),
    never 500; the other runs read fine; `check` lists the row (tests/validator/store/test_integrity.py)."""
    import html

    from sqlalchemy import text

    if api_service.engine.dialect.name != "sqlite":
        pytest.skip("PostgreSQL refuses invalid JSON in a JSON column: such a row cannot be stored")
    await push(client, write_tp_bundle(tmp_path, "r", tensors(), tp=2), "r")
    await push(client, write_tp_bundle(tmp_path, "ok", tensors(), tp=2), "ok")
    with api_service.engine.begin() as c:
        c.execute(text(damage))
    for url in ("/api/v1/runs/r", "/api/v1/runs/r/tensors", "/runs/r", "/runs/r?format=json"):
        r = await client.get(url)
        assert r.status_code == 422, (url, r.status_code, r.text[:300])
        body = html.unescape(r.text)  # the dashboard's page escapes the quotes
        assert "run 'r'" in body and column.split(".")[1] in body and "damaged" in body, body[:300]
    g = await client.post("/api/v1/gates", json={"baseline": "ok", "candidate": "r"})
    assert g.status_code == 422 and "damaged" in g.json()["detail"]
    assert (await client.get("/api/v1/runs/ok")).status_code == 200
    assert (await client.get("/api/v1/runs")).status_code == 200
    r = await client.post("/api/v1/admin/check")
    assert r.status_code == 200 and not r.json()["ok"]
    assert any("'r'" in p and column in p for p in r.json()["problems"]), r.json()
