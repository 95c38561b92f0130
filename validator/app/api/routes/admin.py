"""/api/v1/admin: operations on the store itself (write token required)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from pydantic import BaseModel

from validator.app.api.deps import ServiceDep, WriteAuth
from validator.app.api.schemas import StoreCheck
from validator.service.expiry import MAX_AGE_HOURS

router = APIRouter(prefix="/admin", tags=["admin"])


@router.post("/check", dependencies=[WriteAuth])
def check_store(svc: ServiceDep, quick: Annotated[bool, Query(description="sizes only, no hashing")] = False) -> StoreCheck:
    """Check the store (a POST: it reads every blob, so it needs the write token). What `validator check` reports: database integrity, every blob present with its size (and hash),
    no orphans, no leftovers of dead processes. ``ok`` is false when ``problems`` is not empty."""
    problems = svc.check_store(deep=not quick)
    return StoreCheck(ok=not problems, problems=problems)


class Collection(BaseModel):
    """What ``POST /admin/gc`` removed."""

    expired_runs: list[str]
    blobs: int
    bytes: int
    staging_files: int
    foreign: list[str]  # entries of the local blob directory that are not blobs (left alone; `validator check` lists them)


@router.post("/gc", dependencies=[WriteAuth])
def collect_garbage(
    svc: ServiceDep,
    older_than_hours: Annotated[
        float | None, Query(ge=0, le=MAX_AGE_HOURS, description="expiry age for this collection (default: the server's setting)")
    ] = None,
) -> Collection:
    """What `validator gc` does: expire pending runs abandoned for longer than the expiry age (deleted with their
    uploads), delete every blob nothing references and staging leftovers. Safe while uploads run."""
    return Collection(**svc.collect(full=True, older_than_hours=older_than_hours).to_dict())
