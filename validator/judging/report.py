"""Rendering a comparison for people (a table, Markdown) and for CI (JSON, JUnit XML).

Everything here works on the comparison's JSON document (``comparison_doc``), so a comparison computed
locally and one fetched from a server print the same.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from validator.judging.compare import Comparison
from validator.judging.text import (
    counts_line,
    floor_cell,
    fmt_num,
    format_rows,
    frontier_lines,
    frontier_note,
    headline,
    judged_cell,
    limit_cell,
    pair_status,
)
from validator.numerics.jsonsafe import json_safe

__all__ = [
    "comparison_doc",
    "comparison_json",
    "dumps",
    "format_comparison",
    "markdown_summary",
    "write_junit",
    "fmt_num",
    "format_rows",
    "headline",
    "counts_line",
    "judged_cell",
]



def comparison_doc(c: Comparison) -> dict[str, Any]:
    """The JSON report of a comparison (the pairs' dicts are JSON-safe already; the rest is made so)."""
    full = c.to_dict()
    keys = list(full)
    pairs = full.pop("pairs")
    rest: dict[str, Any] = json_safe(full)
    for sec in rest.values():
        if isinstance(sec, dict):
            sec.pop("table", None)
    return {k: pairs if k == "pairs" else rest[k] for k in keys}


def comparison_json(c: Comparison) -> str:
    """The JSON report, compact. A caller with thousands of pairs builds it with the cycle collector paused
    (``service.cycle_collector.cycle_collector_paused``, as Service and the CLI do;
    ``benchmarks/many_pairs_bench.md``)."""
    return dumps(comparison_doc(c))


def dumps(doc: Any, *, indent: bool = False) -> str:
    """``doc`` (a JSON document: ``comparison_doc``) as JSON text, compact or indented by two spaces. orjson
    encodes it: a report of thousands of pairs is ~1 KB of numbers a pair, which ``json.dumps`` encodes in
    30 us a pair, or 120 us indented (its Python encoder), and orjson in 2-3 us. Values as ``json.dumps(doc,
    default=str)`` writes them: float subclasses (NumPy float64) as numbers, other objects as ``str``, keys as
    strings. What orjson refuses (integers past 64 bits, lone surrogates, nesting past 255 levels), or an
    environment without orjson, goes to ``json``, which writes the same values (and refuses NaN and
    infinities, which a document never holds: ``numerics.jsonsafe``)."""
    try:
        import orjson  # only where a report is encoded

        return orjson.dumps(doc, default=_plain, option=orjson.OPT_NON_STR_KEYS | (orjson.OPT_INDENT_2 if indent else 0)).decode()
    except (ImportError, TypeError):  # no orjson, or a value it refuses (its JSONEncodeError is a TypeError)
        return json.dumps(doc, default=str, allow_nan=False, indent=2 if indent else None)


def _plain(value: Any) -> Any:
    return float(value) if isinstance(value, float) else str(value)


def format_comparison(doc: dict[str, Any], *, limit: int | None = 50, tables: dict[str, str] | None = None) -> str:
    """The human table, worst pair first. ``tables``: extra sections' pre-rendered text (acceptance...)."""
    lines = [f"A (reference): {doc['a']}", f"B (candidate): {doc['b']}"]
    if doc.get("floor"):
        lines.append(f"noise floor:   {doc['floor'][0]} vs {doc['floor'][1]}")
    lines += [f"policy:        {doc.get('policy', 'defaults')}", ""]
    pairs = doc["pairs"]
    shown = pairs if limit is None else pairs[:limit]
    rows = []
    for p in shown:
        cos = p.get("cosine")
        rows.append(
            [
                pair_status(p),
                p["label"],
                fmt_num(p.get("rel_l2")),
                f"{cos:.6f}" if isinstance(cos, float) else fmt_num(cos),
                fmt_num(p.get("max_abs")),
                floor_cell(p),
                judged_cell(p),
                limit_cell(p),
            ]
        )
    header = ["status", "tensor", "rel_l2", "cosine", "max_abs", "floor", "judged [95% interval]", "limit"]
    lines.append(format_rows(header, rows))
    if limit is not None and len(pairs) > limit:
        lines.append(f"... {len(pairs) - limit} more pairs (use --json for all)")
    for p in shown:
        lines += [f"note: {p['label']}: {n}" for n in p.get("notes", [])]
        if p["status"] == "error":
            lines.append(f"error: {p['label']}: {'; '.join(p.get('reasons', []))}")
    units = sorted(doc.get("pooled") or [], key=lambda u: ({"fail": 0, "inconclusive": 1}.get(u["status"], 2), u["label"]))
    if units:
        lines += ["", "pooled units (the pairs of one capture point judged together):"]
        unit_rows = [[{"pass": "ok"}.get(u["status"], u["status"].upper()), u["label"], str(u["elements"]), u["reason"].split(": ", 1)[-1]]
                     for u in (units if limit is None else units[:limit])]
        lines.append(format_rows(["status", "unit", "elements", "judged [95% interval]"], unit_rows))
        if limit is not None and len(units) > limit:
            lines.append(f"... {len(units) - limit} more pooled units (use --json for all)")
    for side in ("a", "b"):
        names = doc.get(f"only_{side}", [])
        if names:
            more = " ..." if len(names) > 20 else ""
            lines.append(f"only in {side.upper()} ({len(names)}): " + ", ".join(names[:20]) + more)
    for name, text in (tables or {}).items():
        lines += ["", f"[{name}]", text]
    lines += ["", f"verdict: {headline(doc)}", f"  {counts_line(doc)}"]
    lines += [f"  {f}" for f in _frontier(doc)]
    lines += [f"  - {r}" for r in [r for r in doc.get("reasons", []) if r != doc.get("headline")][:25]]
    return "\n".join(lines)


def _frontier(doc: dict[str, Any]) -> list[str]:
    """The frontier's lines (``text.frontier_lines``); a passing verdict's 'no pair fails' goes without saying."""
    got = frontier_lines(doc)
    if doc["verdict"] == "pass" and got and got[0].startswith("first divergence: none"):
        got = got[1:]
    return got


def markdown_summary(doc: dict[str, Any], *, limit: int = 20, link: str | None = None) -> str:
    """A short Markdown report for a CI step summary."""
    icon = {"pass": "✅", "fail": "❌", "inconclusive": "⚠️"}.get(doc["verdict"], "")
    out = [f"### validator: {icon} {doc['verdict'].upper()} — `{doc['b']}` vs reference `{doc['a']}`", ""]
    out += [f"**{headline(doc)}**", "", counts_line(doc), ""]
    front = _frontier(doc)
    if front:
        out += [f"- **{front[0]}**" if doc.get("first_divergence") else f"- {front[0]}", *[f"- {f}" for f in front[1:]], ""]
    if doc.get("floor"):
        out.append(f"Noise floor: `{doc['floor'][0]}` vs `{doc['floor'][1]}`\n")
    out += [f"- {r}" for r in [r for r in doc.get("reasons", []) if r != doc.get("headline")][:10]]
    out += ["", "| status | tensor | rel_l2 | cosine | floor | judged [95% interval] | limit |", "|---|---|---|---|---|---|---|"]
    for p in doc["pairs"][:limit]:
        cos = p.get("cosine")
        out.append(
            f"| {p['status']} | `{p['label']}` | {fmt_num(p.get('rel_l2'))} | "
            f"{f'{cos:.6f}' if isinstance(cos, float) else fmt_num(cos)} | {floor_cell(p)} | {judged_cell(p)} | {limit_cell(p)} |"
        )
    if len(doc["pairs"]) > limit:
        out.append(f"\n{len(doc['pairs']) - limit} more pairs not shown.")
    if link:
        out.append(f"\n[Full comparison]({link})")
    return "\n".join(out) + "\n"


def _leading(doc: dict[str, Any]) -> list[int]:
    """The pairs' indices with the frontier's first: the first divergence, the other problem nodes, the rest."""
    first = [p["index"] for p in doc.get("problem_nodes") or []]
    seen = set(first)
    return first + [i for i in range(len(doc["pairs"])) if i not in seen]


def write_junit(doc: dict[str, Any], path: str | Path) -> None:
    """One testcase per pair, per pooled unit, per one-sided tensor and per extra section with a verdict (a pair
    settled by pooling passes). The frontier leads:
    the first divergence's testcase comes first, its failure message says so and what follows it, then the
    other problem nodes'; the suite's properties name the first divergence and count the problem nodes."""
    suite = ET.Element("testsuite", name=f"validator compare {doc['a']} vs {doc['b']}")
    front = doc.get("first_divergence")
    if "first_divergence" in doc:
        props = ET.SubElement(suite, "properties")
        ET.SubElement(props, "property", name="first_divergence", value=front["label"] if front else "")
        ET.SubElement(props, "property", name="problem_nodes", value=str(len(doc.get("problem_nodes") or [])))
        ET.SubElement(props, "property", name="downstream_pairs", value=str((doc.get("downstream") or {}).get("pairs", 0)))
    problems = {p["index"] for p in doc.get("problem_nodes") or []}
    n_fail = 0
    for i in _leading(doc):
        p = doc["pairs"][i]
        case = ET.SubElement(suite, "testcase", classname="validator.tensors", name=p["label"])
        if p["status"] in ("fail", "error"):
            n_fail += 1
            message = "; ".join(p.get("reasons", [])) or p["status"]
            if front and i == front["index"]:
                message = f"first divergence: {front['where']}: {message} ({frontier_note(doc)})"
            elif i in problems:
                message = f"problem node (its upstream pairs pass): {message}"
            ET.SubElement(case, "failure", message=message).text = json.dumps(p)
        elif p["status"] == "inconclusive" and not p.get("pooled_pass"):  # settled by pooling: a passing testcase
            ET.SubElement(case, "skipped", message="inconclusive: " + "; ".join(p.get("reasons", [])))
    for u in doc.get("pooled") or []:  # pooled units: the pairs of one capture point judged together
        case = ET.SubElement(suite, "testcase", classname="validator.pooled", name=u["label"])
        if u["status"] == "fail":
            n_fail += 1
            ET.SubElement(case, "failure", message=u["reason"]).text = json.dumps(u)
        elif u["status"] == "inconclusive":
            ET.SubElement(case, "skipped", message="inconclusive: " + u["reason"])
    for side in ("a", "b"):
        for n in doc.get(f"only_{side}", []):
            case = ET.SubElement(suite, "testcase", classname="validator.coverage", name=f"{n} (only in {side.upper()})")
            n_fail += 1
            ET.SubElement(case, "failure", message=f"present only in run {side.upper()}")
    for name, sec in doc.items():
        if not isinstance(sec, dict) or "verdict" not in sec:
            continue
        case = ET.SubElement(suite, "testcase", classname=f"validator.{name}", name=name)
        if sec["verdict"] == "fail":
            n_fail += 1
            ET.SubElement(case, "failure", message="; ".join(sec.get("reasons", [])))
        elif sec["verdict"] == "inconclusive":
            ET.SubElement(case, "skipped", message="inconclusive")
    suite.set("tests", str(len(suite.findall("testcase"))))
    suite.set("failures", str(n_fail))
    ET.ElementTree(suite).write(path, encoding="utf-8", xml_declaration=True)
