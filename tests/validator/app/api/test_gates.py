from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.factories import tensors, write_tp_bundle
from tests.validator.app.api.helpers import push

pytestmark = pytest.mark.anyio


async def test_comparison_cached_and_gate_verdicts(client: httpx.AsyncClient, tmp_path: Path) -> None:
    full = tensors()
    await push(client, write_tp_bundle(tmp_path, "ref", full, tp=4), "ref")
    await push(client, write_tp_bundle(tmp_path, "same", full, tp=32), "same")
    await push(client, write_tp_bundle(tmp_path, "bad", full, tp=4, noise=0.5), "bad")
    r1 = await client.post("/api/v1/comparisons", json={"a": "ref", "b": "same"})
    r2 = await client.post("/api/v1/comparisons", json={"a": "ref", "b": "same"})
    assert r1.status_code == 200 and r1.json()["id"] == r2.json()["id"]
    assert r1.json()["verdict"] == "pass"
    got = await client.get(f"/api/v1/comparisons/{r1.json()['id']}")
    assert got.json()["result"]["pairs"][0]["rel_l2"] == 0.0

    g = await client.post("/api/v1/gates", json={"baseline": "ref", "candidate": "bad"})
    assert g.status_code == 200 and g.json()["verdict"] == "fail"
    assert "FAIL" in g.json()["markdown"]
    # where the runs first part: ctx, captured before k at the same step (neither has a request: k is downstream)
    assert g.json()["first_divergence"]["where"] == "ctx, step 0"
    assert [p["name"] for p in g.json()["problem_nodes"]] == ["ctx"]
    assert "- **first divergence: ctx, step 0**" in g.json()["markdown"]
    g = await client.post("/api/v1/gates", json={"baseline": "ref", "candidate": "same", "floor": ["ref", "ref"]})
    assert g.status_code == 200 and g.json()["verdict"] == "pass"  # bitwise floor, bitwise candidate
    assert g.json()["first_divergence"] is None and g.json()["problem_nodes"] == []
    g = await client.post("/api/v1/gates", json={"baseline": "ref", "candidate": "bad", "policy": {"rule": [{"match": "*", "rel_l2_max": 10}]}})
    assert g.json()["verdict"] == "pass"
    g = await client.post("/api/v1/gates", json={"baseline": "ref", "candidate": "nope"})
    assert g.status_code == 404
    g = await client.post("/api/v1/gates", json={"baseline": "ref", "candidate": "bad", "policy": {"rule": [{"bogus": 1}]}})
    assert g.status_code == 400 and "unknown rule key" in g.json()["detail"]


async def test_paths_are_not_runs_over_the_api(client: httpx.AsyncClient, tmp_path: Path) -> None:
    b = write_tp_bundle(tmp_path, "local", tensors(), tp=1)
    r = await client.post("/api/v1/comparisons", json={"a": str(b), "b": str(b)})
    assert r.status_code == 404


async def test_background_comparison_reports_status(client: httpx.AsyncClient, tmp_path: Path) -> None:
    import asyncio

    full = tensors()
    await push(client, write_tp_bundle(tmp_path, "a", full, tp=2), "a")
    r = await client.post("/api/v1/comparisons", json={"a": "a", "b": "a", "background": True})
    assert r.status_code in (200, 202)
    rec = r.json()
    for _ in range(100):
        if rec["status"] in ("done", "error"):
            break
        await asyncio.sleep(0.05)
        rec = (await client.get(f"/api/v1/comparisons/{rec['id']}")).json()
    assert rec["status"] == "done" and rec["verdict"] == "pass"


async def test_identical_gates_at_once_all_get_the_verdict(client: httpx.AsyncClient, tmp_path: Path) -> None:
    """20 identical gates on a pair never compared: one computes, the others wait for its verdict (not 422)."""
    import asyncio

    full = tensors()
    await push(client, write_tp_bundle(tmp_path, "ref", full, tp=4), "ref")
    await push(client, write_tp_bundle(tmp_path, "bad", full, tp=4, noise=0.5), "bad")
    body = {"baseline": "ref", "candidate": "bad"}
    got = await asyncio.gather(*(client.post("/api/v1/gates", json=body) for _ in range(20)))
    assert [r.status_code for r in got] == [200] * 20, [r.text for r in got if r.status_code != 200][:2]
    assert {r.json()["verdict"] for r in got} == {"fail"}
    assert len({r.json()["comparison_id"] for r in got}) == 1
    # and comparisons asked for at once, in the foreground, all answer the result
    body = {"a": "bad", "b": "ref", "background": False}
    got = await asyncio.gather(*(client.post("/api/v1/comparisons", json=body) for _ in range(20)))
    assert {(r.status_code, r.json()["status"], r.json()["verdict"]) for r in got} == {(200, "done", "fail")}
