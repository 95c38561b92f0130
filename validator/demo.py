"""`validator demo`: the README's main job, end to end on the CPU in well under a minute.

Runs the DFlash context-projection probe at reduced shapes (same structure as Kimi-K3: 93 target layers,
capture layers [19, 37, 54, 66, 78, 90], PP8, 8 KV heads), stores the four paths as runs in the embedded
store, and compares each PP-partial path with the FP64 reference, using the single-GEMM path's own
distance from FP64 as the noise floor.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

from probes.projection import ProjectionConfig

from .policy import Policy, Rule
from .projection import format_table, run_projection_report
from .report import comparison_doc, format_comparison
from .service import Service

__all__ = ["run_demo", "DEMO_CONFIG"]

# Stage-level tensors (per-stage partials, running sums) exist only on the PP paths, so they have no
# single-GEMM floor: judge them by the bf16 bound; everything else by 2x the floor.
DEMO_POLICY = Policy(
    rules=(Rule(match="ctx.partial", rel_l2_max=0.03), Rule(match="ctx.running", rel_l2_max=0.03)),
    source="demo: stage tensors rel_l2 <= 0.03, others <= 2 x floor",
)
DEMO_CONFIG = ProjectionConfig(hidden=512, draft_layers=2, head_dim=64, tokens=256, dtype="bf16", seed=0)


def run_demo(svc: Service, *, out: str | None = None, json_out: bool = False) -> int:
    tag = time.strftime("%Y%m%d-%H%M%S")
    work = Path(out) if out else Path(tempfile.mkdtemp(prefix="validator-demo-"))
    say = (lambda *a: None) if json_out else print
    say(f"1. projection probe on CPU (hidden {DEMO_CONFIG.hidden}, {DEMO_CONFIG.tokens} tokens, PP{DEMO_CONFIG.pp}) -> {work}")
    report = run_projection_report(DEMO_CONFIG, work, device="cpu")
    say(format_table(report))
    names: dict[str, str] = {}
    say("\n2. storing the runs")
    for path in ("ref", "concat", "partial-bf16", "partial-fp32"):
        run = svc.ingest(work / path, name=f"demo-{tag}-{path}", labels={"demo": tag})
        names[path] = run.name
        say(f"   {run.name}: {run.n_tensors} tensors")
    floor = (names["ref"], names["concat"])
    docs: dict[str, Any] = {}
    verdicts = []
    for cand in ("partial-fp32", "partial-bf16"):
        say(f"\n3. compare {cand} against the FP64 reference, floor = concat vs FP64")
        c = svc.compare(names["ref"], names[cand], floor=floor, policy=DEMO_POLICY)
        doc = comparison_doc(c)
        docs[cand] = doc
        say(format_comparison(doc, limit=12))
        worst = max((p for p in c.pairs if p.floor_ratio is not None), key=lambda p: p.floor_ratio or 0.0, default=None)
        if worst is not None:
            verdicts.append(f"{cand}: {c.verdict.upper()}, worst {worst.label} at {worst.floor_ratio:.2f}x the single-GEMM error")
    if json_out:
        print(json.dumps({"bundles": str(work), "runs": names, "probe": report.to_dict(), "comparisons": docs}, indent=1))
    else:
        print("\nsummary (x floor = rel_l2 vs FP64 divided by the single-GEMM path's rel_l2 vs FP64):")
        for v in verdicts:
            print(f"  {v}")
        print(
            f"Browse the runs with `validator runs --label demo={tag}`; "
            f"re-compare with `validator compare {names['concat']} {names['partial-bf16']}`."
        )
    return 0
