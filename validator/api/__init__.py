"""The HTTP face: a FastAPI app built by :func:`create_app` from a :class:`Settings` object."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from ..config import Settings
from ..errors import ValidatorError
from ..service import Service
from .routes import comparisons, dashboard, gates, runs

__all__ = ["create_app"]

API_PREFIX = "/api/v1"


def create_app(settings: Settings, *, service: Service | None = None) -> FastAPI:
    svc = service or Service(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        if service is None:
            svc.close()

    app = FastAPI(title="validator", version="1", lifespan=lifespan, openapi_url="/openapi.json")
    app.state.service = svc

    @app.exception_handler(ValidatorError)
    async def _validator_error(_: Request, exc: ValidatorError) -> JSONResponse:
        return JSONResponse(status_code=exc.http_status, content={"detail": str(exc)})

    @app.middleware("http")
    async def _json_size_cap(request: Request, call_next):  # type: ignore[no-untyped-def]
        if request.headers.get("content-type", "").startswith("application/json"):
            n = request.headers.get("content-length")
            if n is not None and (not n.isdigit() or int(n) > svc.settings.max_json_bytes):
                return JSONResponse(status_code=413, content={"detail": f"JSON body over {svc.settings.max_json_bytes} bytes"})
        return await call_next(request)

    @app.get(API_PREFIX + "/health", tags=["health"])
    def health() -> dict[str, str]:
        return {"status": "ok"}

    for r in (runs.router, comparisons.router, gates.router):
        app.include_router(r, prefix=API_PREFIX)
    app.include_router(dashboard.router)  # HTML pages at /, /runs, /comparisons/... (docs/dashboard.md)
    return app
