"""GSM8K scoring: answer extraction (three rules), the per-run summary and the two-run comparison. Pure.

Rules (see docs/gsm8k.md):

- ``sglang``: the last run of digits in the output after removing commas, as an int; no digits gives the
  invalid value -9999999. The reference is scored the same way, so signs and decimals are ignored alike.
- ``strict``: lm-eval's strict-match, the first ``#### <number>`` in the output.
- ``flexible``: lm-eval's flexible-extract, the last number-like match anywhere in the output.

The two lm-eval rules compare strings after lm-eval's normalisation of both sides (commas, ``$``,
everything up to ``#### `` and one trailing ``.`` removed; case ignored).
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = [
    "INVALID",
    "RULES",
    "compare_gsm8k",
    "flexible_answer",
    "format_comparison",
    "format_summary",
    "question_hash",
    "reference_number",
    "score_output",
    "sglang_answer",
    "strict_answer",
    "summarize_rows",
]

INVALID = -9999999
RULES = ("sglang", "strict", "flexible")
_DIGITS = re.compile(r"\d+")
_STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
_FLEXIBLE = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")
_IGNORE = (re.compile(","), re.compile(r"\$"), re.compile(r"(?s).*#### "), re.compile(r"\.$"))


def question_hash(question: str) -> str:
    return hashlib.sha256(question.strip().encode("utf-8")).hexdigest()[:16]


def sglang_answer(text: str) -> int:
    found = _DIGITS.findall(text.replace(",", ""))
    return int(found[-1]) if found else INVALID


def strict_answer(text: str) -> str | None:
    m = _STRICT.search(text)
    return m.group(1) if m else None


def flexible_answer(text: str) -> str | None:
    found = _FLEXIBLE.findall(text)
    if not found:
        return None
    return next((g for g in found[-1] if g), None)


def _lm_eval_norm(s: str) -> str:
    for rx in _IGNORE:
        s = rx.sub("", s)
    return s.strip().lower()


def reference_number(answer: str) -> str:
    """The reference answer of a GSM8K ``answer`` field: the text after ``####``, commas removed."""
    if "####" not in answer:
        raise ValueError("a GSM8K answer must end in '#### <number>'")
    return answer.rsplit("####", 1)[1].strip().replace(",", "")


def score_output(output: str | None, reference_answer: str) -> tuple[dict[str, Any], dict[str, bool]]:
    """Extracted answers and correctness for each rule. A failed request (``output`` None) is wrong."""
    if output is None:
        return {"sglang": None, "strict": None, "flexible": None}, {r: False for r in RULES}
    answers: dict[str, Any] = {
        "sglang": sglang_answer(output),
        "strict": strict_answer(output),
        "flexible": flexible_answer(output),
    }
    ref_int = sglang_answer(reference_answer)
    ref_str = _lm_eval_norm(reference_answer)
    correct = {
        "sglang": answers["sglang"] != INVALID and answers["sglang"] == ref_int,
        "strict": answers["strict"] is not None and _lm_eval_norm(answers["strict"]) == ref_str,
        "flexible": answers["flexible"] is not None and _lm_eval_norm(answers["flexible"]) == ref_str,
    }
    return answers, correct


# -- one run ------------------------------------------------------------------------------------------


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _histogram(spec: Mapping[str, Any]) -> list[int] | None:
    h = spec.get("spec_accept_histogram", spec.get("spec_correct_drafts_histogram"))
    if isinstance(h, list) and all(_int(x) is not None for x in h):
        return list(h)
    return None


def _percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    k = (len(s) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def summarize_rows(rows: Sequence[Mapping[str, Any]], *, total_time_s: float, concurrency: int) -> dict[str, Any]:
    """The run summary from per-request rows (see :func:`validator.workloads.gsm8k.run_gsm8k` for the row format)."""
    n = len(rows)
    ok = [r for r in rows if r.get("ok")]
    acc = {rule: _ratio(sum(bool(r["correct"][rule]) for r in rows), n) for rule in RULES}
    kept = [r for r in rows if not r.get("in_shots")]
    errors: dict[str, int] = {}
    for r in rows:
        if not r.get("ok"):
            kind = str(r.get("error_kind") or "error")
            errors[kind] = errors.get(kind, 0) + 1
    tokens = sum(_int(r.get("completion_tokens")) or 0 for r in ok)
    # accept length, SGLang convention: completion tokens over verify steps, summed over requests
    spec_rows = [r for r in ok if (_int(r["spec"].get("spec_verify_ct")) or 0) > 0
                 and _int(r.get("completion_tokens")) is not None]
    verify = sum(r["spec"]["spec_verify_ct"] for r in spec_rows)
    correct_rows = [r for r in spec_rows if _int(r["spec"].get("spec_num_correct_drafts")) is not None]
    prop_rows = [r for r in correct_rows if _int(r["spec"].get("spec_num_proposed_drafts")) is not None]
    hist: list[int] | None = None
    for r in ok:
        h = _histogram(r["spec"])
        if h is None:
            continue
        hist = hist if hist is not None else []
        hist.extend([0] * (len(h) - len(hist)))
        for i, x in enumerate(h):
            hist[i] += x
    lat = [float(r["latency_s"]) for r in ok if r.get("latency_s") is not None]
    return {
        "questions": n,
        "accuracy": acc["sglang"],
        "accuracy_strict": acc["strict"],
        "accuracy_flexible": acc["flexible"],
        "accuracy_excluding_shots": _ratio(sum(bool(r["correct"]["sglang"]) for r in kept), len(kept)),
        "correct": sum(bool(r["correct"]["sglang"]) for r in rows),
        "invalid_answers": sum(1 for r in ok if r["answers"]["sglang"] == INVALID),
        "completed": len(ok),
        "completion_rate": _ratio(len(ok), n),
        "failed": n - len(ok),
        "errors": errors,
        "truncated": sum(1 for r in ok if r.get("finish_reason") == "length"),
        "completion_tokens": tokens,
        "mean_accept_length": _ratio(sum(r["completion_tokens"] for r in spec_rows), verify),
        "mean_accepted_drafts": _ratio(sum(r["spec"]["spec_num_correct_drafts"] for r in correct_rows),
                                       sum(r["spec"]["spec_verify_ct"] for r in correct_rows)),
        "accept_rate": _ratio(sum(r["spec"]["spec_num_correct_drafts"] for r in prop_rows),
                              sum(r["spec"]["spec_num_proposed_drafts"] for r in prop_rows)),
        "spec_verify_ct": verify,
        "spec_requests": len(spec_rows),
        "accept_histogram": hist,
        "output_tokens_per_s": _ratio(tokens, total_time_s),
        "total_time_s": total_time_s,
        "concurrency": concurrency,
        "latency_mean_s": _ratio(sum(lat), len(lat)),
        "latency_p50_s": _percentile(lat, 0.5),
        "latency_p90_s": _percentile(lat, 0.9),
    }


def _fmt(v: Any, spec: str = ".4f") -> str:
    if v is None:
        return "n/a"
    return format(v, spec) if isinstance(v, float) else str(v)


def format_summary(s: Mapping[str, Any]) -> str:
    lines = [
        (f"GSM8K  {s.get('questions')} questions  concurrency {s.get('concurrency')}  "
        f"prompt {s.get('prompt_style', '?')}  {s.get('url', '')}"),
        (f"  accuracy {_fmt(s.get('accuracy'))} (sglang rule)   strict-match {_fmt(s.get('accuracy_strict'))}"
        f"   flexible-extract {_fmt(s.get('accuracy_flexible'))}"),
        (f"  shots overlapping evaluated questions: {s.get('shot_overlap', 0)}"
        f"   accuracy without them {_fmt(s.get('accuracy_excluding_shots'))}"),
        (f"  completed {s.get('completed')}/{s.get('questions')} (rate {_fmt(s.get('completion_rate'))})"
        f"   errors {s.get('errors') or 'none'}   truncated {s.get('truncated')}"
        f"   invalid answers {s.get('invalid_answers')}"),
        (f"  accept length {_fmt(s.get('mean_accept_length'), '.3f')} (incl. bonus)"
        f"   accepted drafts/step {_fmt(s.get('mean_accepted_drafts'), '.3f')}"
        f"   accept rate {_fmt(s.get('accept_rate'), '.3f')}   histogram {s.get('accept_histogram')}"),
        (f"  {s.get('completion_tokens')} output tokens in {_fmt(s.get('total_time_s'), '.2f')} s"
        f" = {_fmt(s.get('output_tokens_per_s'), '.1f')} tok/s   latency mean {_fmt(s.get('latency_mean_s'), '.3f')} s"
        f" p90 {_fmt(s.get('latency_p90_s'), '.3f')} s"),
    ]
    return "\n".join(lines)


# -- two runs -----------------------------------------------------------------------------------------


def _mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value on the discordant pairs (binomial, p = 1/2)."""
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(b, c) + 1)) / 2.0**n
    return min(1.0, 2.0 * tail)


def _index(rows: Iterable[Mapping[str, Any]]) -> tuple[dict[str, Mapping[str, Any]], int]:
    out: dict[str, Mapping[str, Any]] = {}
    dup = 0
    for r in rows:
        h = r.get("question_hash") or question_hash(str(r.get("question", "")))
        if h in out:
            dup += 1
            continue
        out[h] = r
    return out, dup


def compare_gsm8k(
    rows_a: Sequence[Mapping[str, Any]],
    rows_b: Sequence[Mapping[str, Any]],
    *,
    rule: str = "sglang",
    names: tuple[str, str] = ("A", "B"),
    max_listed: int = 50,
) -> dict[str, Any]:
    """Compare run B against reference A on the questions both ran (matched by question text hash).

    Returns accuracies on the matched questions, the delta (B - A), the questions whose correctness
    flipped (with both outputs and extracted answers), an exact McNemar p-value on the flips, and a
    ``table`` string. A failed request counts as wrong.
    """
    if rule not in RULES:
        raise ValueError(f"rule must be one of {', '.join(RULES)}, got {rule!r}")
    a, dup_a = _index(rows_a)
    b, dup_b = _index(rows_b)
    common = [h for h in a if h in b]
    flips = []
    right_a = right_b = 0
    for h in common:
        ra, rb = a[h], b[h]
        ca, cb = bool(ra["correct"][rule]), bool(rb["correct"][rule])
        right_a += ca
        right_b += cb
        if ca != cb:
            flips.append({
                "question_hash": h,
                "index_a": ra.get("index"),
                "index_b": rb.get("index"),
                "direction": "lost" if ca else "gained",
                "question": ra.get("question"),
                "reference": ra.get("reference"),
                "answer_a": ra["answers"][rule],
                "answer_b": rb["answers"][rule],
                "output_a": ra.get("output"),
                "output_b": rb.get("output"),
                "error_a": ra.get("error"),
                "error_b": rb.get("error"),
            })
    lost = sum(1 for f in flips if f["direction"] == "lost")
    gained = len(flips) - lost
    n = len(common)
    acc_a, acc_b = _ratio(right_a, n), _ratio(right_b, n)
    result: dict[str, Any] = {
        "rule": rule,
        "names": list(names),
        "matched": n,
        "only_in_a": len(a) - n,
        "only_in_b": len(b) - n,
        "duplicates_a": dup_a,
        "duplicates_b": dup_b,
        "accuracy_a": acc_a,
        "accuracy_b": acc_b,
        "delta": None if acc_a is None or acc_b is None else acc_b - acc_a,
        "lost": lost,
        "gained": gained,
        "mcnemar_p": _mcnemar_exact(lost, gained),
        "flips": flips,
    }
    result["table"] = format_comparison(result, max_listed=max_listed)
    return result


def _short(text: Any, width: int = 60) -> str:
    s = " ".join(str(text).split()) if text is not None else "-"
    return s if len(s) <= width else s[: width - 3] + "..."


def format_comparison(c: Mapping[str, Any], max_listed: int = 50) -> str:
    na, nb = c["names"]
    lines = [
        (f"GSM8K  {nb} vs {na}  ({c['matched']} matched questions, rule {c['rule']};"
        f" only in {na}: {c['only_in_a']}, only in {nb}: {c['only_in_b']})"),
        f"  accuracy {na} {_fmt(c['accuracy_a'])}   {nb} {_fmt(c['accuracy_b'])}   delta {_fmt(c['delta'], '+.4f')}",
        (f"  flipped: {c['lost']} lost (right in {na}, wrong in {nb}), {c['gained']} gained;"
        f" exact McNemar p = {c['mcnemar_p']:.3g}"),
    ]
    for f in c["flips"][:max_listed]:
        a = f["answer_a"] if f["error_a"] is None else f"error: {f['error_a']}"
        b = f["answer_b"] if f["error_b"] is None else f"error: {f['error_b']}"
        lines.append(f"  {f['direction']:>6}  {f['question_hash']}  ref {f['reference']}  {na}: {_short(a, 30)}"
                     f"  {nb}: {_short(b, 30)}  | {_short(f['question'])}")
    if len(c["flips"]) > max_listed:
        lines.append(f"  ... {len(c['flips']) - max_listed} more")
    return "\n".join(lines)
