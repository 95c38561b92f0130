"""Rendering a comparison for people (a table) and for CI (JSON, JUnit XML). No computation here."""

from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from .compare import Comparison

__all__ = ["format_comparison", "comparison_json", "write_junit", "fmt_num", "format_rows"]


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
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    line = "  ".join(h.ljust(w) for h, w in zip(header, widths))
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
    return "\n".join(out)


def format_comparison(c: Comparison, *, limit: int | None = 50) -> str:
    lines = [f"A (reference): {c.a}", f"B (candidate): {c.b}"]
    if c.floor:
        lines.append(f"noise floor:   {c.floor[0]} vs {c.floor[1]}")
    lines.append(f"policy:        {c.policy}")
    lines.append("")
    header = ["status", "tensor", "rel_l2", "cosine", "max_abs", "threshold", "floor", "ratio"]
    rows = []
    shown = c.pairs if limit is None else c.pairs[:limit]
    for p in shown:
        m = p.metrics
        rows.append(
            [
                p.status.upper() if p.status != "pass" else "ok",
                p.label,
                fmt_num(m.rel_l2) if m else "-",
                f"{m.cosine:.6f}" if m and not math.isnan(m.cosine) else "-",
                fmt_num(m.max_abs) if m else "-",
                fmt_num(p.decision.threshold) if p.decision else "-",
                fmt_num(p.floor_rel_l2),
                fmt_num(p.ratio, 2),
            ]
        )
    lines.append(format_rows(header, rows))
    if limit is not None and len(c.pairs) > limit:
        lines.append(f"... {len(c.pairs) - limit} more pairs (use --json for all)")
    for p in shown:
        for n in p.notes:
            lines.append(f"note: {p.label}: {n}")
        if p.status == "error" and p.decision:
            lines.append(f"error: {p.label}: {'; '.join(p.decision.reasons)}")
    if c.only_a:
        lines.append(f"only in A ({len(c.only_a)}): " + ", ".join(c.only_a[:20]) + (" ..." if len(c.only_a) > 20 else ""))
    if c.only_b:
        lines.append(f"only in B ({len(c.only_b)}): " + ", ".join(c.only_b[:20]) + (" ..." if len(c.only_b) > 20 else ""))
    for name, section in c.sections.items():
        text = section.get("table") if isinstance(section, dict) else None
        if text:
            lines += ["", f"[{name}]", text]
    counts = c.counts()
    lines.append("")
    lines.append(
        f"verdict: {c.verdict.upper()}  ({len(c.pairs)} pairs: {counts['pass']} ok, {counts['fail']} fail, "
        f"{counts['error']} error, {counts['inconclusive']} inconclusive)"
    )
    lines += [f"  - {r}" for r in c.reasons[:25]]
    return "\n".join(lines)


def _json_default(o: Any) -> Any:
    return str(o)


def comparison_json(c: Comparison) -> str:
    doc = c.to_dict()
    for sec in c.sections.values():
        if isinstance(sec, dict):
            sec.pop("table", None)
    return json.dumps(doc, indent=1, default=_json_default, allow_nan=False)


def write_junit(c: Comparison, path: str | Path) -> None:
    """One testcase per pair (and one per one-sided tensor and per extra section)."""
    suite = ET.Element("testsuite", name=f"validator compare {c.a} vs {c.b}")
    n_fail = 0
    for p in c.pairs:
        case = ET.SubElement(suite, "testcase", classname="validator.tensors", name=p.label)
        if p.status in ("fail", "error"):
            n_fail += 1
            reason = "; ".join(p.decision.reasons) if p.decision else p.status
            ET.SubElement(case, "failure", message=reason).text = json.dumps(p.to_dict(), default=_json_default)
        elif p.status == "inconclusive":
            ET.SubElement(case, "skipped", message="inconclusive: " + "; ".join(p.decision.reasons if p.decision else ()))
    for side, names in (("A", c.only_a), ("B", c.only_b)):
        for n in names:
            case = ET.SubElement(suite, "testcase", classname="validator.coverage", name=f"{n} (only in {side})")
            n_fail += 1
            ET.SubElement(case, "failure", message=f"present only in run {side}")
    for name, sec in c.sections.items():
        case = ET.SubElement(suite, "testcase", classname=f"validator.{name}", name=name)
        v = sec.get("verdict") if isinstance(sec, dict) else None
        if v == "fail":
            n_fail += 1
            ET.SubElement(case, "failure", message="; ".join(sec.get("reasons", [])))
        elif v == "inconclusive":
            ET.SubElement(case, "skipped", message="inconclusive")
    suite.set("tests", str(len(suite)))
    suite.set("failures", str(n_fail))
    ET.ElementTree(suite).write(path, encoding="utf-8", xml_declaration=True)
