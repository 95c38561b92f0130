"""Shared dependencies: the service and bearer-token checks."""

from __future__ import annotations

import secrets
from typing import Annotated

from fastapi import Depends, HTTPException, Request

from validator.service import Service

__all__ = ["ServiceDep", "WriteAuth", "ReadAuth", "get_service"]


def get_service(request: Request) -> Service:
    svc: Service = request.app.state.service
    return svc


def _token_ok(request: Request) -> bool:
    tokens = request.app.state.service.settings.tokens
    if not tokens:
        return True  # no tokens configured: only allowed on loopback (checked when the server starts)
    auth = request.headers.get("authorization", "")
    scheme, _, token = auth.partition(" ")
    if scheme.lower() != "bearer" or not token:
        return False
    return any(secrets.compare_digest(token.encode(), t.encode()) for t in tokens)


def require_write(request: Request) -> None:
    if not _token_ok(request):
        raise HTTPException(status_code=401, detail="a valid bearer token is required", headers={"WWW-Authenticate": "Bearer"})


def require_read(request: Request) -> None:
    if request.app.state.service.settings.protect_reads and not _token_ok(request):
        raise HTTPException(status_code=401, detail="a valid bearer token is required", headers={"WWW-Authenticate": "Bearer"})


ServiceDep = Annotated[Service, Depends(get_service)]
WriteAuth = Depends(require_write)
ReadAuth = Depends(require_read)
