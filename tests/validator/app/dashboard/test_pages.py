"""The dashboard in-process (httpx.ASGITransport): pages, their JSON twins, errors, escaping and auth."""

from __future__ import annotations

from dataclasses import replace

import httpx
import pytest

from tests.validator.app.dashboard.conftest import Sample
from validator.app.api import create_app
from validator.app.dashboard import pages
from validator.service import Service

pytestmark = pytest.mark.anyio


async def _compare(c: httpx.AsyncClient, names: dict[str, str], *, floor: bool = True) -> int:
    params = {"a": names["ref"], "b": names["drift"]}
    if floor:
        params.update(floor_a=names["ref"], floor_b=names["rerun"])
    r = await c.get("/compare", params=params)
    assert r.status_code == 303
    loc = r.headers["location"]
    assert loc.startswith("/comparisons/")
    return int(loc.rsplit("/", 1)[1])


async def test_runs_page_and_its_twin_match_the_api(dash_client: httpx.AsyncClient, sample: Sample) -> None:
    api = (await dash_client.get("/api/v1/runs", params={"label": "engine_commit=a1b2c3d"})).json()
    twin = (await dash_client.get("/runs", params={"engine_commit": "a1b2c3d", "format": "json"})).json()
    assert twin["data"] == api["data"] and twin["filters"] == {"engine_commit": "a1b2c3d"}
    assert {r["name"] for r in twin["data"]} == {sample.names["ref"], sample.names["rerun"]}
    twin = (await dash_client.get("/runs", params=[("label", "rerun=1"), ("format", "json")])).json()
    assert [r["name"] for r in twin["data"]] == [sample.names["rerun"]]
    r = await dash_client.get("/runs")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "default-src 'none'" in r.headers["content-security-policy"]
    assert r.text.count('<tr>') >= len(sample.names)
    assert (await dash_client.get("/runs", params={"label": "nokey"})).status_code == 400
    home = await dash_client.get("/")
    assert home.status_code == 307 and home.headers["location"] == "/runs"


async def test_run_page_twin_extends_the_api(dash_client: httpx.AsyncClient, sample: Sample) -> None:
    name = sample.names["drift"]
    api = (await dash_client.get(f"/api/v1/runs/{name}")).json()
    twin = (await dash_client.get(f"/runs/{name}", params={"format": "json"})).json()
    assert twin["run"] == api
    acc = twin["acceptance"]
    assert acc["requests"] == 30 and acc["steps"] == 1500 and len(acc["conditional"]) == 5
    html = (await dash_client.get(f"/runs/{api['id']}")).text
    assert "Acceptance" in html and "attn.q" in html and "P:TP4/PP2 D:TP4" in html
    assert (await dash_client.get("/runs/none-such")).status_code == 404
    r = await dash_client.get("/runs/none-such", params={"format": "json"})
    assert r.status_code == 404 and "none-such" in r.json()["detail"]


async def test_comparison_twin_matches_the_api(dash_client: httpx.AsyncClient, sample: Sample) -> None:
    cid = await _compare(dash_client, sample.names)
    assert await _compare(dash_client, sample.names) == cid  # cached: same link every time
    api = (await dash_client.get(f"/api/v1/comparisons/{cid}")).json()
    twin = (await dash_client.get(f"/comparisons/{cid}", params={"format": "json"})).json()
    assert twin["comparison"] == api and api["status"] == "done" and api["verdict"] == "fail"
    doc = api["result"]
    assert twin["metric"] == "floor_ratio" and twin["acceptance_view"] is True
    first = doc["pairs"][twin["first"]["index"]]
    assert first["label"] == "hidden [step=0 tok=0:48 layer=3]" and twin["first"]["kind"] == "limit"
    assert doc["first_divergence"]["index"] == twin["first"]["index"]  # read from the stored document
    assert doc["first_divergence"]["where"] == "hidden layer 3, step 0" and doc["problem_nodes"][0] == doc["first_divergence"]
    assert isinstance(twin["frontier"], list) and not any(x.startswith("first divergence") for x in twin["frontier"])
    h = twin["heatmap"]
    assert h["rows"] == ["hidden", "attn.q", "attn.k", "mlp.out", "final.norm"]  # capture order
    assert h["cols"] == ["—"] + [f"layer {i}" for i in range(6)]
    assert len(twin["pairs"]) == len(doc["pairs"]) == 25
    r = await dash_client.get(f"/comparisons/{cid}", params={"metric": "rel_l2", "format": "json"})
    assert r.json()["heatmap"]["metric"] == "rel_l2"
    assert (await dash_client.get(f"/comparisons/{cid}", params={"metric": "nope"})).status_code == 400
    html = (await dash_client.get(f"/comparisons/{cid}")).text
    assert 'id="heatmap-data"' in html and "/static/plotly.min.js" in html and "FAIL" in html
    assert "<strong>First divergence</strong>" in html
    r = await dash_client.get("/compare", params={"a": sample.names["ref"], "b": sample.names["drift"], "format": "json"})
    assert r.status_code == 303 and r.headers["location"].endswith("?format=json")
    r = await dash_client.get("/compare", params={"a": sample.names["ref"], "b": sample.names["drift"], "floor_a": "x"})
    assert r.status_code == 400 and "floor_b" in r.text
    assert (await dash_client.get("/compare", params={"a": sample.names["ref"]})).status_code == 400
    assert (await dash_client.get("/comparisons/99999")).status_code == 404


async def test_pair_page_drills_into_one_pair(dash_client: httpx.AsyncClient, sample: Sample) -> None:
    cid = await _compare(dash_client, sample.names)
    doc = (await dash_client.get(f"/api/v1/comparisons/{cid}")).json()["result"]
    i = next(i for i, p in enumerate(doc["pairs"]) if p["label"] == "attn.q [step=0 tok=0:48 layer=5]")
    twin = (await dash_client.get(f"/comparisons/{cid}/pairs/{i}", params={"format": "json"})).json()
    assert twin["pair"] == doc["pairs"][i]
    prof, floor = twin["profile"], twin["floor_profile"]
    # the engine's stated accuracy for norms and rel_l2 is 1e-6 relative of float64 (docs/metrics.md)
    assert prof["rel_l2"] == pytest.approx(doc["pairs"][i]["rel_l2"], rel=1e-6)
    assert floor["rel_l2"] == pytest.approx(doc["pairs"][i]["floor_rel_l2"], rel=1e-6)
    heads = prof["heads"]["rel_l2"]
    assert max(range(8), key=heads.__getitem__) == 5  # the sample's drift sits in head 5
    tokens = prof["tokens"]["rel_l2"]
    assert min(tokens[24:]) > max(tokens[:24])  # ... and in the second half of the tokens
    assert len(prof["worst"]) == 20 and prof["worst"][0]["index"][1] == 5
    html = (await dash_client.get(f"/comparisons/{cid}/pairs/{i}")).text
    assert 'id="pair-data"' in html and "Worst elements" in html
    r = await dash_client.get(f"/comparisons/{cid}/pairs/{len(doc['pairs'])}", params={"format": "json"})
    assert r.status_code == 404 and "no pair" in r.json()["detail"]


async def test_acceptance_page(dash_client: httpx.AsyncClient, dash_service: Service, sample: Sample) -> None:
    cid = await _compare(dash_client, sample.names, floor=False)
    doc = (await dash_client.get(f"/api/v1/comparisons/{cid}")).json()["result"]
    twin = (await dash_client.get(f"/comparisons/{cid}/acceptance", params={"format": "json"})).json()
    assert twin["acceptance"] == doc["acceptance"] and twin["gsm8k"] == doc["gsm8k"]
    assert [p["position"] for p in twin["acceptance"]["positions"]] == list(range(5))
    g = twin["gsm8k"]
    assert (g["lost"], g["gained"], g["matched"]) == (2, 1, 12)
    assert sorted(f["index_a"] for f in g["flips"]) == [2, 5, 7]
    html = (await dash_client.get(f"/comparisons/{cid}/acceptance")).text
    assert 'id="acceptance-data"' in html and 'id="flips"' in html
    # where acceptance first parts, beside where the tensors did, from the stored document
    front = doc["acceptance"]["frontier"]
    assert front["requests"] > 0 and twin["parting"].startswith(("acceptance first parts at verify step", "acceptance never parts"))
    assert twin["tensor_parting"] == f"tensors first part at {doc['first_divergence']['where']}"
    assert 'id="acceptance-parting"' in html
    assert "p (Holm)" in html  # raw and Holm-adjusted difference p-values per position
    assert html.count('class="flip-lost"') == 2 and html.count('class="flip-gained"') == 1
    # model outputs are text: the drift run's outputs hold a script tag
    assert "&lt;script&gt;window.__xss = 2&lt;/script&gt;" in html and "<script>window" not in html
    # comparisons cached before the compare document carried a gsm8k section: computed from the stored rows
    older = {k: v for k, v in doc.items() if k != "gsm8k"}
    again = pages._gsm8k_comparison(dash_service, older)
    assert again is not None and {k: again[k] for k in ("lost", "gained", "flips")} == {k: g[k] for k in ("lost", "gained", "flips")}
    # a comparison without acceptance records or GSM8K results in both runs: the page says so, no tab
    r = await dash_client.get("/compare", params={"a": sample.names["ref"], "b": sample.names["xss"]})
    other = int(r.headers["location"].rsplit("/", 1)[1])
    assert (await dash_client.get(f"/comparisons/{other}", params={"format": "json"})).json()["acceptance_view"] is False
    html = (await dash_client.get(f"/comparisons/{other}/acceptance")).text
    assert "acceptance records must be in both runs" in html and "No GSM8K results in both runs" in html


async def test_run_page_shows_the_gsm8k_summary(dash_client: httpx.AsyncClient, sample: Sample) -> None:
    twin = (await dash_client.get(f"/runs/{sample.names['drift']}", params={"format": "json"})).json()
    assert twin["evals"]["gsm8k"]["questions"] == 12 and twin["evals"]["gsm8k"]["accuracy"] == pytest.approx(10 / 12)
    assert (await dash_client.get(f"/runs/{sample.names['rerun']}", params={"format": "json"})).json()["evals"] == {}
    html = (await dash_client.get(f"/runs/{sample.names['drift']}")).text
    assert "GSM8K" in html and "0.8333" in html


async def test_run_content_is_escaped_in_html_and_script_json(dash_client: httpx.AsyncClient, sample: Sample) -> None:
    name = sample.names["xss"]
    for url in ("/runs", f"/runs/{name}"):
        html = (await dash_client.get(url)).text
        assert "<script>window" not in html and "&lt;script&gt;window.__xss = 1&lt;/script&gt;" in html
        assert "<i>run<b>" not in html and "xss-&lt;i&gt;run&lt;b&gt;" in html
    r = await dash_client.get("/compare", params={"a": name, "b": name})
    html = (await dash_client.get(r.headers["location"])).text
    assert "<i>run<b>" not in html
    data = html.split('<script type="application/json" id="heatmap-data">', 1)[1].split("</script>", 1)[0]
    assert "<" not in data  # JSON for scripts carries no raw angle brackets


async def test_static_files_are_served_by_the_app(dash_client: httpx.AsyncClient) -> None:
    r = await dash_client.get("/static/plotly.min.js")
    assert r.status_code == 200 and len(r.content) > 1_000_000 and "max-age" in r.headers["cache-control"]
    for name in ("dashboard.js", "dashboard.css"):
        assert (await dash_client.get(f"/static/{name}")).status_code == 200
    for bad in ("/static/nope.js", "/static/..%2Fpyproject.toml", "/static/%2e%2e/templates/base.html"):
        assert (await dash_client.get(bad)).status_code == 404


async def test_pages_follow_protect_reads(dash_service: Service, sample: Sample) -> None:
    settings = replace(dash_service.settings, tokens=("tok",), protect_reads=True)
    object.__setattr__(dash_service, "settings", settings)
    app = create_app(settings, service=dash_service)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        for url in ("/runs", f"/runs/{sample.names['ref']}", "/compare?a=x&b=y", "/comparisons/1",
                    "/comparisons/1/pairs/0", "/comparisons/1/acceptance"):
            assert (await c.get(url)).status_code == 401, url
            assert (await c.get(url, headers={"Authorization": "Bearer tok"})).status_code != 401, url
        assert (await c.get("/static/dashboard.css")).status_code == 200  # no data in static files
        assert (await c.post("/runs")).status_code == 405  # pages are GET only


async def test_comparison_page_lists_pooled_units(dash_client: httpx.AsyncClient, sample: Sample) -> None:
    """Each pooled unit (the pairs of one capture point judged together) with its verdict, its judged value and a
    link to its pairs, failing units first; a pair settled by pooling says so in the pairs table."""
    cid = await _compare(dash_client, sample.names, floor=False)
    doc = (await dash_client.get(f"/api/v1/comparisons/{cid}")).json()["result"]
    units = doc["pooled"]
    assert len(units) >= 2, "the sample's capture points span layers: they have pooled units"
    html = (await dash_client.get(f"/comparisons/{cid}")).text
    start = html.index('id="pooled"')
    section = html[start : html.index("</section>", start)]
    counts = doc["pooled_counts"]
    text = " ".join(section.split())
    assert f"{len(units)} units, {counts.get('fail', 0)} fail, {counts.get('inconclusive', 0)} inconclusive" in text
    rank = {"fail": 0, "inconclusive": 1, "pass": 2}
    at = [section.index(f">{u['label']}</a>") for u in units]  # every unit listed once
    shown = [u for _, u in sorted(zip(at, units), key=lambda x: x[0])]
    assert [rank[u["status"]] for u in shown] == sorted(rank[u["status"]] for u in units)  # failing first
    for u in units:
        judged = u["reason"].removeprefix(u["label"] + ": ")
        assert judged != u["reason"] and judged.replace(">", "&gt;").replace("<", "&lt;") in section
        assert f"name={u['name']}" in section  # the link filters the pairs table to the unit's capture point
    settled = sum(bool(p.get("pooled_pass")) for p in doc["pairs"])
    assert settled == counts["settled_pairs"]
    assert html.count("(settled by pooling)") == min(settled, 50)  # the table's first page: up to 50 rows
