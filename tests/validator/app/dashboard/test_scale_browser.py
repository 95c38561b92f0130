"""The 5,000-pair comparison page in a real browser (Debian's Chromium) against a real `validator serve`:
it loads small, draws one map cell per capture point and layer, pages the table, and drills in by step,
by cell and into a pair."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from tests.validator.app.dashboard import large
from tests.validator.app.dashboard.conftest import Large

MAX_PAGE_BYTES = 300_000


def _rows(page: Any) -> list[str]:
    return [str(t) for t in page.locator("#pairs tbody tr td.mono a.pair-link").all_inner_texts()]


def _statuses(page: Any) -> list[str]:
    return [str(t) for t in page.locator("#pairs tbody tr td:nth-child(2) .status").all_inner_texts()]


def _click_cell(page: Any, row: str, col: str) -> None:
    """Click the drift map's cell (row, col) at its centre, through Plotly's own geometry."""
    box = page.evaluate(
        """([row, col]) => {
          const gd = document.getElementById('heatmap');
          const h = JSON.parse(document.getElementById('heatmap-data').textContent).heatmap;
          const xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis, r = gd.getBoundingClientRect();
          return {x: r.left + xa._offset + xa.l2p(h.cols.indexOf(col)), y: r.top + ya._offset + ya.l2p(h.rows.indexOf(row))};
        }""",
        [row, col],
    )
    page.mouse.click(box["x"], box["y"])


def test_a_5000_pair_comparison_in_the_browser(large_server: str, large_store: Large, page: Any, tmp_path: Path) -> None:
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    url = f"{large_server}/comparisons/{large_store.comparison}"
    response = page.goto(url)
    assert response.status == 200 and len(response.body()) < MAX_PAGE_BYTES
    page.wait_for_selector("#heatmap[data-rendered='1']")
    page.screenshot(path=tmp_path / "comparison-5000.png", full_page=True)

    # the map: 5 capture points x (8 stages + 93 layers), no per-cell labels printed over each other
    grid = page.evaluate(
        "() => { const t = document.getElementById('heatmap').data[1]; return [t.z.length, t.z[0].length, t.texttemplate]; }"
    )
    assert grid == [5, large.STAGES + large.LAYERS, ""]

    # the table: 100 rows, the failing ones first; paged on the server
    assert len(_rows(page)) == 100 and set(_statuses(page)) == {"fail"}
    assert page.locator(".pager .page-of").first.inner_text() == "page 1 of 50"
    first_page = _rows(page)
    page.locator("a.page-next").first.click()
    page.wait_for_url(re.compile(r"page=2"))
    assert page.locator(".pager .page-of").first.inner_text() == "page 2 of 50"
    second = _rows(page)
    assert len(second) == 100 and not set(second) & set(first_page)
    assert set(_statuses(page)) == {"fail"}
    page.locator("a.page-next").first.click()
    page.wait_for_url(re.compile(r"page=3"))
    assert _statuses(page)[:9] == ["fail"] * 8 + ["inconclusive"]  # 208 failing pairs: 100 + 100 + 8
    page.locator("a.page-prev").first.click()
    page.wait_for_url(re.compile(r"page=2"))
    assert _rows(page) == second
    page.locator("#status-filter a", has_text="pass").click()
    page.wait_for_url(re.compile(r"status=pass"))
    assert set(_statuses(page)) == {"pass"} and len(_rows(page)) == 100

    # one step: the selector redraws the map and lists only that step's pairs
    page.goto(url)
    page.select_option("#step-select", "13")
    page.wait_for_url(re.compile(r"step=13"))
    page.wait_for_selector("#heatmap[data-rendered='1']")
    assert all("step=13 " in r for r in _rows(page))
    assert "step 13 only" in page.locator(".map-help").inner_text().lower()

    # back to every step: a cell of 16 steps lists them, worst first; a pair opens from there
    page.goto(url)
    page.wait_for_selector("#heatmap[data-rendered='1']")
    _click_cell(page, "hidden", "layer 85")
    page.wait_for_url(re.compile(r"name=hidden&where=layer\+85"))
    rows = _rows(page)
    assert len(rows) == 16 and sorted(rows) == sorted(f"hidden [step={s} layer=85]" for s in range(16))
    assert _statuses(page)[:4] == ["fail"] * 4 and set(_statuses(page)[4:]) <= {"pass", "inconclusive"}
    page.locator("a.pair-link").first.click()
    page.wait_for_url(re.compile(r"/pairs/\d+$"))
    page.wait_for_selector("#tokens-chart[data-rendered='1']")
    assert re.fullmatch(r"hidden \[step=1[2-5] layer=85\]", page.locator("h1").inner_text())
    assert errors == []
