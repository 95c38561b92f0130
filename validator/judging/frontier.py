"""The divergence frontier: where two runs first part, in data-flow order, and which failures are causes.

Pure (no I/O, no torch): it works on :class:`Node`, the few fields of a pair it needs, built from a
comparison's :class:`~validator.judging.compare.PairResult` (``compare_runs`` stores the result with the
comparison) or from a stored comparison document's pairs (:func:`nodes_from_doc`, for documents written
before the frontier was stored). The definition is the one in docs/policy.md, "The divergence frontier":

- **data-flow order**: by step (pairs without a step first), then run A's capture order within the step
  (``capture_index``; pairs without one after those with one), then layer, name and label;
- a pair **fails** when its status is ``fail`` or ``error``;
- a pair's **upstream** is every pair before it in that order that belongs to its request or to no request
  (a pair without a ``request`` coordinate is upstream of every later pair, and every earlier pair is
  upstream of it); pairs of other requests are never upstream: one request's values do not feed another's;
- the **first divergence** is the first failing pair in that order; the **problem nodes** are the failing
  pairs none of whose upstream pairs fails (the first divergence is one); every other failing pair is
  **downstream**: it may only inherit an error from an upstream failure.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Node",
    "Frontier",
    "FAILING",
    "nodes_from_doc",
    "flow_key",
    "flow_order",
    "divergence_frontier",
    "first_failing",
    "first_above_floor",
    "where",
]

FAILING = ("fail", "error")


@dataclass(frozen=True)
class Node:
    """One pair as the frontier sees it. ``index``: its place in the comparison's pairs (the document's
    ``pairs``, which the dashboard's pair pages number); ``floor_ratio``: rel_l2 over its floor's, if any."""

    index: int
    name: str
    label: str
    coords: Mapping[str, Any]
    status: str
    capture_index: int | None = None
    floor_ratio: float | None = None
    reasons: tuple[str, ...] = ()

    @property
    def failing(self) -> bool:
        return self.status in FAILING

    @property
    def step(self) -> int | None:
        return _int(self.coords.get("step"))

    @property
    def layer(self) -> int | None:
        return _int(self.coords.get("layer"))

    @property
    def request(self) -> str | None:
        r = self.coords.get("request")
        return None if r is None else str(r)

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "label": self.label,
            "name": self.name,
            "where": where(self),
            "coords": dict(self.coords),
            "status": self.status,
            "reasons": list(self.reasons),
        }


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _ratio(v: Any) -> float | None:
    """A floor ratio from a document ('inf' as written by ``numerics.jsonsafe.json_safe``) or a pair (a float)."""
    if v == "inf":
        return math.inf
    if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v):
        return None
    return float(v)


def nodes_from_doc(pairs: Sequence[Mapping[str, Any]], order: Mapping[str, int] | None = None) -> list[Node]:
    """Nodes of a comparison document's pairs. ``order`` (label -> rank in run A's capture order) stands in
    for ``capture_index`` where a pair lacks it (documents written before comparisons stored it)."""
    out = []
    for i, p in enumerate(pairs):
        ci = _int(p.get("capture_index"))
        if ci is None and order is not None:
            ci = order.get(p["label"])
        out.append(
            Node(
                index=i,
                name=p["name"],
                label=p["label"],
                coords=p.get("coords") or {},
                status=p["status"],
                capture_index=ci,
                floor_ratio=_ratio(p.get("floor_ratio")),
                reasons=tuple(p.get("reasons") or ()),
            )
        )
    return out


def flow_key(n: Node) -> tuple[Any, ...]:
    """The sort key of data-flow order: step (none first), capture order within it, layer, name, label."""
    step, layer = n.step, n.layer
    return (
        step is not None,
        step if step is not None else 0,
        n.capture_index is None,
        n.capture_index if n.capture_index is not None else 0,
        layer is not None,
        layer if layer is not None else 0,
        n.name,
        n.label,
    )


def flow_order(nodes: Iterable[Node]) -> list[Node]:
    return sorted(nodes, key=flow_key)


def first_failing(nodes: Iterable[Node]) -> Node | None:
    """The first failing node in data-flow order (the first divergence of these nodes), or None."""
    return min((n for n in nodes if n.failing), key=flow_key, default=None)


def first_above_floor(nodes: Iterable[Node]) -> Node | None:
    """The first node in data-flow order whose rel_l2 is above its floor's (ratio > 1), failing or not."""
    return min((n for n in nodes if n.floor_ratio is not None and n.floor_ratio > 1), key=flow_key, default=None)


def where(n: Node) -> str:
    """'target.k layer 1, step 0, request q000': the capture point and the place, for people (the token
    range is in the pair's label)."""
    c = n.coords
    parts = [n.name + (f" layer {n.layer}" if n.layer is not None else "")]
    if n.step is not None:
        parts.append(f"step {n.step}")
    if n.request is not None:
        parts.append(f"request {n.request}")
    extra = c.get("extra") or {}
    parts += [f"{k}={v}" for k, v in sorted(extra.items())]
    return ", ".join(parts)


@dataclass(frozen=True)
class Frontier:
    """A comparison's frontier (the module docstring defines it). ``downstream`` counts the failing pairs
    that are not problem nodes by capture point and layer, the largest groups first."""

    first_divergence: Node | None
    problem_nodes: tuple[Node, ...]
    downstream: tuple[tuple[str, int | None, int], ...]  # (name, layer, pairs)
    above_floor: Node | None = None

    @property
    def downstream_pairs(self) -> int:
        return sum(n for _, _, n in self.downstream)

    def to_dict(self) -> dict[str, Any]:
        """The document's ``first_divergence``, ``problem_nodes``, ``downstream`` and ``first_above_floor``."""
        above = self.above_floor
        return {
            "first_divergence": self.first_divergence.to_dict() if self.first_divergence else None,
            "problem_nodes": [n.to_dict() for n in self.problem_nodes],
            "downstream": {
                "pairs": self.downstream_pairs,
                "groups": [{"name": name, "layer": layer, "pairs": count} for name, layer, count in self.downstream],
            },
            "first_above_floor": None
            if above is None
            else {"index": above.index, "label": above.label, "where": where(above), "status": above.status,
                  "floor_ratio": "inf" if above.floor_ratio == math.inf else above.floor_ratio},
        }


def divergence_frontier(nodes: Iterable[Node]) -> Frontier:
    """The frontier of a comparison's pairs, in one pass over them in data-flow order."""
    ordered = flow_order(nodes)
    failed_requests: set[str] = set()
    shared_failed = False  # a failing pair without a request: upstream of everything after it
    any_failed = False
    problems: list[Node] = []
    groups: dict[tuple[str, int | None], list[int]] = {}  # (name, layer) -> [pairs, first place in the order]
    for place, n in enumerate(ordered):
        if not n.failing:
            continue
        req = n.request
        upstream_failed = any_failed if req is None else (shared_failed or req in failed_requests)
        if upstream_failed:
            g = groups.setdefault((n.name, n.layer), [0, place])
            g[0] += 1
        else:
            problems.append(n)
        any_failed = True
        if req is None:
            shared_failed = True
        else:
            failed_requests.add(req)
    down = sorted(groups.items(), key=lambda kv: (-kv[1][0], kv[1][1]))
    return Frontier(
        first_divergence=problems[0] if problems else None,
        problem_nodes=tuple(problems),
        downstream=tuple((name, layer, g[0]) for (name, layer), g in down),
        above_floor=first_above_floor(ordered),
    )
