"""The GSM8K workload probe: accuracy and acceptance of a live server on a fixed question set.

``validator probe gsm8k --url URL --data test.jsonl [--concurrency 1,8] [--out DIR] [--json]``

Sends the first ``--limit`` (64) GSM8K test questions, 5-shot, greedy, 512 output tokens, no input
truncation, and records per request the output, the answers extracted by three rules
(:mod:`validator.judging.gsm8k_scoring`), finish reason, tokens, latency and every ``spec_*`` field the server
returned; per run, the summary of docs/gsm8k.md. Each run is written as a run bundle::

    BUNDLE/manifest.json                 run name, labels (workload, concurrency, url, prompt_style, ...)
    BUNDLE/parts/gsm8k/gsm8k.jsonl       one line per request
    BUNDLE/parts/gsm8k/part.json         {"part": "gsm8k", "tensors": [], "extra": {"gsm8k_summary": ...}}

Prompt styles: ``sglang`` (shots = the first test questions, which are also the first evaluated ones:
the overlap is reported) and ``lm-eval`` (shots sampled with a fixed seed from the train split).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from validator.errors import InputError
from validator.judging.gsm8k_scoring import (
    compare_gsm8k,
    format_summary,
    question_hash,
    reference_number,
    score_output,
    summarize_rows,
)
from validator.runs.jsonlines import json_lines
from validator.runs.workload_files import PART, ROWS_FILE, load_gsm8k_rows
from validator.settings import parse_labels
from validator.workloads.gsm8k_client import APIS, ClientConfig, send_all

__all__ = [
    "PROMPT_STYLES",
    "GSM8KRun",
    "add_arguments",
    "build_prompt",
    "compare_gsm8k",
    "load_gsm8k_rows",
    "load_questions",
    "run_from_args",
    "run_gsm8k",
    "select_shots",
    "write_gsm8k_bundle",
]

PROMPT_STYLES = ("sglang", "lm-eval")
STOPS = {"sglang": ("Question", "Assistant:", "<|separator|>"), "lm-eval": ("Question:", "</s>", "<|im_end|>")}


# -- data and prompts -----------------------------------------------------------------------------------


def load_questions(path: str | os.PathLike[str], limit: int | None = None) -> list[dict[str, str]]:
    """GSM8K JSONL rows (``question``, ``answer`` ending in ``#### N``), the first ``limit`` of them."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = list(f)
    except OSError as exc:
        raise InputError(f"{path}: cannot read GSM8K data: {exc.strerror or exc}") from None
    rows: list[dict[str, str]] = []
    for n, obj in json_lines(path, lines, limit):
        if not isinstance(obj, dict) or not isinstance(obj.get("question"), str) \
                or not isinstance(obj.get("answer"), str):
            raise InputError(f"{path} line {n}: expected an object with string 'question' and 'answer'")
        if "####" not in obj["answer"]:
            raise InputError(f"{path} line {n}: the answer does not end in '#### <number>'")
        rows.append({"question": obj["question"], "answer": obj["answer"]})
    return rows


def _hub_split(split: str, limit: int | None) -> list[dict[str, str]]:
    try:
        import datasets
    except ImportError:
        raise InputError(
            f"no local GSM8K {split} file given and the 'datasets' package is not installed: pass "
            f"{'--data' if split == 'test' else '--train'} FILE (GSM8K JSONL, lines with 'question' and 'answer')"
        ) from None
    try:
        ds = datasets.load_dataset("openai/gsm8k", "main", split=split)
    except Exception as exc:  # no network, no cache, a renamed dataset: each becomes a clear error
        raise InputError(f"cannot load GSM8K {split} split from the hub ({type(exc).__name__}: {exc}); "
                         f"pass a local JSONL file instead") from None
    n = len(ds) if limit is None else min(limit, len(ds))
    return [{"question": str(ds[i]["question"]), "answer": str(ds[i]["answer"])} for i in range(n)]


def build_prompt(question: str, shots: Sequence[Mapping[str, str]]) -> str:
    """Few-shot prompt: each shot as ``Question: q\\nAnswer: a``, then the question, blocks joined by a
    blank line, ending in ``Answer:``."""
    blocks = [f"Question: {s['question']}\nAnswer: {s['answer']}" for s in shots]
    blocks.append(f"Question: {question}\nAnswer:")
    return "\n\n".join(blocks)


def select_shots(style: str, test_rows: Sequence[Mapping[str, str]], train_rows: Sequence[Mapping[str, str]] | None,
                 k: int, seed: int = 1234) -> list[dict[str, str]]:
    """``sglang``: the first ``k`` test rows. ``lm-eval``: ``k`` train rows drawn with ``random.Random(seed)``."""
    if style == "sglang":
        if len(test_rows) < k:
            raise InputError(f"{k} shots asked for but the test data has only {len(test_rows)} rows")
        return [dict(r) for r in test_rows[:k]]
    if style == "lm-eval":
        if not train_rows or len(train_rows) < k:
            raise InputError(f"lm-eval prompts need at least {k} train rows (--train FILE)")
        return [dict(r) for r in random.Random(seed).sample(list(train_rows), k)]
    raise InputError(f"prompt style must be one of {', '.join(PROMPT_STYLES)}, got {style!r}")


# -- one run ------------------------------------------------------------------------------------------


@dataclass
class GSM8KRun:
    rows: list[dict[str, Any]]
    summary: dict[str, Any]
    bundle: Path | None = None


def run_gsm8k(
    questions: Sequence[Mapping[str, str]],
    shots: Sequence[Mapping[str, str]],
    client: ClientConfig,
    concurrency: int,
    *,
    prompt_style: str = "sglang",
    progress: Callable[[int, int], None] | None = None,
) -> GSM8KRun:
    """Send every question once and score it. Never raises for a failed request."""
    shot_hashes = {question_hash(s["question"]) for s in shots}
    prompts = [build_prompt(q["question"], shots) for q in questions]
    results, total = send_all(prompts, client, concurrency, progress)
    rows = []
    for i, (q, prompt, res) in enumerate(zip(questions, prompts, results)):
        h = question_hash(q["question"])
        answers, correct = score_output(res["output"] if res["ok"] else None, q["answer"])
        rows.append({
            "index": i, "question_hash": h, "question": q["question"], "reference": reference_number(q["answer"]),
            "in_shots": h in shot_hashes, "prompt_chars": len(prompt), **res, "answers": answers, "correct": correct,
        })
    summary = summarize_rows(rows, total_time_s=total, concurrency=concurrency)
    overlap = [r["index"] for r in rows if r["in_shots"]]
    summary.update({
        "prompt_style": prompt_style, "api": client.api, "url": client.url, "shots": len(shots),
        "shot_overlap": len(overlap), "shot_overlap_indices": overlap, "max_new_tokens": client.max_new_tokens,
        "temperature": client.temperature, "stop": list(client.stop), "timeout_s": client.timeout_s,
    })
    return GSM8KRun(rows, summary)


def write_gsm8k_bundle(out: str | os.PathLike[str], run: GSM8KRun, *, run_name: str, labels: Mapping[str, str],
                       config: Mapping[str, Any] | None = None) -> Path:
    """Write one run as a bundle at ``out`` (which must not hold one yet). ``part.json`` is written last."""
    from probes.core.bundle import BUNDLE_FORMAT, BUNDLE_VERSION, write_json_atomic

    root = Path(out)
    if (root / "manifest.json").exists():
        raise InputError(f"{root}: a bundle already exists there")
    part = root / "parts" / PART
    part.mkdir(parents=True, exist_ok=True)
    write_json_atomic(root / "manifest.json", {
        "format": BUNDLE_FORMAT, "version": BUNDLE_VERSION,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "run": {"name": run_name, "labels": {str(k): str(v) for k, v in labels.items()}, "probe": "gsm8k",
                "config": dict(config or {})},
    })
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".jsonl", dir=part)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for r in run.rows:
                f.write(json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n")
        os.replace(tmp, part / ROWS_FILE)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    write_json_atomic(part / "part.json", {"part": PART, "tensors": [], "extra": {"gsm8k_summary": run.summary}})
    return root


# -- command line -------------------------------------------------------------------------------------


def _concurrencies(text: str) -> list[int]:
    try:
        out = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not out or any(c < 1 for c in out):
        raise argparse.ArgumentTypeError(f"concurrency values must be >= 1, got {text!r}")
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``validator probe gsm8k``."""
    parser.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:30000")
    parser.add_argument("--api", choices=APIS, default="sglang",
                        help="sglang: POST /generate (has spec_* fields); openai: POST /v1/completions")
    parser.add_argument("--model", default="default", help="the 'model' field of OpenAI requests")
    parser.add_argument("--data", help="GSM8K test JSONL (default: the hub's test split through 'datasets')")
    parser.add_argument("--train", help="GSM8K train JSONL for --prompt-style lm-eval (default: the hub)")
    parser.add_argument("--limit", type=int, default=64, help="questions, from the start of the file (default 64)")
    parser.add_argument("--shots", type=int, default=5, help="few-shot examples (default 5)")
    parser.add_argument("--prompt-style", choices=PROMPT_STYLES, default="sglang")
    parser.add_argument("--seed", type=int, default=1234, help="shot sampling seed for lm-eval prompts")
    parser.add_argument("--concurrency", type=_concurrencies, default=[1],
                        help="requests in flight; '1,8' does one run at each (default 1)")
    parser.add_argument("--max-new-tokens", type=int, default=512)
    parser.add_argument("--timeout", type=float, default=600.0, help="per-request timeout in seconds")
    parser.add_argument("--stop", action="append", help="stop string (repeatable; replaces the style's default)")
    parser.add_argument("--out", help="bundle directory (with several concurrencies: OUT/c<N>/ per run)")
    parser.add_argument("--name", help="run name (default gsm8k-<style>-<time>; -c<N> added for several runs)")
    parser.add_argument("--label", action="append", metavar="KEY=VALUE", help="extra run label (repeatable)")
    parser.add_argument("--json", action="store_true", help="print the run summary as JSON")




def run_from_args(args: argparse.Namespace, ingest: Callable[[Path], object] | None = None) -> int:
    """Run the probe once per concurrency; write (and, with ``ingest``, store) one bundle per run.

    Exit code: 0 every request got a valid response, 1 some did not (the runs are still written and
    reported). Bad input raises :class:`validator.errors.InputError`.
    """
    if args.limit < 1 or args.shots < 0 or args.max_new_tokens < 1 or args.timeout <= 0:
        raise InputError("--limit and --max-new-tokens must be >= 1, --shots >= 0, --timeout > 0")
    extra_labels = parse_labels(args.label)
    n_load = max(args.limit, args.shots if args.prompt_style == "sglang" else 0)
    test = load_questions(args.data, n_load) if args.data else _hub_split("test", n_load)
    questions = test[: args.limit]
    train = None
    if args.prompt_style == "lm-eval":
        train = load_questions(args.train) if args.train else _hub_split("train", None)
    shots = select_shots(args.prompt_style, test, train, args.shots, args.seed)
    client = ClientConfig(url=args.url.rstrip("/"), api=args.api, model=args.model, timeout_s=args.timeout,
                          max_new_tokens=args.max_new_tokens,
                          stop=tuple(args.stop) if args.stop else STOPS[args.prompt_style])
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    several = len(args.concurrency) > 1
    if args.out:  # refuse before sending anything, not after the runs
        for conc in args.concurrency:
            where = Path(args.out) / f"c{conc}" if several else Path(args.out)
            if (where / "manifest.json").exists():
                raise InputError(f"{where}: a bundle already exists there; choose another --out")
    summaries = []
    all_ok = True
    for conc in args.concurrency:
        run = run_gsm8k(questions, shots, client, conc, prompt_style=args.prompt_style)
        base = args.name or f"gsm8k-{args.prompt_style}-{stamp}"
        name = f"{base}-c{conc}" if several or not args.name else base
        run.summary.update({"run_name": name, "data": args.data or "hub:openai/gsm8k",
                            "workload": f"gsm8k-{len(questions)}"})
        labels = {"workload": f"gsm8k-{len(questions)}", "concurrency": str(conc), "url": client.url,
                  "prompt_style": args.prompt_style, "api": client.api, "shots": str(len(shots)),
                  "max_new_tokens": str(client.max_new_tokens), **extra_labels}
        config = {"data": run.summary["data"], "limit": args.limit, "shots": len(shots), "seed": args.seed,
                  "stop": list(client.stop), "timeout_s": client.timeout_s, "temperature": client.temperature}
        tmp_dir = None
        target: Path | None
        if args.out:
            target = Path(args.out) / f"c{conc}" if several else Path(args.out)
        elif ingest is not None:
            tmp_dir = tempfile.mkdtemp(prefix="gsm8k-")
            target = Path(tmp_dir) / name
        else:
            target = None
        try:
            if target is not None:
                run.bundle = write_gsm8k_bundle(target, run, run_name=name, labels=labels, config=config)
                if args.out:
                    run.summary["bundle"] = str(run.bundle)
                if ingest is not None:
                    ingest(run.bundle)
                    print(f"stored run {name}", file=sys.stderr)
        finally:
            if tmp_dir is not None:
                shutil.rmtree(tmp_dir, ignore_errors=True)
        all_ok = all_ok and run.summary["failed"] == 0
        summaries.append(run.summary)
        if not args.json:
            print(format_summary(run.summary))
    if args.json:
        print(json.dumps(summaries[0] if not several else {"runs": summaries}, indent=1))
    return 0 if all_ok else 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m validator.workloads.gsm8k", description=__doc__.split("\n")[0])
    add_arguments(parser)
    try:
        return run_from_args(parser.parse_args(argv))
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
