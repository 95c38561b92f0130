"""SGLang 0.5.23's comparator and ``validator compare`` on the same dumps, side by side (docs/sglang.md, section 4).

The dumps are written by the real 0.5.23 dumper (tests/validator/runs/sglang0523_dumps.py). SGLang's comparator
runs from the unpacked wheel in .venv/sglang-versions/0.5.23 as ``python -m sglang.srt.debug_utils.comparator``,
its package ``__init__`` files skipped (they import the server stack) and polars + einops taken from ``--deps``
(``pip install --target DIR polars einops``). Both tools run as whole processes; the times are wall-clock,
start-up included. Writes benchmarks/sglang_comparator.md.

    .venv/bin/python benchmarks/sglang_comparator.py --deps /tmp/cmpdeps
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HARNESS = ROOT / "tests" / "validator" / "runs" / "sglang0523_dumps.py"

RUNNER = """
import runpy, sys
sys.path[:0] = [{deps!r}, {root!r}]
from tests.validator.runs import sglang0523_dumps as h
h.load_dumper()
side = str(h.SIDE / "sglang")
for mod, sub in (("sglang", ""), ("sglang.srt", "/srt"), ("sglang.srt.debug_utils", "/srt/debug_utils")):
    sys.modules[mod].__path__ = [side + sub]
sys.argv = ["comparator"] + sys.argv[1:]
runpy.run_module("sglang.srt.debug_utils.comparator", run_name="__main__", alter_sys=True)
"""

CASES = [
    ("TP 1 vs TP 2 (concat, partial sum, replicated copies)", "tp1", "tp2", [], []),
    ("TP 1 vs TP 2, every weight x (1 + 0.01 N(0,1))", "tp1", "tp2-w", [], []),
    ("TP 1 vs TP 2, rank 1's copy of `hidden` off by 1e-3, `mlp_gate` dims without tp", "tp1", "tp2-bad", [], []),
    ("one batch vs chunked prefill + other batches, token-aligned", "align-a", "align-b", ["--token-aligner", "smart"],
     ["--align-tokens"]),
    ("D-only vs PD (prefill and decode folders), token-aligned", "align-a", "pd", ["--token-aligner", "smart"],
     ["--align-tokens"]),
]


def _run(cmd: list[str]) -> tuple[float, subprocess.CompletedProcess[str]]:
    t = time.perf_counter()
    got = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    return time.perf_counter() - t, got


def _sglang_summary(got: subprocess.CompletedProcess[str]) -> str:
    lines = [json.loads(x) for x in got.stdout.splitlines() if x.startswith("{")]
    summary = next((x for x in lines if x.get("type") == "summary"), None)
    if summary is None:
        err = [x for x in got.stderr.strip().splitlines() if x.strip()]
        return f"stopped: `{err[-1].strip()[:120]}`" if err else f"exit {got.returncode}, no summary"
    bad_copies = sum(not c["passed"] for x in lines if x.get("type") == "comparison_tensor"
                     for c in x.get("replicated_checks") or [])
    worst = max((x.get("diff") or {}).get("rel_diff", 0.0) for x in lines if x.get("type") == "comparison_tensor")
    return (f"{summary['passed']} passed, {summary['failed']} failed, {summary['skipped']} skipped; "
            f"worst rel_diff {worst:.2g}; {bad_copies} copy check(s) failed; exit {got.returncode}")


def _validator_summary(got: subprocess.CompletedProcess[str]) -> str:
    try:
        doc = json.loads(got.stdout)
    except ValueError:
        return f"exit {got.returncode}: `{got.stderr.strip().splitlines()[-1][:120]}`"
    c = doc["counts"]
    notes = sum(any("replicas disagree" in n for n in p.get("notes", [])) for p in doc["pairs"])
    worst = max((p["rel_l2"] for p in doc["pairs"] if p.get("rel_l2") is not None), default=0.0)
    return (f"{doc['verdict'].upper()}: {c['pass']} pass, {c['fail']} fail, {len(doc['only_a'])} only in A, "
            f"{len(doc['only_b'])} only in B; worst rel_l2 {worst:.2g}; {notes} pair(s) noting differing copies; "
            f"exit {got.returncode}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--deps", required=True, help="folder holding polars and einops (pip install --target)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "sglang_comparator.md"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        dumps, home = Path(tmp) / "dumps", Path(tmp) / "home"
        subprocess.run([sys.executable, str(HARNESS), str(dumps), "all"], check=True, capture_output=True)
        runner = Path(tmp) / "run_comparator.py"
        runner.write_text(RUNNER.format(deps=args.deps, root=str(ROOT)))
        rows = []
        for what, a, b, sg_flags, v_flags in CASES:
            sg_b = dumps / b / "pd-decode" if b == "pd" else dumps / b  # SGLang's takes one folder a side
            ts, gs = _run([sys.executable, str(runner), "--baseline-path", str(dumps / a), "--target-path", str(sg_b),
                           "--output-format", "json", "--report-path", str(Path(tmp) / "report.jsonl"), *sg_flags])
            tv, gv = _run([sys.executable, "-m", "validator.app.cli", "--home", str(home), "compare", str(dumps / a),
                           str(dumps / b), "--json", *v_flags])
            rows.append(f"| {what} | {_sglang_summary(gs)} | {ts:.1f} s | {_validator_summary(gv)} | {tv:.1f} s |")
    head = ["# SGLang 0.5.23's comparator and `validator compare` on the same dumps", "",
            f"Written by `benchmarks/sglang_comparator.py` ({os.cpu_count()} CPU cores, torch CPU). Dumps: the real 0.5.23 "
            "dumper, float32, 2 layers, 2 steps of 5 tokens (tests/validator/runs/sglang0523_dumps.py). Both tools with "
            "their defaults; times are whole processes.", "",
            f"- Measured: {datetime.date.today().isoformat()}", f"- Machine: {os.cpu_count()} CPU cores, torch CPU",
            "- Command: `.venv/bin/python benchmarks/sglang_comparator.py --deps /tmp/cmpdeps` (it writes this file; "
            "`--deps`: a folder with polars and einops, `pip install --target`)", "",
            "| case | SGLang comparator | time | validator compare | time |", "| --- | --- | --- | --- | --- |"]
    Path(args.out).write_text("\n".join(head + rows) + "\n")
    print("\n".join(head + rows))


if __name__ == "__main__":
    main()
