"""Request and response bodies of the JSON API (v1)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

__all__ = [
    "RunCreate",
    "RunPublic",
    "RunsPublic",
    "UploadStatus",
    "ComparisonCreate",
    "ComparisonPublic",
    "GateCreate",
    "GatePublic",
]


class RunCreate(BaseModel):
    name: str = Field(min_length=1, max_length=200)
    labels: dict[str, str] = Field(default_factory=dict)


class RunPublic(BaseModel):
    id: int
    name: str
    status: str = "complete"
    created_at: str = ""
    labels: dict[str, str] = Field(default_factory=dict)
    n_tensors: int = 0
    total_bytes: int = 0
    source: str = ""


class RunsPublic(BaseModel):
    data: list[RunPublic]
    count: int = Field(description="runs on this page")
    total: int = Field(description="runs matching the filters, all pages together")
    limit: int
    offset: int


class UploadStatus(BaseModel):
    complete: bool
    received: int
    sha256: str | None = None
    created: bool | None = None


class ComparisonCreate(BaseModel):
    a: str = Field(description="reference run (name or id)")
    b: str = Field(description="candidate run (name or id)")
    floor: list[str] | None = Field(default=None, min_length=2, max_length=2, description="noise-floor pair")
    policy: dict[str, Any] | None = Field(default=None, description="policy document (the TOML file's content as JSON)")
    background: bool | None = None


class ComparisonPublic(BaseModel):
    id: int
    status: str
    verdict: str | None
    request: dict[str, Any]
    error: str | None = None
    result: dict[str, Any] | None = None


class GateCreate(BaseModel):
    baseline: str
    candidate: str
    floor: list[str] | None = Field(default=None, min_length=2, max_length=2)
    policy: dict[str, Any] | None = None


class GatePublic(BaseModel):
    verdict: str
    reasons: list[str]
    comparison_id: int
    counts: dict[str, int]
    markdown: str
    first_divergence: dict[str, Any] | None = Field(
        default=None, description="the first failing pair in data-flow order (docs/policy.md), or null"
    )
    problem_nodes: list[dict[str, Any]] = Field(
        default_factory=list, description="failing pairs none of whose upstream pairs fails, the first divergence first"
    )


class StoreCheck(BaseModel):
    ok: bool
    problems: list[str]
