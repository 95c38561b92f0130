"""/api/v1/rl: the RL gates (docs/rl.md). The train/rollout KL verdict of logprob records, and the diff of two
weight manifests. Both compute from the body alone (nothing is stored) and answer the document the CLI's
``--json`` prints; a decided verdict is always HTTP 200, bad input 400 naming the record or tensor."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Depends, HTTPException, Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, Field

from validator.app.api.deps import ReadAuth, ServiceDep, WriteAuth
from validator.errors import InputError
from validator.service.cycle_collector import cycle_collector_paused

router = APIRouter(prefix="/rl", tags=["rl"])


async def _no_duplicate_keys(request: Request) -> None:
    """422 when the JSON body names a key twice in one object: FastAPI keeps the last value silently, so
    ``{"train_logprob": -1.0, "train_logprob": -9.0}`` would be judged on -9.0 (runs/jsonlines.py refuses the same in
    files). The body is the one FastAPI has read and parsed already."""
    from validator.runs.jsonlines import DuplicateKeyError, check_unique

    body = await request.body()
    try:
        value = await request.json()
        check_unique(body.decode(), value)
    except DuplicateKeyError as exc:
        raise RequestValidationError([{"type": "json_duplicate_key", "loc": ("body",), "msg": f"{exc}: the request "
                                       "body must name each key once per object"}]) from None
    except ValueError:  # not JSON, or not UTF-8: FastAPI's own body validation answers it
        return


UniqueKeys = Depends(_no_duplicate_keys)

# Records a POSTed KL gate may carry: the body cap (``max_json_bytes``, 1 MiB by default) holds about 11,000;
# this bounds the work (linear in the records) and memory also where that cap is raised. Files of any size
# go through ``validator rl kl`` (docs/rl.md, docs/reliability.md).
MAX_KL_RECORDS = 1_000_000


class KLGate(BaseModel):
    records: list[Any] = Field(description="logprob records, one object per sampled token (docs/rl.md)")
    floor: float | None = Field(default=None, description="declared floor of the k3 step mean; default: estimated")
    floor_steps: int = 5
    tolerance: float = 1.5
    variation: Literal["measured", "sampling"] = Field(
        default="measured",
        description="with an estimated floor: 'measured' judges steps by their sampling error and the run's own "
        "step-to-step variation; 'sampling' by sampling error alone (docs/rl.md)",
    )


class ManifestGate(BaseModel):
    a: dict[str, Any] = Field(description="reference manifest (docs/rl.md, 'Weight manifests')")
    b: dict[str, Any] = Field(description="candidate manifest")
    lora_b: list[str] | None = Field(default=None, description="name globs of LoRA B factors")


def _kl_response(doc: dict[str, Any]) -> Response:
    """The document encoded by orjson (``judging.report.dumps``): FastAPI's encoder takes 40 us a step."""
    from validator.judging.report import dumps

    return Response(content=dumps(doc), media_type="application/json")


@router.post("/kl", dependencies=[WriteAuth, UniqueKeys], response_model=dict[str, Any])
def kl_gate(body: KLGate) -> Response:
    from validator.judging.exit_codes import VERDICT_EXIT
    from validator.judging.rl_kl import KLSettings, kl_report
    from validator.runs.logprob_records import records_from_objects

    if len(body.records) > MAX_KL_RECORDS:
        raise HTTPException(
            status_code=413,
            detail=f"{len(body.records):,} records; POST /api/v1/rl/kl judges at most {MAX_KL_RECORDS:,} "
            "(use validator rl kl on a file, or store the run and GET /api/v1/rl/runs/{run}/kl)",
        )
    try:
        settings = KLSettings(floor=body.floor, floor_steps=body.floor_steps, tolerance=body.tolerance,
                              variation=body.variation)
    except ValueError as exc:
        raise InputError(str(exc)) from None
    with cycle_collector_paused():  # thousands of step dicts: no repeated full walks of them
        doc = kl_report(records_from_objects(body.records, source="records"), settings).to_dict()
    doc["exit_code"] = VERDICT_EXIT[doc["verdict"]]
    return _kl_response(doc)


@router.get("/runs/{ref:path}/kl", dependencies=[ReadAuth], response_model=dict[str, Any])
def stored_kl(
    ref: str,
    svc: ServiceDep,
    floor: float | None = None,
    floor_steps: int = 5,
    tolerance: float = 1.5,
    variation: Literal["measured", "sampling"] = "measured",
) -> Response:
    """The KL verdict of a stored run's logprob records (a bundle part's logprobs.jsonl); 404 without them."""
    from validator.judging.exit_codes import VERDICT_EXIT
    from validator.judging.rl_kl import KLSettings

    try:
        settings = KLSettings(floor=floor, floor_steps=floor_steps, tolerance=tolerance, variation=variation)
    except ValueError as exc:
        raise InputError(str(exc)) from None
    with cycle_collector_paused():
        doc = svc.rl_kl(ref, settings).to_dict()
    doc["exit_code"] = VERDICT_EXIT[doc["verdict"]]
    return _kl_response(doc)


@router.get("/manifest-diff", dependencies=[ReadAuth])
def stored_manifest_diff(a: str, b: str, svc: ServiceDep, numeric: bool = False) -> dict[str, Any]:
    """The manifest diff of two stored runs' tensors (their recorded SHA256); ``numeric``: also rel_l2 of the
    changed tensors (loads them)."""
    from validator.judging.manifest_diff import diff_manifests
    from validator.runs.weight_manifest import manifest_of_view

    d = diff_manifests(manifest_of_view(svc.resolve(a, allow_paths=False)), manifest_of_view(svc.resolve(b, allow_paths=False)),
                       numeric=numeric)
    doc = d.to_dict()
    doc["exit_code"] = d.exit_code
    return doc


@router.post("/manifest-diff", dependencies=[WriteAuth, UniqueKeys])
def manifest_gate(body: ManifestGate) -> dict[str, Any]:
    from validator.judging.manifest_diff import DEFAULT_LORA_B, diff_manifests
    from validator.runs.weight_manifest import manifest_from_dict

    d = diff_manifests(
        manifest_from_dict(body.a, source="a"),
        manifest_from_dict(body.b, source="b"),
        lora_b=tuple(body.lora_b) if body.lora_b else DEFAULT_LORA_B,
        numeric=False,
    )
    doc = d.to_dict()
    doc["exit_code"] = d.exit_code
    return doc
