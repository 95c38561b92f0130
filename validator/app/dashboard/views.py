"""What the dashboard's comparison page shows, computed from a comparison document (pure, no I/O).

- the heatmap: one row per capture point (tensor name), one column per place in the model (layer, and
  any extra coordinates such as a PP stage); a cell holding several pairs (other steps, requests or
  token ranges) shows the worst of them, or only one step's pairs (``step``);
- the first point, in data-flow order (``validator.judging.frontier``: step, then capture order), where the
  drift exceeds what the policy allows: the comparison's first divergence, read from its document (computed
  by the frontier's rules only for documents written before comparisons stored it, and for one step's
  map); when nothing fails, the first point above 1x the floor;
- the rows of the pairs table, and one page of them (:func:`pair_table`: filtered, sorted, failing and
  worst first by default), so that a page never carries thousands of rows.

Capture order is the order in which run A's records were written (each pair's ``capture_index``, or
``order``: pair label -> rank, for older documents); without it, pairs are ordered by layer, then name.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from validator.judging.frontier import Node, first_above_floor, first_failing, nodes_from_doc
from validator.judging.text import judged_cell
from validator.numerics.jsonsafe import json_safe

__all__ = [
    "METRICS",
    "SORTS",
    "STATUS_FILTERS",
    "PER_PAGE",
    "MAX_PER_PAGE",
    "TableQuery",
    "default_metric",
    "column_of",
    "heatmap",
    "first_exceedance",
    "pair_rows",
    "pair_table",
    "steps",
    "finite",
]

METRICS = {
    "rel_l2": "relative L2 (||B - A|| / ||A||)",
    "floor_ratio": "rel_l2 / noise floor's rel_l2",
    "limit_ratio": "rel_l2 / threshold applied",
}
_BAD = ("fail", "error")
STATUS_RANK = {"error": 0, "fail": 1, "inconclusive": 2, "pass": 3}  # the order of "worst first"
STATUS_FILTERS: dict[str, tuple[str, ...] | None] = {
    "all": None,
    "failing": _BAD,
    "fail": ("fail",),
    "error": ("error",),
    "inconclusive": ("inconclusive",),
    "pass": ("pass",),
}
# the pairs table's sort keys: "worst" (failing first, then the largest value of the page's metric), the
# numeric columns, and the text columns
NUMERIC_SORTS = ("index", "status", "step", "rel_l2", "cosine", "max_abs", "floor_rel_l2", "limit", "threshold",
                 "floor_ratio", "limit_ratio", "sqnr_db")
TEXT_SORTS = ("label", "where")
SORTS = ("worst", *NUMERIC_SORTS, *TEXT_SORTS)
PER_PAGE, MAX_PER_PAGE = 100, 1000


def finite(v: Any) -> float | None:
    """A number for a chart: floats and ints as float, anything else (None, 'inf', 'nan') as None."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(v) else None


def _num(v: Any) -> float | None:
    """Like :func:`finite` but keeping infinities ('inf' strings from stored documents too)."""
    if v == "inf":
        return math.inf
    if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v):
        return None
    return float(v)


def default_metric(doc: Mapping[str, Any]) -> str:
    return "floor_ratio" if doc.get("floor") else "rel_l2"


def _natural(v: Any) -> tuple[int, float, str]:
    s = str(v)
    try:
        return (0, float(s), s)
    except ValueError:
        return (1, 0.0, s)


def column_of(coords: Mapping[str, Any]) -> tuple[tuple[Any, ...], str]:
    """(sort key, label) of a pair's place in the model: its layer and extra coordinates."""
    layer = coords.get("layer")
    extra = coords.get("extra") or {}
    parts = ([f"layer {layer}"] if layer is not None else []) + [f"{k}={v}" for k, v in sorted(extra.items())]
    key = (layer is not None, layer if layer is not None else -1, tuple((k, _natural(v)) for k, v in sorted(extra.items())))
    return key, " · ".join(parts) or "—"


def _order_key(p: Mapping[str, Any], order: Mapping[str, int] | None) -> tuple[Any, ...]:
    """The heatmap's row order: capture order (``capture_index``, else ``order``), then step, layer, name."""
    coords = p.get("coords") or {}
    fallback = (coords.get("step") or 0, coords.get("layer") if coords.get("layer") is not None else -1, p["name"], p["label"])
    rank = p.get("capture_index")
    if not isinstance(rank, int) and order is not None:
        rank = order.get(p["label"])
    if isinstance(rank, int):
        return (0, rank, *fallback)
    return (1, 0, *fallback)


def first_exceedance(doc: Mapping[str, Any], order: Mapping[str, int] | None = None) -> dict[str, Any] | None:
    """The comparison's first divergence (``kind`` 'limit'); when no pair fails, the first pair above its
    noise floor (``kind`` 'floor'). ``index`` is the pair's index in ``doc['pairs']``. Read from the document
    (``first_divergence``, ``first_above_floor``); a document written before comparisons stored them gets
    them computed by the same rules (``judging.frontier``, ``order`` standing in for capture indices)."""
    if "first_divergence" in doc:
        first = doc["first_divergence"]
        if first:
            return {"index": first["index"], "label": first["label"], "kind": "limit", "status": first["status"],
                    "where": first.get("where"), "reasons": first.get("reasons", [])}
        above = doc.get("first_above_floor")
        if above:
            return {"index": above["index"], "label": above["label"], "kind": "floor", "status": above["status"],
                    "where": above.get("where"), "floor_ratio": _num(above.get("floor_ratio"))}
        return None
    return _first(nodes_from_doc(doc.get("pairs", []), order))


def _first(nodes: list[Node]) -> dict[str, Any] | None:
    """``first_exceedance`` of these nodes, by ``judging.frontier``'s rules."""
    n = first_failing(nodes)
    if n is not None:
        return {"index": n.index, "label": n.label, "kind": "limit", "status": n.status, "reasons": list(n.reasons)}
    n = first_above_floor(nodes)
    if n is not None:
        return {"index": n.index, "label": n.label, "kind": "floor", "status": n.status, "floor_ratio": n.floor_ratio}
    return None


def _fmt(v: float | None) -> str:
    if v is None:
        return "-"
    if math.isinf(v):
        return "inf"
    return f"{v:.3g}"


def _step(p: Mapping[str, Any]) -> int | None:
    step = (p.get("coords") or {}).get("step")
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def steps(doc: Mapping[str, Any]) -> list[dict[str, int]]:
    """The steps the pairs come from, for the step selector: ``step``, its ``pairs`` and ``failing`` pairs."""
    count: dict[int, list[int]] = {}
    for p in doc.get("pairs", []):
        s = _step(p)
        if s is not None:
            c = count.setdefault(s, [0, 0])
            c[0] += 1
            c[1] += p["status"] in _BAD
    return [{"step": s, "pairs": c[0], "failing": c[1]} for s, c in sorted(count.items())]


def heatmap(
    doc: Mapping[str, Any], *, metric: str, order: Mapping[str, int] | None = None, step: int | None = None
) -> dict[str, Any]:
    """The grid: ``z`` holds log10 of the metric (None: no pair there, or no value), ``value`` the metric,
    ``pair`` the index into ``doc['pairs']`` a cell opens, ``status`` its pair's status, ``step`` its step,
    ``count`` how many pairs the cell holds and ``fails`` how many of them fail. ``first`` marks the
    comparison's first exceedance (:func:`first_exceedance`, read from ``doc`` when it holds it); with
    ``step``, only that step's pairs are drawn, and ``first`` is the first exceedance among them."""
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {', '.join(METRICS)}, got {metric!r}")
    pairs = [(i, p) for i, p in enumerate(doc.get("pairs", [])) if step is None or _step(p) == step]
    row_rank: dict[str, tuple[Any, ...]] = {}
    cols: dict[str, tuple[Any, ...]] = {}
    col_of: list[str] = []  # each pair's column label, in the order of ``pairs``
    for _, p in pairs:
        k = _order_key(p, order)
        if p["name"] not in row_rank or k < row_rank[p["name"]]:
            row_rank[p["name"]] = k
        key, label = column_of(p.get("coords") or {})
        cols[label] = key
        col_of.append(label)
    rows = sorted(row_rank, key=lambda n: row_rank[n])
    col_labels = sorted(cols, key=lambda c: cols[c])
    ri = {n: i for i, n in enumerate(rows)}
    ci = {c: i for i, c in enumerate(col_labels)}
    shape = (len(rows), len(col_labels))
    value: list[list[float | None]] = [[None] * shape[1] for _ in range(shape[0])]
    cell_pair: list[list[int | None]] = [[None] * shape[1] for _ in range(shape[0])]
    count = [[0] * shape[1] for _ in range(shape[0])]
    fails = [[0] * shape[1] for _ in range(shape[0])]
    status: list[list[str | None]] = [[None] * shape[1] for _ in range(shape[0])]
    cell_step: list[list[int | None]] = [[None] * shape[1] for _ in range(shape[0])]
    held: dict[tuple[int, int], tuple[bool, float]] = {}
    for (i, p), label in zip(pairs, col_of):
        r, c = ri[p["name"]], ci[label]
        count[r][c] += 1
        fails[r][c] += p["status"] in _BAD
        v = _num(p.get(metric))
        badness = (p["status"] in _BAD, v if v is not None else -math.inf)
        if (r, c) not in held or badness > held[r, c]:
            held[r, c] = badness
            value[r][c], cell_pair[r][c], status[r][c], cell_step[r][c] = v, i, p["status"], _step(p)
    positive = [v for row in value for v in row if v is not None and 0 < v < math.inf]
    lo = math.log10(min(positive)) if positive else 0.0
    hi = math.log10(max(positive)) if positive else 0.0
    zero_z = lo - 1.0  # bitwise-equal cells sit one decade below the smallest difference
    z: list[list[float | None]] = []
    text: list[list[str]] = []
    for r in range(shape[0]):
        zr: list[float | None] = []
        tr: list[str] = []
        for c in range(shape[1]):
            v = value[r][c]
            if v is None:
                zr.append(None)
            elif v == 0:
                zr.append(zero_z)
            elif math.isinf(v):
                zr.append(hi + 1.0)
            else:
                zr.append(math.log10(v))
            tr.append("" if cell_pair[r][c] is None else _fmt(v))
        z.append(zr)
        text.append(tr)
    if step is None:
        first = first_exceedance(doc, order)
    else:
        nodes = nodes_from_doc(doc.get("pairs", []), order)
        first = _first([nodes[i] for i, _ in pairs])
    mark = None
    if first is not None:
        p = doc["pairs"][first["index"]]
        mark = {**first, "row": ri[p["name"]], "col": ci[column_of(p.get("coords") or {})[1]]}
    return {
        "metric": metric,
        "metric_label": METRICS[metric],
        "rows": rows,
        "cols": col_labels,
        "z": z,
        "value": [[json_safe(v) for v in row] for row in value],
        "text": text,
        "pair": cell_pair,
        "count": count,
        "fails": fails,
        "status": status,
        "step": cell_step,
        "steps": step,
        "first": mark,
        "center": 0.0 if metric in ("floor_ratio", "limit_ratio") else None,  # log10(1): the diverging scale's middle
    }


def pair_rows(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per pair for the sortable table (numbers as floats or None; 'inf' kept as inf)."""
    out = []
    for i, p in enumerate(doc.get("pairs", [])):
        m = p.get("metrics") or {}
        out.append(
            {
                "index": i,
                "label": p["label"],
                "name": p["name"],
                "where": column_of(p.get("coords") or {})[1],
                "step": _step(p),
                "status": p["status"],
                "rel_l2": _num(p.get("rel_l2")),
                "cosine": _num(p.get("cosine")),
                "max_abs": _num(p.get("max_abs")),
                "threshold": _num(p.get("threshold")),
                "floor_rel_l2": _num(p.get("floor_rel_l2")),
                "floor_kind": p.get("floor_kind"),
                "judged": judged_cell(p),
                "limit": p.get("limit"),
                "limit_unit": "x" if p.get("judged") == "x floor" else "",
                "borderline": bool(p.get("borderline")),
                "pooled_pass": bool(p.get("pooled_pass")),  # inconclusive alone, settled by its pooled unit
                "floor_ratio": _num(p.get("floor_ratio")),
                "limit_ratio": _num(p.get("limit_ratio")),
                "sqnr_db": _num(m.get("sqnr_db")),
                "shape": p.get("shape_a") or [],
                "reasons": p.get("reasons") or [],
                "notes": p.get("notes") or [],
            }
        )
    return out


@dataclass(frozen=True)
class TableQuery:
    """Which page of the pairs table to show: filters (``status``, one of STATUS_FILTERS; ``name``: a
    capture point; ``where``: a heatmap column; ``step``), the sort (one of SORTS, ``dir`` 'asc' or
    'desc'; "worst" puts errors, then failures, then inconclusive pairs first, each by the largest value
    of the page's metric) and the page (from 1; one past the last shows the last)."""

    sort: str = "worst"
    dir: str = "desc"
    status: str = "all"
    name: str | None = None
    where: str | None = None
    step: int | None = None
    page: int = 1
    per_page: int = PER_PAGE

    def problems(self) -> list[str]:
        out = []
        if self.sort not in SORTS:
            out.append(f"sort must be one of {', '.join(SORTS)}, got {self.sort!r}")
        if self.dir not in ("asc", "desc"):
            out.append(f"dir must be asc or desc, got {self.dir!r}")
        if self.status not in STATUS_FILTERS:
            out.append(f"status must be one of {', '.join(STATUS_FILTERS)}, got {self.status!r}")
        if self.page < 1:
            out.append(f"page must be 1 or more, got {self.page}")
        if not 1 <= self.per_page <= MAX_PER_PAGE:
            out.append(f"per_page must be between 1 and {MAX_PER_PAGE}, got {self.per_page}")
        return out


def _sorted(rows: list[dict[str, Any]], sort: str, desc: bool, metric: str) -> list[dict[str, Any]]:
    if sort == "worst":
        def worst(r: dict[str, Any]) -> tuple[int, float, int]:
            v = r.get(metric)
            return (STATUS_RANK.get(r["status"], 9), -v if v is not None else math.inf, r["index"])

        return sorted(rows, key=worst)
    if sort == "status":
        return sorted(rows, key=lambda r: (STATUS_RANK.get(r["status"], 9), r["index"]), reverse=desc)
    if sort in TEXT_SORTS:
        return sorted(rows, key=lambda r: (str(r[sort]).lower(), r["index"]), reverse=desc)
    have = [r for r in rows if r.get(sort) is not None]
    missing = [r for r in rows if r.get(sort) is None]  # rows without a value stay last either way
    return sorted(have, key=lambda r: r[sort], reverse=desc) + missing  # a stable sort: ties keep their order


def pair_table(rows: list[dict[str, Any]], query: TableQuery, *, metric: str) -> dict[str, Any]:
    """One page of ``rows`` (:func:`pair_rows`), with what the table's controls need: ``total`` rows,
    ``matched`` by the filters, ``pages``, ``start``/``end`` (1-based, inclusive; 0 when nothing matches)
    and ``status_counts`` (matches of each status filter under the other filters)."""
    bad = query.problems()
    if bad:
        raise ValueError("; ".join(bad))
    others = [
        r
        for r in rows
        if (query.name is None or r["name"] == query.name)
        and (query.where is None or r["where"] == query.where)
        and (query.step is None or r["step"] == query.step)
    ]
    status_counts = {k: sum(1 for r in others if v is None or r["status"] in v) for k, v in STATUS_FILTERS.items()}
    wanted = STATUS_FILTERS[query.status]
    matched = [r for r in others if wanted is None or r["status"] in wanted]
    pages = max(1, -(-len(matched) // query.per_page))
    page = min(query.page, pages)
    start = (page - 1) * query.per_page
    shown = _sorted(matched, query.sort, query.dir == "desc", metric)[start : start + query.per_page]
    return {
        "rows": shown,
        "total": len(rows),
        "matched": len(matched),
        "page": page,
        "pages": pages,
        "per_page": query.per_page,
        "start": start + 1 if shown else 0,
        "end": start + len(shown),
        "sort": query.sort,
        "dir": query.dir,
        "status": query.status,
        "name": query.name,
        "where": query.where,
        "step": query.step,
        "metric": metric,
        "status_counts": status_counts,
    }
