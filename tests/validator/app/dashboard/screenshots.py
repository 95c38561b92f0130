"""Screenshots of the dashboard's main views over the sample store (``scripts/screenshots`` runs this).

    python -m tests.validator.app.dashboard.screenshots [OUT_DIR]     # default docs/screenshots
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

from tests.validator.app.dashboard.browser import chromium, missing_browser, serve
from tests.validator.app.dashboard.sample import build_store

VIEWPORT = {"width": 1360, "height": 900}


def open_comparison(page: Any, url: str, names: dict[str, str]) -> None:
    """From the runs list: pick A, B and the floor pair, press Compare, wait for the heatmap."""
    page.goto(url + "/runs")
    page.get_by_label(f"A: {names['ref']}", exact=True).check()
    page.get_by_label(f"B: {names['drift']}", exact=True).check()
    page.get_by_label("floor A").select_option(names["ref"])
    page.get_by_label("floor B").select_option(names["rerun"])
    page.click("#compare-button")
    page.wait_for_selector("#heatmap[data-rendered='1']")


def take(out: Path, work: Path) -> list[Path]:
    """Build the sample store under ``work``, serve it, and write one PNG per main view into ``out``."""
    names = build_store(work / "home", work / "bundles", xss=False)
    out.mkdir(parents=True, exist_ok=True)
    shots = []
    with serve(work / "home", work / "server.log") as url, chromium() as browser:
        page = browser.new_page(viewport=VIEWPORT)  # type: ignore[attr-defined]
        page.goto(url + "/runs")
        shots.append(out / "runs.png")
        page.screenshot(path=shots[-1], clip={"x": 0, "y": 0, "width": VIEWPORT["width"], "height": 440})
        open_comparison(page, url, names)
        shots.append(out / "comparison.png")
        page.set_viewport_size({"width": VIEWPORT["width"], "height": 1300})
        page.screenshot(path=shots[-1])
        page.set_viewport_size(VIEWPORT)
        page.locator("a.pair-link", has_text="attn.q [step=0 tok=0:48 layer=5]").click()  # one with heads
        page.wait_for_selector("#tokens-chart[data-rendered='1']")
        shots.append(out / "pair.png")
        page.screenshot(path=shots[-1], full_page=True)
        page.go_back()
        page.click("#acceptance-tab")
        page.wait_for_selector("#positions-chart[data-rendered='1']")
        for summary in page.locator("#flips tbody tr:first-child summary").all():
            summary.click()  # show both outputs of the first flipped question
        shots.append(out / "acceptance.png")
        page.screenshot(path=shots[-1], full_page=True)
        page.goto(url + "/runs/" + names["drift"])
        shots.append(out / "run.png")
        page.screenshot(path=shots[-1])
    return shots


def main(argv: list[str]) -> int:
    why = missing_browser()
    if why:
        print(f"scripts/screenshots: {why}", file=sys.stderr)
        return 2
    out = Path(argv[0] if argv else "docs/screenshots")
    with tempfile.TemporaryDirectory(prefix="validator-shots-") as tmp:
        for p in take(out, Path(tmp)):
            print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
