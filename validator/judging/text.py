"""Plain-text formatting that the CLI, the comparison report and the dashboard share: numbers as the CLI
prints them, aligned tables, and a comparison document's verdict (headline, floor, judged value and limit). Imports nothing heavy, so commands that only list or show runs stay fast."""

from __future__ import annotations

import math
from typing import Any

__all__ = [
    "fmt_num",
    "format_rows",
    "headline",
    "counts_line",
    "pair_status",
    "floor_cell",
    "judged_cell",
    "limit_cell",
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
    only = [f"{len(doc.get(f'only_{s}', []))} only in {s.upper()}" for s in ("a", "b") if doc.get(f"only_{s}")]
    return out + ("; " + ", ".join(only) if only else "")


def pair_status(p: dict[str, Any]) -> str:
    if p["status"] == "pass":
        return "ok"
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
    text = f"{fmt_num(value)}{unit}"
    if ci:
        text += f" [{fmt_num(ci[0])}, {fmt_num(ci[1])}]"
    return text


def limit_cell(p: dict[str, Any]) -> str:
    lim = p.get("limit")
    if lim is None:
        return "-"
    return f"{fmt_num(lim)}x" if p.get("judged") == "x floor" else fmt_num(lim)
