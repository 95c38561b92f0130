"""/api/v1/gates: the CI verdict. A decided verdict (pass, fail or inconclusive) is always HTTP 200."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException

from validator.app.api.deps import ServiceDep, WriteAuth
from validator.app.api.schemas import GateCreate, GatePublic

router = APIRouter(prefix="/gates", tags=["gates"])


@router.post("", dependencies=[WriteAuth])
def create_gate(body: GateCreate, svc: ServiceDep) -> GatePublic:
    from validator.judging.report import (
        markdown_summary,  # the report imports the comparison engine (torch): only when judging
    )

    rec = svc.cached_comparison(
        body.baseline, body.candidate, floor=(body.floor[0], body.floor[1]) if body.floor else None, policy=body.policy, background=False
    )
    if rec["status"] != "done" or rec["result"] is None:
        raise HTTPException(status_code=422, detail=f"comparison could not be computed: {rec['error']}")
    doc = rec["result"]
    return GatePublic(
        verdict=doc["verdict"],
        reasons=doc["reasons"],
        comparison_id=rec["id"],
        counts=doc["counts"],
        markdown=markdown_summary(doc),
        first_divergence=doc.get("first_divergence"),
        problem_nodes=doc.get("problem_nodes") or [],
    )
