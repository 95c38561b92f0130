"""/api/v1/admin: operations on the store itself (write token required)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from validator.app.api.deps import ServiceDep, WriteAuth
from validator.app.api.schemas import StoreCheck

router = APIRouter(prefix="/admin", tags=["admin"])


@router.post("/check", dependencies=[WriteAuth])
def check_store(svc: ServiceDep, quick: Annotated[bool, Query(description="sizes only, no hashing")] = False) -> StoreCheck:
    """Check the store (a POST: it reads every blob, so it needs the write token). What `validator check` reports: database integrity, every blob present with its size (and hash),
    no orphans, no leftovers of dead processes. ``ok`` is false when ``problems`` is not empty."""
    problems = svc.check_store(deep=not quick)
    return StoreCheck(ok=not problems, problems=problems)
