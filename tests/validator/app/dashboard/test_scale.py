"""The comparison page at Kimi scale: 5,000 pairs (93 layers x 3 capture points x 16 steps and a few more).

The page stays small because the drift map holds one cell per capture point and layer and the pairs table
is paged on the server; its render time is measured in benchmarks/dashboard_bench.py, not here.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from tests.validator.app.dashboard import large
from tests.validator.app.dashboard.conftest import Large
from validator.app.api import create_app
from validator.app.dashboard.views import STATUS_RANK, column_of
from validator.service import Service
from validator.settings import Settings

pytestmark = pytest.mark.anyio

MAX_PAGE_BYTES = 300_000
ROWS = ["attn.out", "mlp.out", "hidden", "moe.router", "pp.sum"]  # capture order
COLS = [f"after_stage={i}" for i in range(large.STAGES)] + [f"layer {i}" for i in range(large.LAYERS)]


@pytest.fixture
async def client(large_store: Large) -> AsyncIterator[httpx.AsyncClient]:
    svc = Service(Settings(home=large_store.home))
    app = create_app(svc.settings, service=svc)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as c:
        yield c
    svc.close()


async def _twin(c: httpx.AsyncClient, cid: int, **params: Any) -> dict[str, Any]:
    r = await c.get(f"/comparisons/{cid}", params={**params, "format": "json"})
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


async def test_the_page_stays_small_and_the_api_unchanged(client: httpx.AsyncClient, large_store: Large) -> None:
    cid = large_store.comparison
    api = (await client.get(f"/api/v1/comparisons/{cid}")).json()
    doc = api["result"]
    assert len(doc["pairs"]) == large.N_PAIRS == 5000 and doc["counts"]["fail"] == large.FAILING
    for params in ({}, {"page": 50}, {"step": 13}, {"status": "pass"}, {"sort": "label", "dir": "asc"},
                   {"metric": "rel_l2"}, {"name": "hidden", "where": "layer 85"}):
        r = await client.get(f"/comparisons/{cid}", params=params)
        assert r.status_code == 200 and len(r.content) < MAX_PAGE_BYTES, (params, len(r.content))
    html = (await client.get(f"/comparisons/{cid}")).text
    assert html.count('<tr class="row-') == 100 and "pairs 1–100 of 5000, worst first" in html
    # the JSON twin: the API's resource as it is, every pair's row as before; paging only adds keys
    twin = await _twin(client, cid)
    assert twin["comparison"] == api and len(twin["pairs"]) == 5000
    assert {"comparison", "metric", "heatmap", "first", "pairs", "acceptance_view"} <= twin.keys()
    assert [p["label"] for p in twin["pairs"]] == [p["label"] for p in doc["pairs"]]


async def test_the_drift_map_has_one_cell_per_point_and_layer(client: httpx.AsyncClient, large_store: Large) -> None:
    cid = large_store.comparison
    twin = await _twin(client, cid)
    pairs = twin["comparison"]["result"]["pairs"]
    h = twin["heatmap"]
    assert h["rows"] == ROWS and h["cols"] == COLS
    assert sum(map(sum, h["count"])) == 5000
    layer85 = COLS.index("layer 85")
    assert [h["count"][r][layer85] for r in range(4)] == [16] * 4 and h["fails"][2][layer85] == 4
    # each cell shows its worst step: a failing pair when one fails, else the largest × floor
    cells: dict[tuple[str, str], list[int]] = {}
    for i, p in enumerate(pairs):
        cells.setdefault((p["name"], column_of(p["coords"])[1]), []).append(i)
    for (name, col), members in cells.items():
        r, c = ROWS.index(name), COLS.index(col)
        shown = pairs[h["pair"][r][c]]
        worst = max(members, key=lambda i: (pairs[i]["status"] in ("fail", "error"), pairs[i]["floor_ratio"]))
        assert shown["status"] == pairs[worst]["status"] and shown["floor_ratio"] == pairs[worst]["floor_ratio"]
        assert h["step"][r][c] == shown["coords"]["step"]
    # the step selector: 16 steps, the failing ones from step 12; one step's map and table
    assert [(s["step"], s["failing"]) for s in twin["steps"]] == [(s, 52 if s >= 12 else 0) for s in range(16)]
    one = await _twin(client, cid, step=13)
    assert one["step"] == 13 and all(n <= 1 for row in one["heatmap"]["count"] for n in row)
    assert {pairs[i]["coords"]["step"] for row in one["heatmap"]["pair"] for i in row if i is not None} == {13}
    assert one["table"]["matched"] == 312 and {r["step"] for r in one["table"]["rows"]} == {13}
    assert one["heatmap"]["first"]["kind"] == "limit"
    html = (await client.get(f"/comparisons/{cid}", params={"step": 13})).text
    assert '<option value="13" selected>step 13 (312 pairs, 52 failing)</option>' in html
    assert (await client.get(f"/comparisons/{cid}", params={"step": 99})).status_code == 400
    assert (await client.get(f"/comparisons/{cid}", params={"step": "x"})).status_code == 400


async def test_the_pairs_table_is_paged_on_the_server(client: httpx.AsyncClient, large_store: Large) -> None:
    cid = large_store.comparison
    first = await _twin(client, cid)
    t = first["table"]
    assert (t["page"], t["pages"], t["matched"], t["total"], t["sort"]) == (1, 50, 5000, 5000, "worst")
    assert t["status_counts"]["failing"] == large.FAILING
    # worst first: errors, failures, inconclusive, passes; each by its × floor, largest first
    seen: list[dict[str, Any]] = []
    for page in range(1, 6):
        seen += (await _twin(client, cid, page=page, per_page=1000))["table"]["rows"]
    assert sorted(r["index"] for r in seen) == list(range(5000))
    ranks = [STATUS_RANK[r["status"]] for r in seen]
    assert ranks == sorted(ranks) and all(r["status"] == "fail" for r in seen[: large.FAILING])
    for status in ("fail", "inconclusive", "pass"):
        ratios = [r["floor_ratio"] for r in seen if r["status"] == status]
        assert ratios == sorted(ratios, reverse=True)
    assert [r["index"] for r in t["rows"]] == [r["index"] for r in seen[:100]]
    # filters, another sort, past the end
    failing = (await _twin(client, cid, status="failing", per_page=500))["table"]
    assert failing["matched"] == large.FAILING and all(large.drifts(r_coords(first, r)) for r in failing["rows"])
    cell = (await _twin(client, cid, name="hidden", where="layer 85"))["table"]
    assert cell["matched"] == 16 and sorted(r["step"] for r in cell["rows"]) == list(range(16))
    assert [r["status"] for r in cell["rows"][:4]] == ["fail"] * 4
    by_rel = (await _twin(client, cid, sort="rel_l2", dir="asc", page=2))["table"]
    values = [r["rel_l2"] for r in by_rel["rows"]]
    assert values == sorted(values) and by_rel["start"] == 101
    last = (await _twin(client, cid, page=999))["table"]
    assert last["page"] == 50 and (last["start"], last["end"]) == (4901, 5000)
    for bad in ({"sort": "nope"}, {"dir": "up"}, {"status": "ok"}):
        r = await client.get(f"/comparisons/{cid}", params=bad)
        assert r.status_code == 400 and ("must be one of" in r.text or "asc or desc" in r.text)
    assert (await client.get(f"/comparisons/{cid}", params={"per_page": 5000})).status_code == 422


def r_coords(twin: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
    coords: dict[str, Any] = twin["comparison"]["result"]["pairs"][row["index"]]["coords"]
    return coords


async def test_filters_from_the_url_are_escaped(client: httpx.AsyncClient, large_store: Large) -> None:
    xss = "<script>window.__xss = 3</script>"
    r = await client.get(f"/comparisons/{large_store.comparison}", params={"name": xss, "where": xss})
    assert r.status_code == 200 and "<script>window" not in r.text and "&lt;script&gt;window.__xss = 3" in r.text
    assert "no pairs match" in r.text
