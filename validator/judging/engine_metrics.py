"""Comparing the aggregate acceptance counters scraped from engines (validator.workloads.scrape), pure.

Aggregates are all an engine without our plugin gives: per-position accepted counts over all verify
steps (vLLM) or only accept length (SGLang). There is no request structure left, so trials are treated
as independent: the intervals are too narrow when acceptance is correlated within a request (it is),
and the section says so. Use per-step records (the plugin, or JSONL) for the honest, bootstrapped test.
"""

from __future__ import annotations

import math
from typing import Any

from scipy import stats as sps

from validator.judging.acceptance import equivalence_verdict, tost_p_value

__all__ = ["compare_engine_metrics"]



def compare_engine_metrics(a: dict[str, Any], b: dict[str, Any], *, margin: float = 0.02, alpha: float = 0.05) -> dict[str, Any]:
    """Per-position unconditional acceptance (vLLM style: accepted at position k / verify steps), B - A,
    with a two-proportion z test and TOST at ``margin``; mean accept length reported, not tested."""
    acc_a, acc_b = a.get("acceptance", {}), b.get("acceptance", {})
    steps_a, steps_b = acc_a.get("verify_steps"), acc_b.get("verify_steps")
    pos_a = {p["position"]: p for p in acc_a.get("per_position", [])}
    pos_b = {p["position"]: p for p in acc_b.get("per_position", [])}
    rows: list[dict[str, Any]] = []
    for k in sorted(pos_a.keys() & pos_b.keys()):
        xa, xb = pos_a[k].get("accepted"), pos_b[k].get("accepted")
        if xa is None or xb is None or not steps_a or not steps_b:
            continue
        pa, pb = xa / steps_a, xb / steps_b
        diff = pb - pa
        se = math.sqrt(pa * (1 - pa) / steps_a + pb * (1 - pb) / steps_b)
        p_diff = float(2 * sps.norm.sf(abs(diff) / se)) if se > 0 else (0.0 if diff else 1.0)
        p_tost = tost_p_value(diff, se, margin)
        verdict = equivalence_verdict(diff, p_tost, p_diff, margin=margin, alpha=alpha)
        rows.append({"position": k, "rate_a": pa, "rate_b": pb, "diff": diff, "se": se, "p_diff": p_diff,
                     "p_tost": p_tost, "verdict": verdict})  # fmt: skip
    reasons: list[str] = []
    if not rows:
        overall = "inconclusive"
        reasons.append("no per-position counters in both runs (SGLang exposes only accept length): not testable")
    elif any(r["verdict"] == "different" for r in rows):
        overall = "fail"
        reasons += [f"position {r['position']}: {r['rate_a']:.4f} -> {r['rate_b']:.4f}" for r in rows if r["verdict"] == "different"]
    elif all(r["verdict"] == "equivalent" for r in rows):
        overall = "pass"
        reasons.append(f"positions 0-{rows[-1]['position']}: equivalent within +-{margin} (independent-trials TOST)")
    else:
        overall = "inconclusive"
        reasons += [f"position {r['position']}: inconclusive" for r in rows if r["verdict"] == "inconclusive"]
    la, lb = acc_a.get("mean_accept_length"), acc_b.get("mean_accept_length")
    lines = [
        f"engine counters: {a.get('engine')} vs {b.get('engine')}; verify steps {steps_a} / {steps_b}",
        f"mean accept length (incl. bonus): A {la if la is None else f'{la:.4f}'}  B {lb if lb is None else f'{lb:.4f}'}",
        "pos  rate A   rate B   B-A       p(diff)   p(TOST)   verdict",
    ]
    lines += [
        f"{r['position']:>3}  {r['rate_a']:.4f}   {r['rate_b']:.4f}   {r['diff']:+.4f}   {r['p_diff']:.3g}".ljust(44)
        + f"  {r['p_tost']:.3g}".ljust(10) + f"  {r['verdict']}"
        for r in rows
    ]
    lines.append("note: aggregate counters have no request structure; trials are taken as independent (CIs too narrow)")
    return {
        "verdict": overall,
        "reasons": reasons,
        "margin": margin,
        "alpha": alpha,
        "mean_accept_length_a": la,
        "mean_accept_length_b": lb,
        "positions": rows,
        "table": "\n".join(lines),
    }
