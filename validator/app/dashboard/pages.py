"""The data behind each dashboard page, gathered through :class:`validator.service.Service`.

Each function returns one JSON-able dict: the page renders it, and ``?format=json`` returns it as is
(non-finite floats as the strings 'nan' / 'inf'). Errors the user can act on are ValidatorErrors.
"""

from __future__ import annotations

import dataclasses
import threading
import weakref
from collections import OrderedDict
from typing import Any

from probes.core.shards import Coords
from validator.app.dashboard.drill import error_profile
from validator.app.dashboard.views import (
    METRICS,
    TableQuery,
    default_metric,
    first_exceedance,
    heatmap,
    pair_rows,
    pair_table,
    steps,
)
from validator.errors import InputError, NotFoundError
from validator.judging.text import acceptance_parting_line, frontier_lines
from validator.runs.reassembly import LogicalTensor, group_logical
from validator.service import Service
from validator.store.models import Run

__all__ = [
    "LABEL_KEYS",
    "runs_page",
    "run_page",
    "open_comparison",
    "comparison_page",
    "parse_step",
    "pair_page",
    "acceptance_page",
    "capture_order",
]

LABEL_KEYS = ("model", "draft", "topology", "engine_commit")  # the filters the runs list offers by name


def runs_page(svc: Service, *, labels: dict[str, str], limit: int = 100, offset: int = 0) -> dict[str, Any]:
    """Same shape as ``GET /api/v1/runs`` plus the filters applied (only complete runs are listed)."""
    runs = [{"status": "complete", **r.to_dict()} for r in svc.list_runs(labels=labels, limit=limit, offset=offset)]
    return {"data": runs, "count": len(runs), "limit": limit, "offset": offset, "filters": labels}


def _gsm8k_rows(svc: Service, run: Run) -> list[dict[str, Any]] | None:
    """A stored run's GSM8K probe rows (artifact kind 'gsm8k', the probe's JSONL), or None."""
    art = next((a for a in run.artifacts if a.kind == "gsm8k"), None)
    if art is None:
        return None
    from validator.runs.workload_files import load_gsm8k_rows

    return load_gsm8k_rows(svc.blobs.path(art.sha256))


def _gsm8k_summary(run: Run, rows: list[dict[str, Any]]) -> dict[str, Any]:
    from validator.judging.gsm8k_scoring import summarize_rows

    conc = run.label_dict().get("concurrency", "")
    s = summarize_rows(rows, total_time_s=0.0, concurrency=int(conc) if conc.isdigit() else 0)
    for k in ("output_tokens_per_s", "total_time_s", "concurrency"):  # not recoverable from the rows
        s.pop(k, None)
    return s


def run_page(svc: Service, ref: str) -> dict[str, Any]:
    """``run``: ``GET /api/v1/runs/{ref}``; ``acceptance``: ``GET /api/v1/runs/{ref}/acceptance`` (or None);
    ``evals``: per-eval summaries (``gsm8k``, from the stored probe rows)."""
    info = svc.show_run(ref)
    ref = str(info["id"])
    evals: dict[str, Any] = {}
    rows = _gsm8k_rows(svc, svc.get_run(ref))
    if rows is not None:
        evals["gsm8k"] = _gsm8k_summary(svc.get_run(ref), rows)
    return {"run": info, "acceptance": svc.acceptance_summary(ref), "evals": evals}


def open_comparison(svc: Service, a: str, b: str, floor: tuple[str, str] | None) -> dict[str, Any]:
    """The cached comparison of two stored runs (computed now, or queued when large)."""
    if not a or not b:
        raise InputError("choose two runs to compare: a (reference) and b (candidate)")
    return svc.cached_comparison(a, b, floor=floor)


def capture_order(svc: Service, run_name: str) -> dict[str, int]:
    """Logical tensor label -> rank in the order the run's records were written (its capture order).

    Kept per Service for a few runs (a stored run never changes): comparisons against one reference,
    as in CI, read its records once."""
    run = svc.get_run(run_name)
    with _cache_lock:
        entries = _orders.setdefault(svc, OrderedDict())
        hit = entries.get(run.id)
        if hit is not None:
            entries.move_to_end(run.id)
            return hit
    order: dict[str, int] = {}
    for ref in svc.stored_view(run).tensors:  # shards of one tensor share its label
        where = ref.coords.label()
        order.setdefault(f"{ref.name} [{where}]" if where else ref.name, len(order))
    with _cache_lock:
        entries[run.id] = order
        while len(entries) > CACHED_RUNS:
            entries.popitem(last=False)
    return order


# The comparison page's data derived from a done comparison, kept per Service (a few comparisons each):
# a done comparison never changes, and deriving it (reading a document of thousands of pairs and run A's
# capture order) costs far more than rendering one page of it.
CACHED_COMPARISONS = 4  # ~12 MB each at 5,000 pairs
CACHED_RUNS = 8
_cache_lock = threading.Lock()
_orders: weakref.WeakKeyDictionary[Service, OrderedDict[int, dict[str, int]]] = weakref.WeakKeyDictionary()


def _done(svc: Service, id: int) -> dict[str, Any]:
    rec = svc.get_comparison(id)
    if rec["status"] != "done" or rec["result"] is None:
        raise NotFoundError(f"comparison {id} is {rec['status']}, not done" + (f": {rec['error']}" if rec["error"] else ""))
    return rec


def _has_gsm8k(svc: Service, doc: dict[str, Any]) -> bool:
    if "gsm8k" in doc:
        return True
    return all(any(a.kind == "gsm8k" for a in svc.get_run(doc[s]).artifacts) for s in ("a", "b"))


def parse_step(text: str) -> int | None:
    """The ``step`` query parameter: empty or 'all' -> None (every step), else a step number."""
    text = text.strip()
    if text in ("", "all"):
        return None
    try:
        return int(text)
    except ValueError:
        raise InputError(f"step must be a step number or 'all', got {text!r}") from None


_HEAVY = ("pairs", "acceptance", "gsm8k")  # document sections the comparison page does not show
_MAP_KEYS = ("name", "coords", "label", "status", *METRICS)  # what the map needs of a pair


@dataclasses.dataclass
class _Prepared:
    summary: dict[str, Any]  # the comparison record, its document without the _HEAVY sections
    doc_pairs: list[dict[str, Any]]  # the document's pairs, only what the map needs (_MAP_KEYS)
    stored_first: dict[str, Any]  # the document's first_divergence and first_above_floor, when it holds them
    order: dict[str, int]
    rows: list[dict[str, Any]]
    first: dict[str, Any] | None
    frontier: list[str]  # text.frontier_lines of the document, after the first divergence (which the page links)
    steps: list[dict[str, int]]
    acceptance_view: bool
    heatmaps: dict[tuple[str, int | None], dict[str, Any]] = dataclasses.field(default_factory=dict)

    def heatmap(self, metric: str, step: int | None) -> dict[str, Any]:
        key = (metric, step)
        if key not in self.heatmaps:
            doc = {"pairs": self.doc_pairs, **self.stored_first}
            self.heatmaps[key] = heatmap(doc, metric=metric, order=self.order, step=step)
        return self.heatmaps[key]


_cache: weakref.WeakKeyDictionary[Service, OrderedDict[int, _Prepared]] = weakref.WeakKeyDictionary()


def _prepare(svc: Service, rec: dict[str, Any]) -> _Prepared:
    doc = rec["result"]
    pairs = doc.get("pairs", [])
    if all(isinstance(p.get("capture_index"), int) for p in pairs):  # comparisons since JUDGING_VERSION 3
        order = {p["label"]: p["capture_index"] for p in pairs}
    else:
        order = capture_order(svc, doc["a"]) if pairs else {}
    return _Prepared(
        summary={**rec, "result": {k: v for k, v in doc.items() if k not in _HEAVY}},
        doc_pairs=[{k: p[k] for k in _MAP_KEYS if k in p} for p in doc.get("pairs", [])],
        stored_first={k: doc[k] for k in ("first_divergence", "first_above_floor") if k in doc},
        order=order,
        rows=pair_rows(doc),
        first=first_exceedance(doc, order),
        frontier=[line for line in frontier_lines(doc) if not line.startswith("first divergence:")],  # the page says it
        steps=steps(doc),
        acceptance_view="acceptance" in doc or _has_gsm8k(svc, doc),
    )


def _prepared(svc: Service, id: int) -> _Prepared | dict[str, Any]:
    """The derived data of a done comparison (cached), or the record of one that is not done."""
    with _cache_lock:
        entries = _cache.setdefault(svc, OrderedDict())
        hit = entries.get(id)
        if hit is not None:
            entries.move_to_end(id)
            return hit
    rec = svc.get_comparison(id)
    if rec["status"] != "done" or rec["result"] is None:
        return rec
    prepared = _prepare(svc, rec)
    with _cache_lock:
        entries[id] = prepared
        while len(entries) > CACHED_COMPARISONS:
            entries.popitem(last=False)
    return prepared


def comparison_page(
    svc: Service,
    id: int,
    *,
    metric: str | None = None,
    step: int | None = None,
    table: TableQuery | None = None,
    full: bool = True,
) -> dict[str, Any]:
    """``GET /api/v1/comparisons/{id}`` plus the heatmap (every step's worst, or one ``step``), the first
    exceedance (the stored first divergence), the frontier's lines (``frontier``: first divergence, problem
    nodes, downstream, where acceptance first parts), the steps, every pair's row (``pairs``) and one page of
    the pairs table (``table``).

    ``full=False`` (the HTML page) leaves out what the page does not show: ``comparison.result`` without
    its pairs, acceptance and GSM8K sections, and no ``pairs``.
    """
    got = _prepared(svc, id)
    if isinstance(got, dict):
        return {"comparison": got}
    doc = got.summary["result"]
    metric = metric or default_metric(doc)
    if metric not in METRICS:
        raise InputError(f"metric must be one of {', '.join(METRICS)}, got {metric!r}")
    if step is not None and not any(s["step"] == step for s in got.steps):
        raise InputError(f"comparison {id} has no pairs at step {step}")
    query = table or TableQuery()
    if query.step != step:
        query = dataclasses.replace(query, step=step)
    bad = query.problems()
    if bad:
        raise InputError("; ".join(bad))
    first = got.first
    out: dict[str, Any] = {
        "comparison": svc.get_comparison(id) if full else got.summary,
        "metric": metric,
        "step": step,
        "steps": got.steps,
        "heatmap": got.heatmap(metric, step),
        "first": first,
        "first_pair": got.rows[first["index"]] if first else None,
        "frontier": got.frontier,
        "table": pair_table(got.rows, query, metric=metric),
        "acceptance_view": got.acceptance_view,
    }
    if full:
        out["pairs"] = got.rows
    return out


def _logical(svc: Service, run_name: str, pair: dict[str, Any]) -> LogicalTensor | None:
    view = svc.stored_view(svc.get_run(run_name))
    key = (pair["name"], Coords.from_dict(pair["coords"]).identity())
    shards = [r for r in view.tensors if r.name == key[0] and r.coords.identity() == key[1]]  # not the whole run
    return group_logical(shards).get(key)


def _profile(svc: Service, names: tuple[str, str], pair: dict[str, Any]) -> dict[str, Any] | str:
    la, lb = _logical(svc, names[0], pair), _logical(svc, names[1], pair)
    if la is None or lb is None:
        return f"{pair['label']} is not in both {names[0]!r} and {names[1]!r}"
    ta, tb = la.materialize(), lb.materialize()
    if tuple(ta.shape) != tuple(tb.shape):
        return f"shape mismatch: A {list(ta.shape)} vs B {list(tb.shape)}"
    return error_profile(ta, tb).to_dict()


def pair_page(svc: Service, id: int, index: int) -> dict[str, Any]:
    """One pair of a comparison: where inside the tensor A and B differ (and the noise floor pair does)."""
    rec = _done(svc, id)
    doc = rec["result"]
    pairs = doc["pairs"]
    if not 0 <= index < len(pairs):
        raise NotFoundError(f"comparison {id} has {len(pairs)} pairs; there is no pair {index}")
    pair = pairs[index]
    profile = _profile(svc, (doc["a"], doc["b"]), pair)
    floor_profile: dict[str, Any] | str | None = None
    if doc.get("floor"):
        floor_profile = _profile(svc, (doc["floor"][0], doc["floor"][1]), pair)
    tokens = (pair.get("coords") or {}).get("tokens")
    return {
        "comparison_id": id,
        "index": index,
        "count": len(pairs),
        "a": doc["a"],
        "b": doc["b"],
        "floor": doc.get("floor"),
        "pair": pair,
        "token_offset": tokens[0] if tokens else 0,
        "profile": profile if isinstance(profile, dict) else None,
        "error": profile if isinstance(profile, str) else None,
        "floor_profile": floor_profile if isinstance(floor_profile, dict) else None,
        "floor_error": floor_profile if isinstance(floor_profile, str) else None,
    }


def _gsm8k_comparison(svc: Service, doc: dict[str, Any]) -> dict[str, Any] | None:
    if "gsm8k" in doc:
        return dict(doc["gsm8k"])
    try:
        ra, rb = (_gsm8k_rows(svc, svc.get_run(doc[s])) for s in ("a", "b"))
    except InputError as exc:  # rows stored in a form this page cannot read: say so, keep the page
        return {"error": str(exc)}
    if ra is None or rb is None:
        return None
    from validator.judging.gsm8k_scoring import compare_gsm8k

    out = compare_gsm8k(ra, rb, names=(doc["a"], doc["b"]), max_listed=0)
    out.pop("table", None)
    return out


def acceptance_page(svc: Service, id: int) -> dict[str, Any]:
    """The comparison's acceptance section (validator.judging.acceptance), where acceptance first parts
    beside where the tensors do (``parting``, ``tensor_parting``) and, when both runs hold GSM8K results, the
    questions whose correctness flipped."""
    rec = _done(svc, id)
    doc = rec["result"]
    acc = doc.get("acceptance")
    front = acc.get("frontier") if isinstance(acc, dict) else None
    first = doc.get("first_divergence")
    return {
        "comparison_id": id,
        "a": doc["a"],
        "b": doc["b"],
        "verdict": doc["verdict"],
        "acceptance": acc,
        # where acceptance and greedy output first part, beside where the tensors did
        "parting": acceptance_parting_line(front) if isinstance(front, dict) else None,
        "tensor_parting": f"tensors first part at {first['where']}" if first else None,
        "gsm8k": _gsm8k_comparison(svc, doc),
    }
