"""/api/v1/runs: create (pending), upload files, finalize, list, get, tensors."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Annotated, Any

import anyio
import anyio.from_thread
from fastapi import APIRouter, Query, Request

from validator.app.api.deps import ReadAuth, ServiceDep, WriteAuth
from validator.app.api.schemas import RunCreate, RunPublic, RunsPublic, UploadStatus
from validator.errors import NotFoundError
from validator.service import uploads
from validator.settings import parse_labels

router = APIRouter(prefix="/runs", tags=["runs"])


async def _next(stream: AsyncIterator[bytes]) -> bytes:
    return await stream.__anext__()




@router.post("", status_code=201, dependencies=[WriteAuth])
def create_run(body: RunCreate, svc: ServiceDep) -> RunPublic:
    """Create a pending run to upload bundle files into; it becomes visible on finalize."""
    r = uploads.create_pending(svc, name=body.name, labels=body.labels)
    return RunPublic(id=r["id"], name=r["name"], status=r["status"], labels=body.labels)


@router.get("", dependencies=[ReadAuth])
def list_runs(
    svc: ServiceDep,
    label: Annotated[list[str], Query(description="KEY=VALUE, repeatable")] = [],  # noqa: B006
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0)] = 0,
) -> RunsPublic:
    labels = parse_labels(label)
    runs = svc.list_runs(labels=labels, limit=limit, offset=offset)
    total = svc.count_runs(labels=labels)
    return RunsPublic(data=[RunPublic(**r.to_dict()) for r in runs], count=len(runs), total=total, limit=limit, offset=offset)


@router.get("/{ref}", dependencies=[ReadAuth])
def get_run(ref: str, svc: ServiceDep) -> dict[str, Any]:
    """The run's summary, manifest, artifacts and tensor inventory."""
    return svc.show_run(ref)


@router.get("/{ref}/tensors", dependencies=[ReadAuth])
def run_tensors(ref: str, svc: ServiceDep) -> dict[str, Any]:
    return {"data": svc.show_run(ref)["tensors"]}


@router.get("/{ref}/acceptance", dependencies=[ReadAuth])
def run_acceptance(ref: str, svc: ServiceDep) -> dict[str, Any]:
    """Acceptance summary of a run: per-position rates (conditional and vLLM-style), histogram, accept length."""
    summary = svc.acceptance_summary(ref)
    if summary is None:
        raise NotFoundError(f"run {ref!r} holds no acceptance records")
    return summary


@router.get("/{ref}/files/{part}/{filename}", dependencies=[ReadAuth])
def upload_status(ref: str, part: str, filename: str, svc: ServiceDep) -> UploadStatus:
    """How much of a file has arrived (for resuming an interrupted upload)."""
    return UploadStatus(**uploads.upload_status(svc, run=ref, part=part, filename=filename))


@router.put("/{ref}/files/{part}/{filename}", dependencies=[WriteAuth])
async def upload_file(
    ref: str,
    part: str,
    filename: str,
    request: Request,
    svc: ServiceDep,
    offset: Annotated[int, Query(ge=0)] = 0,
    final: bool = True,
    sha256: Annotated[str | None, Query(pattern="^[0-9a-f]{64}$")] = None,
) -> UploadStatus:
    """Stream one bundle file (part ``_root`` holds manifest.json). Retrying the same content is a no-op;
    ``offset``/``final`` resume a file in pieces; ``sha256`` is checked when given."""
    stream: AsyncIterator[bytes] = request.stream().__aiter__()

    def chunks() -> Iterator[bytes]:
        while True:
            try:
                chunk: bytes = anyio.from_thread.run(_next, stream)
            except StopAsyncIteration:
                return
            if chunk:
                yield chunk

    def work() -> dict[str, Any]:
        return uploads.upload_file(
            svc, run=ref, part=part, filename=filename, chunks=chunks(), offset=offset, final=final, expect_sha256=sha256
        )

    return UploadStatus(**await anyio.to_thread.run_sync(work))


@router.post("/{ref}/finalize", dependencies=[WriteAuth])
def finalize(ref: str, svc: ServiceDep) -> RunPublic:
    """Validate the uploaded bundle and make the run visible (atomic)."""
    return RunPublic(**uploads.finalize(svc, run=ref).to_dict())
