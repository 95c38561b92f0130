"""The dashboard in a real browser (Debian's Chromium via Playwright) against a real `validator serve`."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from tests.validator.app.dashboard.conftest import Sample
from tests.validator.app.dashboard.sample import XSS
from tests.validator.app.dashboard.screenshots import open_comparison


def test_runs_list_filters_by_label(server: str, sample: Sample, page: Any, tmp_path: Path) -> None:
    page.goto(server + "/runs")
    names = page.locator("table.runs td.name").all_inner_texts()
    assert set(sample.names.values()) <= set(names)
    page.screenshot(path=tmp_path / "runs.png")
    page.fill("input[name=engine_commit]", "a1b2c3d")
    page.click("#filters button[type=submit]")
    page.wait_for_url(re.compile(r"engine_commit=a1b2c3d"))
    assert sorted(page.locator("table.runs td.name").all_inner_texts()) == sorted([sample.names["ref"], sample.names["rerun"]])
    page.fill("input[name=engine_commit]", "")
    page.get_by_placeholder("KEY=VALUE").fill("rerun=1")
    page.click("#filters button[type=submit]")
    assert page.locator("table.runs td.name").all_inner_texts() == [sample.names["rerun"]]


def test_compare_then_pair_then_acceptance(server: str, sample: Sample, page: Any, tmp_path: Path) -> None:
    open_comparison(page, server, sample.names)
    assert re.search(r"/comparisons/\d+$", page.url)
    assert page.locator(".verdict").inner_text() == "FAIL"
    first = page.locator("#first-exceedance a")
    assert first.inner_text() == "hidden [step=0 tok=0:48 layer=3]"  # drift starts at layer 3
    page.screenshot(path=tmp_path / "comparison.png", full_page=True)

    # the pairs table: failing pairs first; sorted on the server by a column, both ways
    rel = {p["index"]: p["rel_l2"] for p in page.request.get(page.url + "?format=json").json()["pairs"]}
    table = page.locator("#pairs")
    assert (table.locator("tbody tr").first.get_attribute("class") or "").split()[0] == "row-fail"
    for direction in ("desc", "asc"):
        table.locator("th a", has_text="rel_l2").click()
        page.wait_for_url(re.compile(rf"sort=rel_l2&dir={direction}"))
        values = [rel[int(i)] for i in page.locator("#pairs tbody tr td:first-child").all_inner_texts()]
        assert len(values) == len(rel) and values == sorted(values, reverse=direction == "desc")

    # into one pair: per-token and per-head charts, histogram, worst elements
    page.locator("a.pair-link", has_text="attn.q [step=0 tok=0:48 layer=5]").click()
    page.wait_for_selector("#tokens-chart[data-rendered='1']")
    for chart in ("#heads-chart", "#hist-chart"):
        assert page.locator(chart).get_attribute("data-rendered") == "1"
    worst = page.locator("#worst tbody tr td:first-child").all_inner_texts()
    assert len(worst) == 20 and all(re.fullmatch(r"\[\d+, 5, \d+\]", w) for w in worst[:5])  # head 5 drifts
    page.screenshot(path=tmp_path / "pair.png", full_page=True)

    page.go_back()
    page.click("#acceptance-tab")
    page.wait_for_selector("#positions-chart[data-rendered='1']")
    assert page.locator("#histogram-chart").get_attribute("data-rendered") == "1"
    assert page.locator("#position-tests tbody tr").count() == 5
    assert "different" in page.locator("#position-tests").inner_text()
    page.screenshot(path=tmp_path / "acceptance.png", full_page=True)
    for name in ("comparison", "pair", "acceptance"):
        assert (tmp_path / f"{name}.png").stat().st_size > 10_000


def test_heatmap_cell_opens_its_pair(server: str, sample: Sample, page: Any) -> None:
    open_comparison(page, server, sample.names)
    # click the highlighted first-exceedance cell's centre via Plotly's own geometry
    box = page.evaluate(
        """() => {
          const gd = document.getElementById('heatmap');
          const f = JSON.parse(document.getElementById('heatmap-data').textContent).heatmap.first;
          const xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis, r = gd.getBoundingClientRect();
          return {x: r.left + xa._offset + xa.l2p(f.col), y: r.top + ya._offset + ya.l2p(f.row)};
        }"""
    )
    page.mouse.click(box["x"], box["y"])
    page.wait_for_url(re.compile(r"/pairs/\d+$"))
    assert page.locator("h1").inner_text() == "hidden [step=0 tok=0:48 layer=3]"


def test_no_page_requests_anything_outside_the_server(server: str, sample: Sample, page: Any) -> None:
    requests: list[str] = []
    errors: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    open_comparison(page, server, sample.names)
    comparison = page.url
    visited = [
        "/runs",
        "/runs?model=toy-llm-6l",
        f"/runs/{sample.names['ref']}",
        comparison.removeprefix(server),
        comparison.removeprefix(server) + "?metric=rel_l2",
        comparison.removeprefix(server) + "/pairs/0",
        comparison.removeprefix(server) + "/acceptance",
        "/runs/no-such-run",
    ]
    for path in visited:
        page.goto(server + path)
        page.wait_for_load_state("load")
    assert len(requests) > len(visited)
    outside = [u for u in requests if not (u == server or u.startswith(server + "/"))]
    assert outside == []
    assert any(u.split("?")[0].endswith("/static/plotly.min.js") for u in requests)
    assert [e for e in errors if "404" not in e] == []  # the unknown run's page is the one expected 404


def test_script_in_a_label_or_name_shows_as_text(server: str, sample: Sample, page: Any) -> None:
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    name = sample.names["xss"]
    page.goto(server + "/runs")
    row = page.locator("table.runs tbody tr", has_text="xss-")
    assert row.locator("td.name").inner_text() == name
    assert XSS in row.inner_text()
    assert row.locator("b, i, script").count() == 0
    page.get_by_role("link", name=name).click()
    assert page.locator("h1").inner_text() == name
    assert page.locator("main script:not([type='application/json'])").count() == 0
    assert page.get_by_text(XSS).count() >= 1
    # a comparison naming the run: the name is text in the header and in the chart labels' JSON
    page.goto(f"{server}/compare?a={sample.names['ref']}&b={name}")
    assert name in page.locator("h1").inner_text()
    assert page.locator("h1 i").count() == 0
    assert page.evaluate("window.__xss") is None
    assert dialogs == []
