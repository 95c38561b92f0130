"""Acceptance from an engine's Prometheus endpoint: scrape at the start and end of a window, keep the deltas.

Runs of engines without our probes (or without any plugin at all) can still be compared on acceptance.
``validator probe metrics URL --window 60 --name RUN`` reads the endpoint twice and writes a bundle whose
``parts/metrics/metrics.json`` holds the counters' deltas and the aggregates below (the same document is
in ``part.json``'s ``extra.metrics`` and, summarised, in the manifest's ``run.acceptance_metrics``, so a
plain ``validator ingest`` keeps it with the run).

Engines and what is derived:

- vLLM counters ``vllm:spec_decode_num_drafts``, ``..._num_draft_tokens``, ``..._num_accepted_tokens``,
  ``..._num_accepted_tokens_per_pos{position=i}`` (``_total`` suffix or not): verify steps = drafts;
  mean accept length = 1 + accepted / drafts (bonus included); per position ``i`` the unconditional rate
  per_pos[i] / drafts and the conditional rate per_pos[i] / per_pos[i-1] (reached = per_pos[i-1], or the
  drafts for position 0), with the counts.
- SGLang counters ``sglang:spec_verify_calls_total`` and ``sglang:generation_tokens_total``: mean accept
  length = generated tokens / verify calls (bonus included, as SGLang's ``spec_accept_length``); it is
  exact only when every generated token came from a speculative request. The gauges
  ``sglang:spec_accept_length`` / ``sglang:spec_accept_rate`` describe recent batches, not the window:
  their values at both ends are recorded, never differenced. SGLang exports no per-position counters.

Counters are summed over label sets (engines, DP ranks); a counter that went down (an engine restart)
is an error. The parser is a small reader of the Prometheus text format (``# TYPE`` lines, labels with
escapes, ``+Inf``/``NaN``; OpenMetrics' ``# EOF`` is accepted).
"""

from __future__ import annotations

import argparse
import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from validator.errors import InputError
from validator.numerics.jsonsafe import json_safe
from validator.runs.workload_files import METRICS_FILE, METRICS_FORMAT

__all__ = [
    "METRICS_FILE",
    "Sample",
    "acceptance_from_scrapes",
    "add_arguments",
    "fetch_text",
    "metrics_url",
    "parse_prometheus",
    "run_from_args",
    "scrape_window",
    "write_metrics_bundle",
]

MAX_BODY = 64 << 20

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_SAMPLE_RE = re.compile(rf"({_NAME})(\{{.*\}})?\s+(\S+)(?:\s+(-?\d+))?\s*")
_LABEL_RE = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(,|$)')
_ESCAPES = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}

Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Sample:
    name: str
    labels: Labels
    value: float

    def label(self, key: str) -> str | None:
        return dict(self.labels).get(key)


def _unescape(s: str) -> str:
    return re.sub(r"\\[\\\"n]", lambda m: _ESCAPES[m.group(0)], s)


def _labels(body: str, where: str) -> Labels:
    inner = body[1:-1].strip()
    out: list[tuple[str, str]] = []
    pos = 0
    while pos < len(inner):
        m = _LABEL_RE.match(inner, pos)
        if not m:
            raise InputError(f"{where}: cannot parse labels {body!r}")
        out.append((m.group(1), _unescape(m.group(2))))
        pos = m.end()
    return tuple(sorted(out))


def parse_prometheus(text: str, *, source: str = "metrics") -> tuple[list[Sample], dict[str, str]]:
    """Samples and ``# TYPE`` declarations of a Prometheus (or OpenMetrics) text exposition."""
    samples: list[Sample] = []
    types: dict[str, str] = {}
    for i, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 4 and parts[1] == "TYPE":
                types[parts[2]] = parts[3].strip()
            continue
        m = _SAMPLE_RE.fullmatch(line)
        if not m:
            raise InputError(f"{source} line {i}: not a Prometheus sample: {raw[:200]!r}")
        try:
            value = float(m.group(3))
        except ValueError:
            raise InputError(f"{source} line {i}: bad sample value {m.group(3)!r}") from None
        samples.append(Sample(m.group(1), _labels(m.group(2), f"{source} line {i}") if m.group(2) else (), value))
    return samples, types


def metrics_url(url: str) -> str:
    """The endpoint's URL: ``/metrics`` is appended to a bare ``http://host:port``."""
    if not re.match(r"https?://", url):
        raise InputError(f"{url!r}: expected an http:// or https:// URL of a Prometheus endpoint")
    return url.rstrip("/") + "/metrics" if re.fullmatch(r"https?://[^/]+/?", url) else url


def fetch_text(url: str, *, timeout: float = 10.0) -> str:
    """GET the endpoint's text."""
    url = metrics_url(url)
    req = urllib.request.Request(url, headers={"Accept": "text/plain; version=0.0.4"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            body: bytes = resp.read(MAX_BODY + 1)
    except urllib.error.HTTPError as exc:
        raise InputError(f"{url}: HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise InputError(f"{url}: cannot read metrics ({reason})") from None
    if len(body) > MAX_BODY:
        raise InputError(f"{url}: metrics page larger than {MAX_BODY} bytes")
    return body.decode("utf-8", errors="replace")


@dataclass(frozen=True)
class Scrape:
    url: str
    time: float  # unix seconds
    samples: tuple[Sample, ...]
    types: Mapping[str, str]


def scrape_window(
    url: str,
    window: float,
    *,
    fetch: Callable[[str], str] = fetch_text,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[Scrape, Scrape]:
    """Read the endpoint now and ``window`` seconds later."""
    if not window >= 0:
        raise InputError(f"--window must be >= 0 seconds, got {window}")
    url = metrics_url(url)
    out = []
    for i in range(2):
        if i:
            sleep(window)
        t = clock()
        samples, types = parse_prometheus(fetch(url), source=url)
        out.append(Scrape(url, t, tuple(samples), types))
    return out[0], out[1]


# -- deriving acceptance -----------------------------------------------------------------------------


def _base(name: str) -> str:
    return name.removesuffix("_total")


def _counter_sums(samples: Iterable[Sample], base: str, *, by: str | None = None) -> dict[str | None, float]:
    out: dict[str | None, float] = {}
    for s in samples:
        if _base(s.name) == base and not s.name.endswith(("_created", "_bucket", "_sum", "_count")):
            key = s.label(by) if by else None
            out[key] = out.get(key, 0.0) + s.value
    return out


def _delta(start: Scrape, end: Scrape, base: str, *, by: str | None = None) -> dict[str | None, float] | None:
    a, b = _counter_sums(start.samples, base, by=by), _counter_sums(end.samples, base, by=by)
    if not b:
        return None
    out = {}
    for k, v in b.items():
        d = v - a.get(k, 0.0)
        if d < 0:
            raise InputError(
                f"{end.url}: counter {base}{'{' + f'{by}={k}' + '}' if by else ''} went down from {a.get(k)} to {v} "
                "during the window (engine restarted?); scrape again"
            )
        out[k] = d
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _num(x: float | None) -> int | float | None:
    """A count as the metrics document holds it: a whole number as an int, no finite value as null."""
    v: int | float | None = json_safe(x, nonfinite_as_null=True)
    return int(v) if isinstance(v, float) and v.is_integer() else v


def _vllm(start: Scrape, end: Scrape) -> dict[str, Any]:
    p = "vllm:spec_decode_"
    drafts = (_delta(start, end, p + "num_drafts") or {}).get(None)
    draft_tokens = (_delta(start, end, p + "num_draft_tokens") or {}).get(None)
    accepted = (_delta(start, end, p + "num_accepted_tokens") or {}).get(None)
    per_pos = _delta(start, end, p + "num_accepted_tokens_per_pos", by="position") or {}
    positions = []
    reached = drafts
    for pos in sorted((k for k in per_pos if k is not None and k.isdigit()), key=int):
        acc = per_pos[pos]
        positions.append({
            "position": int(pos), "accepted": _num(acc), "reached": _num(reached),
            "unconditional_rate": _ratio(acc, drafts), "conditional_rate": _ratio(acc, reached),
        })  # fmt: skip
        reached = acc
    mean_acc = _ratio(accepted, drafts)
    return {
        "verify_steps": _num(drafts),
        "proposed_tokens": _num(draft_tokens),
        "accepted_tokens": _num(accepted),
        "generated_tokens": None,
        "mean_accepted_drafts": mean_acc,
        "mean_accept_length": None if mean_acc is None else 1.0 + mean_acc,
        "draft_acceptance_rate": _ratio(accepted, draft_tokens),
        "per_position": positions,
        "gauges": {},
    }


def _sglang(start: Scrape, end: Scrape) -> dict[str, Any]:
    verify = (_delta(start, end, "sglang:spec_verify_calls") or {}).get(None)
    generated = (_delta(start, end, "sglang:generation_tokens") or {}).get(None)
    length = _ratio(generated, verify)
    gauges = {}
    for name in ("sglang:spec_accept_length", "sglang:spec_accept_rate", "sglang:spec_num_draft_tokens"):
        vals = [[s.value for s in sc.samples if s.name == name] for sc in (start, end)]
        if vals[0] or vals[1]:
            gauges[name] = {"start": [_num(v) for v in vals[0]], "end": [_num(v) for v in vals[1]]}
    return {
        "verify_steps": _num(verify),
        "proposed_tokens": None,
        "accepted_tokens": None if generated is None or verify is None else _num(generated - verify),
        "generated_tokens": _num(generated),
        "mean_accepted_drafts": None if length is None else length - 1.0,
        "mean_accept_length": length,
        "draft_acceptance_rate": None,
        "per_position": [],
        "gauges": gauges,
    }


def _engine(scrape: Scrape) -> str:
    names = {s.name for s in scrape.samples}
    if any(n.startswith("vllm:spec_decode_") for n in names):
        return "vllm"
    if any(n.startswith("sglang:spec_") for n in names):
        return "sglang"
    raise InputError(
        f"{scrape.url}: no speculative-decoding metrics (vllm:spec_decode_* or sglang:spec_*) on this endpoint; "
        "is speculative decoding on, and is this the engine's metrics port (SGLang: --enable-metrics)?"
    )


def acceptance_from_scrapes(start: Scrape, end: Scrape) -> dict[str, Any]:
    """The metrics document (see the module docstring and docs/sglang.md) for one window."""
    engine = _engine(end)
    acc = _vllm(start, end) if engine == "vllm" else _sglang(start, end)
    acc["convention"] = {
        "mean_accept_length": "tokens per verify step, bonus token included",
        "mean_accepted_drafts": "accepted draft tokens per verify step, bonus excluded",
        "unconditional_rate": "accepted at position i / verify steps (vLLM style)",
        "conditional_rate": "accepted at position i / accepted at position i-1 (P(accept i | reached i))",
    }
    prefix = "vllm:spec_decode_" if engine == "vllm" else "sglang:"
    counters = []
    before = {(s.name, s.labels): s.value for s in start.samples}
    for s in end.samples:
        if s.name.startswith(prefix) and (end.types.get(s.name) == "counter" or end.types.get(_base(s.name)) == "counter"
                                          or s.name.endswith("_total")):
            counters.append({"name": s.name, "labels": dict(s.labels), "start": _num(before.get((s.name, s.labels))),
                             "end": _num(s.value), "delta": _num(s.value - before.get((s.name, s.labels), 0.0))})
    return {
        "format": METRICS_FORMAT,
        "version": 1,
        "engine": engine,
        "url": end.url,
        "window": {
            "start": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start.time)),
            "end": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(end.time)),
            "seconds": round(end.time - start.time, 3),
        },
        "acceptance": acc,
        "counters": counters,
    }


def write_metrics_bundle(doc: Mapping[str, Any], out: str | Path, *, name: str, labels: Mapping[str, str] | None = None) -> Path:
    """A bundle with no tensors whose part ``metrics`` holds ``metrics.json`` (and the same in ``extra``)."""
    from probes.core.bundle import BundleError, BundleWriter, write_json_atomic

    root = Path(out)
    if (root / "parts" / "metrics").exists():
        raise InputError(f"{root}: already holds a metrics part; choose another --out")
    acc = doc["acceptance"]
    summary = {k: acc.get(k) for k in ("verify_steps", "mean_accept_length", "mean_accepted_drafts",
                                        "draft_acceptance_rate", "accepted_tokens", "proposed_tokens",
                                        "generated_tokens")}
    summary["per_position_unconditional"] = [p["unconditional_rate"] for p in acc.get("per_position", [])]
    all_labels = {"engine": str(doc["engine"]), "source": "prometheus", **(labels or {})}
    try:
        w = BundleWriter(root, run_name=name, labels=all_labels, part="metrics",
                         manifest={"acceptance_metrics": {"window": doc["window"], "url": doc["url"], **summary}})
    except BundleError as exc:
        raise InputError(str(exc)) from None
    write_json_atomic(w.part_dir / METRICS_FILE, dict(doc))
    w.close(extra={"metrics": dict(doc)})
    return root


# -- command line ------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("url", help="the engine's Prometheus endpoint (http://host:port[/metrics])")
    parser.add_argument("--window", type=float, default=60.0, help="seconds between the two scrapes (default 60)")
    parser.add_argument("--name", required=True, help="run name")
    parser.add_argument("--out", help="bundle directory to write (default: ./<name>)")
    parser.add_argument("--label", action="append", metavar="KEY=VALUE", help="add a label (repeatable)")
    parser.add_argument("--timeout", type=float, default=10.0, help="HTTP timeout per scrape (seconds)")
    parser.add_argument("--ingest", action="store_true", help="also store the bundle as a run")
    parser.add_argument("--json", action="store_true", help="print the metrics document")


def run_from_args(args: argparse.Namespace, *, ingest: Callable[[Path], Any] | None = None) -> int:
    labels = {}
    for item in args.label or []:
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise InputError(f"label {item!r} must be KEY=VALUE")
        labels[k] = v
    start, end = scrape_window(args.url, args.window, fetch=lambda u: fetch_text(u, timeout=args.timeout))
    doc = acceptance_from_scrapes(start, end)
    out = write_metrics_bundle(doc, args.out or args.name, name=args.name, labels=labels)
    stored = ingest(out) if (args.ingest and ingest is not None) else None
    if args.json:
        print(json.dumps(doc, indent=1))
        return 0
    acc = doc["acceptance"]

    def f(x: Any) -> str:
        return "n/a" if x is None else (f"{x:.4f}" if isinstance(x, float) else str(x))

    print(f"{doc['engine']} {doc['url']}: {doc['window']['seconds']} s window, {f(acc['verify_steps'])} verify steps")
    print(f"  mean accept length (bonus incl.) {f(acc['mean_accept_length'])}, accepted drafts/step "
          f"{f(acc['mean_accepted_drafts'])}, draft acceptance rate {f(acc['draft_acceptance_rate'])}")
    for p in acc["per_position"]:
        print(f"  position {p['position']}: accepted {p['accepted']} of {p['reached']} reached; "
              f"unconditional {f(p['unconditional_rate'])}, conditional {f(p['conditional_rate'])}")
    print(f"wrote {out}" + (f"; stored as run {getattr(stored, 'name', stored)!r}" if stored is not None else ""))
    return 0
