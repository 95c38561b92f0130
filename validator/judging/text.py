"""Plain-text formatting that the CLI, the comparison report and the dashboard share: numbers as the CLI
prints them, aligned tables, and a comparison document's verdict (headline, floor, judged value and limit). Imports nothing heavy, so commands that only list or show runs stay fast."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from decimal import ROUND_CEILING, ROUND_FLOOR, ROUND_HALF_EVEN, Decimal
from typing import Any

__all__ = [
    "fmt_num",
    "fmt_interval",
    "fmt_judged",
    "format_rows",
    "headline",
    "counts_line",
    "pair_status",
    "floor_cell",
    "judged_cell",
    "limit_cell",
    "counted",
    "frontier_note",
    "frontier_lines",
    "acceptance_parting_line",
]


def fmt_num(v: Any, digits: int = 3) -> str:
    if v is None:
        return "-"
    if isinstance(v, str):
        return v
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return f"{v:.{digits + 1}g}"
    return str(v)


def fmt_interval(lo: Any, hi: Any, digits: int = 3, *, limit: Any = None) -> str:
    """'[1.5004, 1.66]': an interval as every report prints it, each end rounded **outward** to ``digits``
    significant digits (the lower end down, the upper end up), so the printed interval, read back, always
    contains the computed one. With ``limit`` (the bound the value was held to), an end that rounding would carry onto or
    across the limit gets more digits, so the text reads as the verdict was decided: a failing interval's
    lower end shows above the limit (``lo > limit``), a passing one's upper end at or below it. Non-finite
    ends print as 'inf', '-inf', 'nan'; strings (a JSON document's non-finite numbers) print as they are."""
    bound = _finite(limit)
    return f"[{_rounded(lo, digits, ROUND_FLOOR, bound)}, {_rounded(hi, digits, ROUND_CEILING, bound)}]"


def fmt_judged(x: Any, digits: int = 3, *, limit: Any = None) -> str:
    """A judged value beside its limit: ``x`` to ``digits`` significant digits (the nearest), with more digits
    where rounding would carry it onto or across ``limit`` (1.5004 against 1.5 prints '1.5004', not '1.5')."""
    return _rounded(x, digits, ROUND_HALF_EVEN, _finite(limit))


def _finite(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def _rounded(x: Any, digits: int, rounding: str, limit: float | None) -> str:
    """``x`` rounded to ``digits`` significant digits by ``rounding`` (ROUND_FLOOR: down), with more digits (up
    to 20, past any double's precision) while the rounded value lands on the other side of ``limit``."""
    if not isinstance(x, (int, float)) or isinstance(x, bool) or not math.isfinite(x):
        return fmt_num(float(x) if isinstance(x, (int, float)) else x)
    exact = Decimal(repr(float(x)))  # the shortest text of the double: its rounding, read back, is on the right side
    if exact == 0:
        return "0"
    text = ""
    for sig in range(max(digits, 1), 21):
        q = exact.quantize(Decimal(1).scaleb(exact.adjusted() - sig + 1), rounding=rounding)
        text = f"{float(q):.{sig}g}"
        if limit is None or not _crossed(x, float(text), limit):
            break
    return text


def _crossed(x: float, shown: float, limit: float) -> bool:
    """Whether the printed ``shown`` is on the other side of ``limit`` than ``x``, as verdicts compare: above
    the limit fails (``> limit``), at or below it is within."""
    return x > limit >= shown or x <= limit < shown


def format_rows(header: list[str], rows: list[list[str]]) -> str:
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(header)]
    out = ["  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip(), "  ".join("-" * w for w in widths)]
    out += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join(out)


# -- a comparison document's verdict, as the CLI, the Markdown summary and the dashboard show it --------


def headline(doc: dict[str, Any]) -> str:
    """'FAIL: ctx.pre_norm [tok=0:4096]: 2.03x measured floor [2.03, 2.03] > 1.5x': the deciding reason."""
    reason = doc.get("headline") or (doc.get("reasons") or [""])[0]
    return f"{doc['verdict'].upper()}: {reason}" if reason else doc["verdict"].upper()


def counts_line(doc: dict[str, Any]) -> str:
    c = doc.get("counts", {})
    out = (
        f"{len(doc['pairs'])} pairs: {c.get('pass', 0)} ok, {c.get('fail', 0)} fail, {c.get('error', 0)} error, "
        f"{c.get('inconclusive', 0)} inconclusive"
    )
    pc = doc.get("pooled_counts") or {}
    if doc.get("pooled"):
        out += (f" ({pc.get('settled_pairs', 0)} settled by pooling); {len(doc['pooled'])} pooled units: {pc.get('pass', 0)} ok, "
                f"{pc.get('fail', 0)} fail, {pc.get('inconclusive', 0)} inconclusive")
    only = [f"{len(doc.get(f'only_{s}', []))} only in {s.upper()}" for s in ("a", "b") if doc.get(f"only_{s}")]
    return out + ("; " + ", ".join(only) if only else "")


def pair_status(p: dict[str, Any]) -> str:
    if p["status"] == "pass":
        return "ok"
    if p["status"] == "inconclusive" and p.get("pooled_pass"):
        return "ok (pooled)"
    if p["status"] == "inconclusive" and p.get("borderline"):
        return "BORDERLINE"
    return str(p["status"]).upper()


def floor_cell(p: dict[str, Any]) -> str:
    kind = p.get("floor_kind")
    if kind is None:
        return "-"
    if kind == "none":
        return "none"
    return f"{kind} {fmt_num(p.get('floor_rel_l2'))}"


def judged_cell(p: dict[str, Any]) -> str:
    """'1.99x [1.97, 2.01]' for a floor ratio, 'rel_l2 0.0123 [0.011, 0.013]' for an absolute bound."""
    value = p.get("value")
    if value is None:
        return "-"
    ci = p.get("interval")
    unit = "x" if p.get("judged") == "x floor" else ""
    text = f"{fmt_judged(value, 4, limit=p.get('limit')) if isinstance(value, float) else fmt_num(value)}{unit}"
    if ci:
        text += f" {fmt_interval(ci[0], ci[1], 4, limit=p.get('limit'))}"
    return text


def limit_cell(p: dict[str, Any]) -> str:
    lim = p.get("limit")
    if lim is None:
        return "-"
    return f"{fmt_num(lim)}x" if p.get("judged") == "x floor" else fmt_num(lim)


# -- the divergence frontier (judging.frontier), as the headline, the CLI, Markdown and JUnit name it ----


def counted(items: Iterable[tuple[str, int]], limit: int = 4) -> str:
    """'draft.mlp x 5,102, draft.logits x 4,210, and 3 more': the first ``limit`` of (what, count)."""
    got = list(items)
    text = ", ".join(f"{what} x {n:,}" for what, n in got[:limit])
    return text + (f", and {len(got) - limit} more" if len(got) > limit else "")


def _layered(name: str, layer: Any) -> str:
    return name if layer is None else f"{name} layer {layer}"


def _by(rows: Iterable[tuple[str, int]]) -> list[tuple[str, int]]:
    """(what, count) summed by ``what``, the largest first (ties: first seen first)."""
    out: dict[str, int] = {}
    for what, n in rows:
        out[what] = out.get(what, 0) + n
    return sorted(out.items(), key=lambda kv: -kv[1])


def _problem_groups(front: Mapping[str, Any]) -> list[tuple[str, int]]:
    return _by((_layered(p["name"], (p.get("coords") or {}).get("layer")), 1) for p in front.get("problem_nodes") or [])


def frontier_note(front: Mapping[str, Any]) -> str:
    """What follows a failing verdict's first divergence, for its headline: 'first divergence; 24 problem
    nodes: target.k layer 1 x 24; then 12,195 pairs downstream: draft.mlp x 5,102, ...' (``front``: a
    comparison document, or ``Frontier.to_dict()``)."""
    text = "first divergence"
    problems = front.get("problem_nodes") or []
    if len(problems) > 1:
        text += f"; {len(problems):,} problem nodes: {counted(_problem_groups(front), 3)}"
    down = front.get("downstream") or {}
    n = down.get("pairs") or 0
    if n:
        names = _by((g["name"], g["pairs"]) for g in down.get("groups") or [])
        text += f"; then {n:,} pair{'s' if n != 1 else ''} downstream: {counted(names)}"
    return text


def frontier_lines(doc: Mapping[str, Any]) -> list[str]:
    """The frontier of a comparison document, a line each: the first divergence, the problem nodes, what is
    downstream (by capture point and layer) and where acceptance and greedy output first part. Empty for a
    document without them (written before comparisons stored the frontier)."""
    out: list[str] = []
    first = doc.get("first_divergence")
    if "first_divergence" in doc:
        if first:
            out.append(f"first divergence: {first['where']}")
        else:
            out.append("first divergence: none (no pair fails)")
    problems = doc.get("problem_nodes") or []
    if len(problems) > 1:
        out.append(f"problem nodes (failing, every upstream pair passing): {len(problems):,}: {counted(_problem_groups(doc), 6)}")
    down = doc.get("downstream") or {}
    if down.get("pairs"):
        groups = [(_layered(g["name"], g.get("layer")), g["pairs"]) for g in down.get("groups") or []]
        out.append(f"then {down['pairs']:,} pair{'s' if down['pairs'] != 1 else ''} downstream: {counted(groups, 8)}")
    acc = doc.get("acceptance")
    if isinstance(acc, dict) and isinstance(acc.get("frontier"), dict):
        out.append(acceptance_parting_line(acc["frontier"]))
    return out


def acceptance_parting_line(f: Mapping[str, Any]) -> str:
    """An acceptance frontier (``judging.acceptance.first_parting``, its ``to_dict()``) in one line: 'acceptance
    first parts at verify step 3, position 1 (request q002; 5/24 requests); greedy output at step 3, token 14
    (request q002; 4/24 requests)'."""
    n = f.get("requests") or 0
    if not n:
        return "acceptance: no paired requests"
    fa = f.get("first_acceptance")
    if isinstance(fa, dict):
        pos = "a step only one run has" if fa.get("acceptance_position") is None else f"position {fa['acceptance_position']}"
        text = (f"acceptance first parts at verify step {fa['acceptance_step']}, {pos} "
                f"(request {fa['request_a']}; {f.get('acceptance_parted')}/{n} requests)")
    else:
        text = f"acceptance never parts ({n} paired requests: every verify step decided alike)"
    fo = f.get("first_output")
    if isinstance(fo, dict):
        text += (f"; greedy output at step {fo['output_step']}, token {fo['output_token']} "
                 f"(request {fo['request_a']}; {f.get('output_parted')}/{n} requests)")
    elif f.get("output_source") is not None:
        text += "; greedy output identical"
    return text
