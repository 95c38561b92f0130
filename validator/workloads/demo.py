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

from probes.workloads.projection import ProjectionConfig
from validator.judging.report import format_comparison, headline
from validator.service import Service
from validator.workloads.projection_report import format_table, run_projection_report

__all__ = ["run_demo", "DEMO_CONFIG"]

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
    verdicts: list[str] = []
    commands: list[str] = []
    for step, cand in enumerate(("partial-fp32", "partial-bf16"), start=3):
        say(f"\n{step}. compare {cand} against the FP64 reference, floor = concat vs FP64")
        # stored as a cached comparison, so the dashboard shows this very result at /comparisons/{id}
        # The default policy, as `validator compare` uses it; stored as a cached comparison, so the
        # dashboard shows this very result at /comparisons/{id}.
        rec = svc.cached_comparison(names["ref"], names[cand], floor=floor, background=False)
        doc = rec["result"]
        docs[cand] = doc
        say(format_comparison(doc, limit=12))
        commands.append(f"validator compare {names['ref']} {names[cand]} --floor {names['ref']} {names['concat']}")
        verdicts.append(f"{cand}: {headline(doc)}  ->  http://127.0.0.1:8765/comparisons/{rec['id']}")
    if json_out:
        print(json.dumps({"bundles": str(work), "runs": names, "probe": report.to_dict(), "comparisons": docs}, indent=1))
    else:
        print("\nsummary (x floor = rel_l2 vs FP64 divided by the single-GEMM path's rel_l2 vs FP64):")
        for v in verdicts:
            print(f"  {v}")
        print("The same verdicts from the shell (default policy; same VALIDATOR_HOME):")
        for c in commands:
            print(f"  {c}")
        print(
            "To look: `validator serve` (same VALIDATOR_HOME), then open the links above, or "
            f"http://127.0.0.1:8765/runs?label=demo={tag}. From the shell: `validator runs --label demo={tag}`."
        )
    return 0
