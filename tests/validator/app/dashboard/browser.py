"""A real `validator serve` process and Debian's Chromium driven by Playwright (never `playwright install`)."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from tests.servers import validator_serve

CHROMIUM = os.environ.get("VALIDATOR_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def missing_browser() -> str | None:
    """Why the browser tests cannot run here, or None when they can."""
    if not (Path(CHROMIUM).is_file() and os.access(CHROMIUM, os.X_OK)):
        return f"{CHROMIUM} is missing: install Debian's chromium (apt-get install -y chromium)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed (pip install -e '.[test]')"
    return None


@contextlib.contextmanager
def serve(home: Path, log: Path) -> Iterator[str]:
    """`validator serve` on a free loopback port over the store at ``home``; yields its origin."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VALIDATOR_")}
    env["VALIDATOR_HOME"] = str(home)
    with validator_serve(env, log, timeout=30) as url:
        yield url


def browser_for_tests() -> Iterator[object]:
    """The body of a module-scoped ``browser`` fixture: Chromium, or the test skipped (with the reason) only
    where it is not installed; VALIDATOR_REQUIRE_BROWSER=1 (set by .ci/run) turns that into a failure.
    Module-scoped because Playwright's sync API holds an event loop on its thread, which must be gone before
    async (anyio) tests run."""
    import pytest

    why = missing_browser()
    if why:
        if os.environ.get("VALIDATOR_REQUIRE_BROWSER") == "1":
            pytest.fail(why)
        pytest.skip(why)
    with chromium() as b:
        yield b


@contextlib.contextmanager
def chromium() -> Iterator[object]:
    """A Playwright Browser on Debian's Chromium."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=shutil.which(CHROMIUM) or CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()
