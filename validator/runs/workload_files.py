"""The files a workload adds to a run besides tensors, read and checked: the GSM8K probe's per-request rows
(``gsm8k.jsonl``, written by :mod:`validator.workloads.gsm8k`) and the engine counters scraped from Prometheus
(``metrics.json``, written by :mod:`validator.workloads.scrape`). Ingest checks them before storing; a comparison
reads them for its ``gsm8k`` and ``engine_metrics`` sections."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from validator.errors import InputError
from validator.runs.jsonlines import json_lines

__all__ = ["METRICS_FILE", "METRICS_FORMAT", "PART", "ROWS_FILE", "load_gsm8k_rows", "load_metrics_doc"]

PART = "gsm8k"  # the GSM8K probe's bundle part
ROWS_FILE = "gsm8k.jsonl"
METRICS_FILE = "metrics.json"
METRICS_FORMAT = "validator-metrics"


def load_gsm8k_rows(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Per-request rows of one run: from a bundle directory, its ``parts/gsm8k`` folder, or the JSONL file."""
    p = Path(path)
    if p.is_dir():
        candidates = [p / ROWS_FILE, p / "parts" / PART / ROWS_FILE, *sorted(p.glob(f"parts/*/{ROWS_FILE}"))]
        found = next((c for c in candidates if c.is_file()), None)
        if found is None:
            raise InputError(f"{p}: no {ROWS_FILE} in this directory or under parts/")
        p = found
    rows = []
    try:
        with open(p, encoding="utf-8") as f:
            for n, obj in json_lines(p, f):
                if not isinstance(obj, dict) or not all(k in obj for k in ("question", "correct", "answers")):
                    raise InputError(f"{p} line {n}: not a GSM8K probe row (needs question, answers, correct)")
                rows.append(obj)
    except OSError as exc:
        raise InputError(f"{p}: {exc.strerror or exc}") from None
    return rows


def load_metrics_doc(path: str | Path) -> dict[str, Any]:
    """A ``metrics.json`` written by :func:`validator.workloads.scrape.write_metrics_bundle`, checked for the
    fields compare reads."""
    p = Path(path)
    try:
        doc = json.loads(p.read_text())
    except OSError as exc:
        raise InputError(f"{p}: cannot read: {exc.strerror or exc}") from None
    except (ValueError, RecursionError) as exc:
        raise InputError(f"{p}: not valid JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != METRICS_FORMAT:
        raise InputError(f"{p}: not a validator metrics document (format must be {METRICS_FORMAT!r})")
    acc = doc.get("acceptance")
    if not isinstance(acc, dict) or not isinstance(acc.get("per_position", []), list):
        raise InputError(f"{p}: 'acceptance' must be an object with a 'per_position' list")
    for i, pos in enumerate(acc.get("per_position", [])):
        if not isinstance(pos, dict) or not isinstance(pos.get("position"), int):
            raise InputError(f"{p}: acceptance.per_position[{i}] needs an integer 'position'")
    return doc
