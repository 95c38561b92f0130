"""Every mutating route rejects a missing or wrong token; reads are open unless protect_reads."""

from __future__ import annotations

import re
from dataclasses import replace

import httpx
import pytest

from validator.app.api import create_app
from validator.app.server import serve
from validator.errors import InputError

pytestmark = pytest.mark.anyio

MUTATING = {"POST", "PUT", "PATCH", "DELETE"}


def _routes(app) -> list[tuple[str, str]]:
    """Every (method, path) the app publishes in its OpenAPI schema."""
    return [(m.upper(), path) for path, ops in app.openapi()["paths"].items() for m in ops]


def _fill(path: str) -> str:
    return re.sub(r"\{(\w+)\}", lambda m: {"part": "p0", "filename": "part.json", "id": "1"}.get(m.group(1), "r"), path)


async def test_every_mutating_route_needs_the_token(api_service) -> None:
    app = create_app(api_service.settings, service=api_service)
    routes = _routes(app)
    mutating = [(m, p) for m, p in routes if m in MUTATING]
    assert len(mutating) >= 5, routes  # runs, upload, finalize, comparisons, gates
    transport = httpx.ASGITransport(app=app)
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic czNjcmV0LXRva2Vu"}):
        async with httpx.AsyncClient(transport=transport, base_url="http://t", headers=headers) as c:
            for method, path in mutating:
                r = await c.request(method, _fill(path), json={})
                assert r.status_code == 401, (method, path, headers, r.status_code)
            for method, path in routes:
                if method == "GET":
                    r = await c.request(method, _fill(path))
                    assert r.status_code != 401, (method, path)


async def test_protected_reads(api_service) -> None:
    svc = api_service
    object.__setattr__(svc, "settings", replace(svc.settings, protect_reads=True))
    app = create_app(svc.settings, service=svc)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        assert (await c.get("/api/v1/runs")).status_code == 401
        ok = await c.get("/api/v1/runs", headers={"Authorization": "Bearer s3cret-token"})
        assert ok.status_code == 200


def test_refuses_public_address_without_token(tmp_path) -> None:
    from validator.settings import Settings

    with pytest.raises(InputError, match="refusing to serve on 0.0.0.0 without a token"):
        serve(Settings(home=tmp_path), host="0.0.0.0", port=0)
