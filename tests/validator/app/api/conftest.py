from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from validator.app.api import create_app
from validator.service import Service
from validator.settings import Settings

TOKEN = "s3cret-token"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def api_settings(tmp_path: Path, db_url: str | None) -> Settings:
    return Settings(home=tmp_path / "home", database_url=db_url, tokens=(TOKEN,), max_upload_bytes=1 << 20)


@pytest.fixture
def api_service(api_settings: Settings) -> Iterator[Service]:
    svc = Service(api_settings)
    yield svc
    svc.close()


@pytest.fixture
async def client(api_service: Service) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(api_service.settings, service=api_service)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(
        transport=transport, base_url="http://test", headers={"Authorization": f"Bearer {TOKEN}"}
    ) as c:
        yield c
