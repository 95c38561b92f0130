"""/api/v1/comparisons: computed once per inputs and cached; large ones run in the background."""

from __future__ import annotations

from fastapi import APIRouter, Response

from validator.app.api.deps import ReadAuth, ServiceDep, WriteAuth
from validator.app.api.schemas import ComparisonCreate, ComparisonPublic

router = APIRouter(prefix="/comparisons", tags=["comparisons"])


@router.post("", dependencies=[WriteAuth], responses={202: {"description": "accepted, computing in the background"}})
def create_comparison(body: ComparisonCreate, svc: ServiceDep, response: Response) -> ComparisonPublic:
    rec = svc.cached_comparison(
        body.a, body.b, floor=(body.floor[0], body.floor[1]) if body.floor else None, policy=body.policy, background=body.background
    )
    response.status_code = 200 if rec["status"] in ("done", "error") else 202
    return ComparisonPublic(**rec)


@router.get("/{id}", dependencies=[ReadAuth])
def get_comparison(id: int, svc: ServiceDep) -> ComparisonPublic:
    return ComparisonPublic(**svc.get_comparison(id))
