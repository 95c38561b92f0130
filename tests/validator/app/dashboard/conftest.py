from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.validator.app.dashboard import large
from tests.validator.app.dashboard.browser import browser_for_tests, serve
from tests.validator.app.dashboard.sample import build_store
from validator.app.api import create_app
from validator.numerics.warm import warm_up
from validator.service import Service
from validator.settings import Settings


@dataclass(frozen=True)
class Sample:
    home: Path
    names: dict[str, str]


@pytest.fixture(scope="session")
def sample(tmp_path_factory: pytest.TempPathFactory) -> Sample:
    """The sample store (tests/validator/app/dashboard/sample.py), built once; tests only add cached comparisons to it."""
    root = tmp_path_factory.mktemp("dashboard")
    return Sample(root / "home", build_store(root / "home", root / "bundles"))


@dataclass(frozen=True)
class Large:
    home: Path
    names: dict[str, str]
    comparison: int


@pytest.fixture(scope="session")
def large_store(tmp_path_factory: pytest.TempPathFactory) -> Large:
    """A stored comparison of 5,000 pairs (tests/validator/app/dashboard/large.py; about a minute to build)."""
    root = tmp_path_factory.mktemp("dashboard-large")
    names = large.build_store(root / "home", root / "bundles")
    return Large(root / "home", names, large.compare(root / "home", names))


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def dash_service(sample: Sample) -> Iterator[Service]:
    svc = Service(Settings(home=sample.home))
    yield svc
    svc.close()


@pytest.fixture
async def dash_client(dash_service: Service) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(dash_service.settings, service=dash_service)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as c:
        yield c


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Debian's Chromium under Playwright (``browser_for_tests``)."""
    yield from browser_for_tests()


@pytest.fixture(scope="module")
def server(browser: Any, sample: Sample, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real `validator serve` process over the sample store; yields its origin (http://127.0.0.1:PORT). The CPU
    engine is warmed first, as the README asks of a server's user (``validator warm``): a format's first
    comparison would otherwise compile it inside a page's 15 s."""
    warm_up()
    log = tmp_path_factory.mktemp("server") / "server.log"
    with serve(sample.home, log) as url:
        yield url


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1360, "height": 900})
    pg = context.new_page()
    pg.set_default_timeout(15000)
    yield pg
    context.close()


@pytest.fixture(scope="module")
def large_server(browser: Any, large_store: Large, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real `validator serve` process over the 5,000-pair store."""
    log = tmp_path_factory.mktemp("server-large") / "server.log"
    with serve(large_store.home, log) as url:
        yield url
