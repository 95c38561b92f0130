"""The dashboard's HTML pages (GET only). Every page answers JSON too: the same URL with ``?format=json``.

    /                                   -> /runs
    /runs?model=&draft=&topology=&engine_commit=&label=K=V   runs, filtered by labels
    /runs/{ref}                         one run: manifest, tensors, acceptance and eval summaries
    /compare?a=&b=[&floor_a=&floor_b=]  -> 303 /comparisons/{id} (computed once, cached)
    /comparisons/{id}[?metric=&step=]   verdict, heatmap (worst step, or one step), first exceedance,
        [&page=&per_page=&sort=&dir=&status=&name=&where=]   and one page of the pairs table
    /comparisons/{id}/pairs/{i}         one pair: error per token, per head, histogram, worst elements
    /comparisons/{id}/acceptance        acceptance per position, histograms, tests; GSM8K flips
    /static/{file}                      the dashboard's CSS/JS and plotly.min.js (no CDN)

Reads follow the API's auth (a token when ``protect_reads``). Data from runs reaches the browser only
through autoescaped templates and ``<script type="application/json">`` blocks.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote, urlencode

from fastapi import APIRouter, Query, Request
from fastapi.responses import FileResponse, JSONResponse, RedirectResponse, Response
from jinja2 import Environment, FileSystemLoader, select_autoescape
from jinja2.utils import htmlsafe_json_dumps
from markupsafe import Markup

from validator._data import dashboards_dir
from validator.app.api.deps import ReadAuth, ServiceDep
from validator.app.dashboard import pages
from validator.app.dashboard.views import MAX_PER_PAGE, PER_PAGE, TableQuery
from validator.errors import InputError, NotFoundError, ValidatorError
from validator.judging.text import fmt_num
from validator.numerics.jsonsafe import json_safe

__all__ = ["router"]

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data: blob:; "
    "connect-src 'self'; font-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
HTML_HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"}

router = APIRouter(tags=["dashboard"], include_in_schema=False)  # pages take ReadAuth; static files are public


# -- assets -------------------------------------------------------------------------------------------


@functools.cache
def _assets() -> dict[str, Path]:
    out = {p.name: p for p in (dashboards_dir() / "static").glob("*") if p.suffix in (".css", ".js")}
    spec = importlib.util.find_spec("plotly")  # locates the package without importing it
    if spec is not None and spec.origin:
        js = Path(spec.origin).parent / "package_data" / "plotly.min.js"
        if js.is_file():
            out["plotly.min.js"] = js
    return out


@functools.cache
def _asset_version() -> str:
    h = hashlib.sha256()
    for name, p in sorted(_assets().items()):
        h.update(name.encode() + p.read_bytes() if name != "plotly.min.js" else str(p.stat().st_size).encode())
    return h.hexdigest()[:12]


@router.get("/static/{name}")
def static(name: str) -> FileResponse:
    path = _assets().get(name)
    if path is None:
        raise NotFoundError(f"no static file {name!r}" + (" (install plotly for charts)" if name == "plotly.min.js" else ""))
    return FileResponse(path, headers={"Cache-Control": "public, max-age=86400", "X-Content-Type-Options": "nosniff"})


# -- rendering ----------------------------------------------------------------------------------------


def _nulls(v: Any) -> Any:
    """For charts: non-finite floats (and the documents' 'inf'/'nan' strings stay strings) -> null."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {str(k): _nulls(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_nulls(x) for x in v]
    return v


def _script_json(v: Any) -> Markup:
    """JSON for a ``<script type="application/json">`` block: <, >, & and ' escaped as \\uXXXX."""
    return htmlsafe_json_dumps(_nulls(v), dumps=functools.partial(json.dumps, allow_nan=False))


def _fmt(v: Any, digits: int = 3) -> str:
    """Numbers as the CLI prints them (``text.fmt_num``), with ``digits`` significant digits."""
    return str(v) if isinstance(v, bool) else fmt_num(v, digits - 1)


def _excludes_zero(ci: Any) -> bool:
    """Whether an interval [lo, hi] of numbers lies entirely above or below zero."""
    lo, hi = (x if isinstance(x, (int, float)) else math.nan for x in ci)
    return bool(lo > 0 or hi < 0)


def _bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


@functools.cache
def _env() -> Environment:
    env = Environment(
        loader=FileSystemLoader(dashboards_dir() / "templates"),
        autoescape=select_autoescape(["html"], default=True),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(fmt=_fmt, bytes=_bytes, script_json=_script_json, excludes_zero=_excludes_zero)
    env.filters["q"] = lambda s: quote(str(s), safe="")
    env.filters["pretty"] = lambda v: json.dumps(json_safe(v, str_keys=True), indent=1, sort_keys=False)
    return env


def _url_with(request: Request, **changes: Any) -> str:
    """This page's path and query with some parameters replaced (None removes one)."""
    params = [(k, v) for k, v in request.query_params.multi_items() if k not in changes]
    params += [(k, str(v)) for k, v in changes.items() if v is not None]
    return f"{request.url.path}?{urlencode(params)}" if params else request.url.path


def _html(request: Request, template: str, data: dict[str, Any], *, status: int = 200) -> Response:
    base = request.scope.get("root_path", "").rstrip("/")
    html = _env().get_template(template).render(
        **data,
        page=data,
        base=base,
        asset_v=_asset_version(),
        json_url=_url_with(request, format="json"),
        url_with=functools.partial(_url_with, request),
    )
    return Response(html, status_code=status, media_type="text/html; charset=utf-8", headers=HTML_HEADERS)


def _error(request: Request, exc: ValidatorError) -> Response:
    if request.query_params.get("format") == "json":
        return JSONResponse({"detail": str(exc)}, status_code=exc.http_status)
    return _html(request, "error.html", {"message": str(exc), "status": exc.http_status}, status=exc.http_status)


def _page(request: Request, template: str, build: Callable[[], dict[str, Any]]) -> Response:
    try:
        data = build()
    except ValidatorError as exc:
        return _error(request, exc)
    if request.query_params.get("format") == "json":
        return JSONResponse(json_safe(data, str_keys=True))
    return _html(request, template, data)


# -- pages --------------------------------------------------------------------------------------------


@router.get("/", dependencies=[ReadAuth])
def home(request: Request) -> RedirectResponse:
    return RedirectResponse(request.scope.get("root_path", "").rstrip("/") + "/runs", status_code=307)


def _label_filters(request: Request) -> dict[str, str]:
    out = {k: v for k in pages.LABEL_KEYS if (v := request.query_params.get(k, "").strip())}
    for item in request.query_params.getlist("label"):
        if not item.strip():
            continue
        k, sep, v = item.strip().partition("=")
        if not sep or not k:
            raise InputError(f"label filter {item!r} must be KEY=VALUE")
        out[k] = v
    return out


@router.get("/runs", dependencies=[ReadAuth])
def runs_list(
    request: Request,
    svc: ServiceDep,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0)] = 0,
) -> Response:
    return _page(request, "runs.html", lambda: pages.runs_page(svc, labels=_label_filters(request), limit=limit, offset=offset))


@router.get("/runs/{ref:path}/rl-kl", dependencies=[ReadAuth])  # before /runs/{ref:path}, which would take it
def rl_kl(request: Request, ref: str, svc: ServiceDep, floor: float | None = None) -> Response:
    """A run's train/rollout KL per step (docs/rl.md): chart, verdict, table."""
    from validator.app.dashboard.rl_kl_view import kl_page
    from validator.judging.rl_kl import KLSettings

    def build() -> dict[str, Any]:
        try:
            settings = KLSettings(floor=floor)
        except ValueError as exc:
            raise InputError(str(exc)) from None
        return kl_page(ref, svc.rl_kl(ref, settings).to_dict())

    return _page(request, "rl_kl.html", build)


@router.get("/runs/{ref:path}", dependencies=[ReadAuth])  # :path: run names may hold '/'
def run_detail(ref: str, request: Request, svc: ServiceDep) -> Response:
    return _page(request, "run.html", lambda: pages.run_page(svc, ref))


@router.get("/compare", dependencies=[ReadAuth])
def compare(
    request: Request,
    svc: ServiceDep,
    a: str = "",
    b: str = "",
    floor_a: str = "",
    floor_b: str = "",
) -> Response:
    """Compute (once) and redirect to the comparison's permanent page."""
    try:
        if bool(floor_a) != bool(floor_b):
            raise InputError("a noise floor needs both runs: floor_a and floor_b")
        rec = pages.open_comparison(svc, a, b, (floor_a, floor_b) if floor_a else None)
    except ValidatorError as exc:
        return _error(request, exc)
    base = request.scope.get("root_path", "").rstrip("/")
    as_json = request.query_params.get("format") == "json"
    return RedirectResponse(f"{base}/comparisons/{rec['id']}" + ("?format=json" if as_json else ""), status_code=303)


@router.get("/comparisons/{id}", dependencies=[ReadAuth])
def comparison(
    id: int,
    request: Request,
    svc: ServiceDep,
    metric: str | None = None,
    step: str = "",
    page: Annotated[int, Query(ge=1)] = 1,
    per_page: Annotated[int, Query(ge=1, le=MAX_PER_PAGE)] = PER_PAGE,
    sort: str = "worst",
    dir: str = "desc",
    status: str = "all",
    name: str | None = None,
    where: str | None = None,
) -> Response:
    """The comparison; the pairs table is paged here, on the server (failing and worst pairs first)."""

    def build() -> dict[str, Any]:
        at = pages.parse_step(step)
        table = TableQuery(sort=sort, dir=dir, status=status, name=name or None, where=where or None, step=at,
                           page=page, per_page=per_page)
        full = request.query_params.get("format") == "json"
        return pages.comparison_page(svc, id, metric=metric or None, step=at, table=table, full=full)

    return _page(request, "comparison.html", build)


@router.get("/comparisons/{id}/pairs/{index}", dependencies=[ReadAuth])
def pair(id: int, index: int, request: Request, svc: ServiceDep) -> Response:
    return _page(request, "pair.html", lambda: pages.pair_page(svc, id, index))


@router.get("/rl/manifest-diff", dependencies=[ReadAuth])
def manifest_diff(request: Request, svc: ServiceDep, a: str, b: str) -> Response:
    """The weight-manifest diff of two stored runs, with rel_l2 of the changed tensors (docs/rl.md)."""
    from validator.judging.manifest_diff import diff_manifests
    from validator.runs.weight_manifest import manifest_of_view

    def build() -> dict[str, Any]:
        ma, mb = (manifest_of_view(svc.resolve(r, allow_paths=False)) for r in (a, b))
        return {"a": a, "b": b, "diff": diff_manifests(ma, mb).to_dict()}

    return _page(request, "manifest_diff.html", build)


@router.get("/comparisons/{id}/acceptance", dependencies=[ReadAuth])
def acceptance(id: int, request: Request, svc: ServiceDep) -> Response:
    return _page(request, "acceptance.html", lambda: pages.acceptance_page(svc, id))
