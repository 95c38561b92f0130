"""D-only vs PD on the committed transformers pair through a real `validator serve`: the three bundles
(tests/validator/workloads/conftest.py, shared with test_transformers_pd.py) are pushed with `validator push`, then
compared with the policy examples/policies/hf-tiny-pd.toml through the REST API (comparisons and the CI
gate, and `validator gate --server`), and their evidence is read off the dashboard's pages over HTTP and
in Chromium: the correct hand-off is equivalent, tensors and acceptance; the broken one fails at layer
1's KV cache and nowhere else among the caches."""

from __future__ import annotations

import html
import json
import os
import re
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.paths import ROOT
from tests.servers import validator_serve
from tests.validator.app.dashboard.browser import browser_for_tests
from validator.app.cli import main

pytest.importorskip("transformers")

MODEL = ROOT / "examples" / "models" / "gsm8k-llama-tiny"  # the committed pair the bundles run
POLICY = ROOT / "examples" / "policies" / "hf-tiny-pd.toml"
TOKEN = "hf-pd-token"
KV = ("target.k", "target.v", "draft.k", "draft.v")
RUNS = {"d-only": "hf-d-only", "pd": "hf-pd", "pd-broken": "hf-pd-broken"}


@dataclass(frozen=True)
class Server:
    url: str
    api: httpx.Client  # authenticated, base_url = the server's /api/v1
    comparisons: dict[str, dict[str, Any]]  # "pd", "pd-broken" -> the finished comparison record


def _finished(api: httpx.Client, r: httpx.Response) -> dict[str, Any]:
    assert r.status_code in (200, 202), r.text
    rec = r.json()
    deadline = time.monotonic() + 120
    while rec["status"] in ("queued", "running"):  # large comparisons run in the background
        assert time.monotonic() < deadline, rec
        time.sleep(0.2)
        rec = api.get(f"/comparisons/{rec['id']}").raise_for_status().json()
    assert rec["status"] == "done", rec["error"]
    return dict(rec)


@pytest.fixture(scope="module")
def server(bundles: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("hf-server")
    env = {k: v for k, v in os.environ.items() if not k.startswith("VALIDATOR_")}
    env.update(VALIDATOR_HOME=str(root / "server-home"), VALIDATOR_TOKENS=TOKEN)
    with validator_serve(env, root / "server.log") as url:
        for mode, run in RUNS.items():  # `validator push`, as `probe transformers --push URL` runs it
            push = ["--home", str(root / "client-home"), "--server", url, "--token", TOKEN, "push", str(bundles[mode])]
            assert main([*push, "--name", run, "--label", f"mode={mode}"]) == 0
        policy = tomllib.loads(POLICY.read_text())  # the API takes the TOML file's content as JSON
        with httpx.Client(base_url=url + "/api/v1", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=120) as api:
            comparisons = {
                mode: _finished(api, api.post("/comparisons", json={"a": RUNS["d-only"], "b": RUNS[mode], "policy": policy}))
                for mode in ("pd", "pd-broken")
            }
            yield Server(url, api, comparisons)


def _kv_failing(pairs: list[dict[str, Any]]) -> set[tuple[str, int]]:
    """(name, layer) of the failing KV-cache pairs at step 0 (the caches as the decode side holds them)."""
    return {(p["name"], p["coords"]["layer"]) for p in pairs
            if p["name"] in KV and p["coords"].get("step") == 0 and p["status"] != "pass"}


# -- the REST API -------------------------------------------------------------------------------------


def test_api_d_only_vs_pd_equivalent(server: Server) -> None:
    rec = server.comparisons["pd"]
    doc = rec["result"]
    assert rec["verdict"] == doc["verdict"] == "pass", doc["reasons"]
    assert rec["request"]["policy"] == tomllib.loads(POLICY.read_text())
    assert doc["pairs"] and all(p["status"] == "pass" for p in doc["pairs"])
    assert {p["name"] for p in doc["pairs"]} == {*KV, "target.hidden", "target.logits", "draft.logits"}
    layers = json.loads((MODEL / "target" / "config.json").read_text())["num_hidden_layers"]
    assert {p["coords"]["layer"] for p in doc["pairs"] if p["name"] == "target.k" and p["coords"].get("step") == 0} == set(
        range(layers))  # every layer's cache, compared
    assert not doc["only_a"] and not doc["only_b"]
    acc = doc["acceptance"]
    assert acc["verdict"] == "pass", acc["reasons"]
    judged = [p for p in acc["positions"] if p["selected"]]
    assert judged and all(p["verdict"] == "equivalent" for p in judged)  # the positions with enough trials


def test_api_d_only_vs_broken_pd_fails_at_layer_1(server: Server) -> None:
    rec = server.comparisons["pd-broken"]
    doc = rec["result"]
    assert rec["verdict"] == doc["verdict"] == "fail"
    assert _kv_failing(doc["pairs"]) == {("target.k", 1), ("target.v", 1)}
    # every request's layer-1 cache is misplaced (k and v); every other layer's, and the draft's, arrived intact
    failing = [p for p in doc["pairs"] if p["name"] in ("target.k", "target.v") and p["status"] == "fail"]
    requests = {p["coords"]["request"] for p in doc["pairs"] if p["name"] == "target.k"}
    assert len(requests) == 8 and len(failing) == 2 * len(requests)
    assert any("layer=1" in r and r.startswith(("target.k", "target.v")) for r in doc["reasons"])


def test_api_gate(server: Server, capsys: Any) -> None:
    policy = tomllib.loads(POLICY.read_text())
    for mode, verdict, code in (("pd", "pass", 0), ("pd-broken", "fail", 1)):
        r = server.api.post("/gates", json={"baseline": RUNS["d-only"], "candidate": RUNS[mode], "policy": policy})
        assert r.status_code == 200, r.text
        gate = r.json()
        assert gate["verdict"] == verdict and gate["comparison_id"] == server.comparisons[mode]["id"]  # cached
        assert verdict.upper() in gate["markdown"]
        # the CLI gate against the server: its exit status is the verdict's
        capsys.readouterr()
        cmd = ["--server", server.url, "--token", TOKEN, "gate", RUNS["d-only"], RUNS[mode], "--policy", str(POLICY)]
        assert main(cmd) == code
        assert f"/comparisons/{gate['comparison_id']}" in capsys.readouterr().out


# -- the dashboard over HTTP ----------------------------------------------------------------------------


def _rows(page: str) -> list[tuple[str, str]]:
    """(status, tensor label) of each row of the pairs table on a comparison page."""
    return [(s, html.unescape(label)) for s, label in re.findall(
        r'<tr class="row-(\w+)[^"]*">.*?<a class="pair-link"[^>]*>([^<]*)</a>', page, flags=re.S)]


def _kv_labels(labels: list[str]) -> set[tuple[str, int]]:
    """(name, layer) of the step-0 KV-cache pairs among table labels ('target.k [step=0 req=q000 ... layer=1]')."""
    out = set()
    for label in labels:
        m = re.fullmatch(r"(\S+) \[step=0 .*\blayer=(\d+)\]", label.strip())
        if m and m.group(1) in KV:
            out.add((m.group(1), int(m.group(2))))
    return out


def test_dashboard_pd_page_shows_equivalence(server: Server) -> None:
    cid = server.comparisons["pd"]["id"]
    page = httpx.get(f"{server.url}/comparisons/{cid}", params={"per_page": 1000}).raise_for_status().text
    assert '<span class="verdict verdict-pass">PASS</span>' in page
    assert "hf-pd" in page and "hf-d-only" in page and "policy: request" in page
    rows = _rows(page)
    assert len(rows) == len(server.comparisons["pd"]["result"]["pairs"]) and {s for s, _ in rows} == {"pass"}
    assert any(label.startswith("target.k ") and "layer=1" in label for _, label in rows)
    assert 'id="acceptance-tab"' in page
    acc = httpx.get(f"{server.url}/comparisons/{cid}/acceptance").raise_for_status().text
    assert re.search(r"<h2>Acceptance <span class=\"verdict verdict-pass verdict-small\">PASS</span>", acc)
    verdicts = re.findall(r'<tr class="verdict-row-(\w+)">', acc)  # one row per draft position
    positions = server.comparisons["pd"]["result"]["acceptance"]["positions"]
    assert verdicts == [p["verdict"] for p in positions] and "equivalent" in verdicts and "different" not in verdicts


def test_dashboard_broken_pd_page_shows_the_failing_layer(server: Server) -> None:
    cid = server.comparisons["pd-broken"]["id"]
    page = httpx.get(f"{server.url}/comparisons/{cid}", params={"status": "fail", "per_page": 1000}).raise_for_status().text
    assert '<span class="verdict verdict-fail">FAIL</span>' in page
    rows = _rows(page)
    assert rows and {st for st, _ in rows} == {"fail"}
    assert _kv_labels([label for _, label in rows]) == {("target.k", 1), ("target.v", 1)}
    assert re.search(r"target\.[kv] \[step=0 [^\]]*layer=1\]</a>\s*<div class=\"why\">[^<]*rel_l2 [0-9.]+ [^<]*&gt; 1e-06", page)
    # the JSON behind the page says the same
    got = httpx.get(f"{server.url}/comparisons/{cid}", params={"format": "json", "status": "fail", "per_page": 1000})
    data = got.raise_for_status().json()
    assert data["comparison"]["result"]["verdict"] == "fail"
    assert _kv_failing(data["comparison"]["result"]["pairs"]) == {("target.k", 1), ("target.v", 1)}
    assert [r["label"] for r in data["table"]["rows"]] == [label for _, label in rows]


# -- the dashboard in Chromium --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Debian's Chromium under Playwright, as in tests/validator/app/dashboard."""
    yield from browser_for_tests()


def test_dashboard_in_chromium(server: Server, browser: Any) -> None:
    context = browser.new_context(viewport={"width": 1360, "height": 900})
    try:
        page = context.new_page()
        page.set_default_timeout(15000)
        page.goto(f"{server.url}/comparisons/{server.comparisons['pd-broken']['id']}")
        assert page.locator(".verdict").first.inner_text() == "FAIL"
        page.wait_for_selector("#heatmap[data-rendered='1']")  # the drift map, drawn
        page.locator("#status-filter a", has_text=re.compile(r"^fail \(")).click()
        page.wait_for_url(re.compile(r"status=fail"))
        page.goto(page.url.split("#")[0] + "&per_page=1000")  # every failing pair on one page
        labels = page.locator("#pairs tbody tr.row-fail a.pair-link").all_inner_texts()
        assert page.locator("#pairs tbody tr").count() == len(labels)  # only failing rows
        assert _kv_labels(labels) == {("target.k", 1), ("target.v", 1)}

        page.goto(f"{server.url}/comparisons/{server.comparisons['pd']['id']}")
        assert page.locator(".verdict").first.inner_text() == "PASS"
        page.click("#acceptance-tab")
        page.wait_for_selector("#positions-chart[data-rendered='1']")
        assert page.locator("h2 .verdict-small").inner_text() == "PASS"
        assert page.locator("#position-tests tbody tr").count() >= 1
    finally:
        context.close()
