"""The HTTP face: a FastAPI app built by :func:`create_app` from a :class:`Settings` object."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from validator.app.api.routes import admin, comparisons, dashboard, gates, rl, runs
from validator.errors import ValidatorError
from validator.service import Service
from validator.settings import Settings

__all__ = ["create_app"]

API_PREFIX = "/api/v1"


_UPLOAD_PATH = re.compile(API_PREFIX + r"/runs/[^/]+/files/[^/]+/[^/]+")


class _BodyCap:
    """Caps every request body but a file upload's (streamed to disk, capped by max_upload_bytes) at
    ``limit()`` bytes: whatever its Content-Type (FastAPI parses a body without one as JSON), and
    whether it declares a Content-Length or arrives chunked without one. Over the cap: 413."""

    def __init__(self, app: ASGIApp, limit: Callable[[], int]) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or (scope["method"] == "PUT" and _UPLOAD_PATH.fullmatch(scope["path"])):
            await self.app(scope, receive, send)
            return
        limit = self.limit()
        n = dict(scope["headers"]).get(b"content-length")
        too_big = n is not None and (not n.isdigit() or int(n) > limit)
        body = bytearray()
        more = not too_big
        while more:
            msg = await receive()
            if msg["type"] != "http.request":  # the client went away
                return
            body += msg.get("body", b"")
            more = msg.get("more_body", False)
            too_big = len(body) > limit
            if too_big:
                break
        if too_big:
            await JSONResponse(status_code=413, content={"detail": f"request body over {limit} bytes"})(scope, receive, send)
            return
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if sent:
                return await receive()
            sent = True
            return {"type": "http.request", "body": bytes(body), "more_body": False}

        await self.app(scope, replay, send)


def create_app(settings: Settings, *, service: Service | None = None) -> FastAPI:
    svc = service or Service(settings)
    if service is None:  # a server starting: put right what a crash of the previous one left behind
        svc.recover()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        if service is None:
            svc.close()

    # No /docs or /redoc: FastAPI's pages load their assets from a CDN, and this server works offline.
    app = FastAPI(
        title="validator", version="1", lifespan=lifespan, openapi_url="/openapi.json", docs_url=None, redoc_url=None
    )
    app.state.service = svc

    @app.exception_handler(ValidatorError)
    async def _validator_error(_: Request, exc: ValidatorError) -> JSONResponse:
        return JSONResponse(status_code=exc.http_status, content={"detail": str(exc)})

    @app.exception_handler(RequestValidationError)
    async def _invalid_request(_: Request, exc: RequestValidationError) -> JSONResponse:
        # FastAPI's default echoes each bad input back, and a JSON body's 1e999 (inf) cannot be
        # encoded again: a 500. Say where and what, without the value.
        errors = [{k: e[k] for k in ("type", "loc", "msg") if k in e} for e in exc.errors()]
        return JSONResponse(status_code=422, content={"detail": errors})

    app.add_middleware(_BodyCap, limit=lambda: svc.settings.max_json_bytes)

    @app.get(API_PREFIX + "/health", tags=["health"])
    def health() -> dict[str, str]:
        return {"status": "ok"}

    for r in (runs.router, comparisons.router, gates.router, rl.router, admin.router):
        app.include_router(r, prefix=API_PREFIX)
    app.include_router(dashboard.router)  # HTML pages at /, /runs, /comparisons/... (docs/dashboard.md)
    return app
