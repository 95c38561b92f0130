"""Comparing two runs: pair logical tensors, measure each pair, judge it against the policy, give a verdict.

Run A is the reference (``rel_l2 = ||b - a|| / ||a||``). Tensors pair by name and identity coordinates
(step, request, token range, layer) after shard reassembly, so a TP4 run and a TP32 run line up.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from .errors import InputError
from .metrics import MetricInputError, TensorMetrics, compare_tensors
from .policy import Decision, Policy
from .shards import LogicalKey, LogicalTensor, group_logical
from .sources import RunView

__all__ = ["PairResult", "Comparison", "compare_runs", "merge_verdicts", "VERDICT_EXIT"]

VERDICT_EXIT = {"pass": 0, "fail": 1, "inconclusive": 3}
_STATUS_ORDER = {"error": 0, "fail": 1, "inconclusive": 2, "pass": 3}


@dataclass(frozen=True)
class PairResult:
    name: str
    coords: dict[str, Any]
    label: str
    status: str  # pass | fail | inconclusive | error
    metrics: TensorMetrics | None
    decision: Decision | None
    floor_rel_l2: float | None = None
    shape_a: tuple[int, ...] = ()
    shape_b: tuple[int, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def ratio(self) -> float | None:
        """rel_l2 over the threshold applied (>1 fails); the sort key of the table."""
        if self.metrics is None or self.decision is None or not self.decision.threshold:
            return None
        return self.metrics.rel_l2 / self.decision.threshold

    @property
    def floor_ratio(self) -> float | None:
        """rel_l2 as a multiple of the noise floor's rel_l2 for the same tensor."""
        if self.metrics is None or self.floor_rel_l2 is None:
            return None
        if self.floor_rel_l2 == 0:
            return 1.0 if self.metrics.rel_l2 == 0 else float("inf")
        return self.metrics.rel_l2 / self.floor_rel_l2

    def to_dict(self) -> dict[str, Any]:
        m = self.metrics.to_dict() if self.metrics else None
        return {
            "name": self.name,
            "coords": self.coords,
            "label": self.label,
            "status": self.status,
            "rel_l2": m["rel_l2"] if m else None,
            "cosine": m["cosine"] if m else None,
            "max_abs": m["max_abs"] if m else None,
            "threshold": self.decision.threshold if self.decision else None,
            "floor_rel_l2": self.floor_rel_l2,
            "floor_ratio": self.floor_ratio,
            "limit_ratio": self.ratio,
            "reasons": list(self.decision.reasons) if self.decision else [],
            "notes": list(self.notes),
            "shape_a": list(self.shape_a),
            "shape_b": list(self.shape_b),
            "metrics": m,
        }


@dataclass
class Comparison:
    a: str
    b: str
    verdict: str
    reasons: list[str]
    pairs: list[PairResult]
    only_a: list[str]
    only_b: list[str]
    floor: tuple[str, str] | None = None
    policy: str = "defaults"
    sections: dict[str, Any] = field(default_factory=dict)  # e.g. "acceptance"

    def __bool__(self) -> bool:
        return self.verdict == "pass"

    @property
    def exit_code(self) -> int:
        return VERDICT_EXIT[self.verdict]

    def counts(self) -> dict[str, int]:
        out = {k: 0 for k in _STATUS_ORDER}
        for p in self.pairs:
            out[p.status] += 1
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "reasons": self.reasons,
            "a": self.a,
            "b": self.b,
            "floor": list(self.floor) if self.floor else None,
            "policy": self.policy,
            "counts": self.counts(),
            "pairs": [p.to_dict() for p in self.pairs],
            "only_a": self.only_a,
            "only_b": self.only_b,
            **self.sections,
        }


def _measure(la: LogicalTensor, lb: LogicalTensor) -> tuple[TensorMetrics | None, str | None, list[str]]:
    notes: list[str] = []
    ta, tb = la.materialize(), lb.materialize()
    notes += [f"A: {n}" for n in la.notes] + [f"B: {n}" for n in lb.notes]
    if tuple(ta.shape) != tuple(tb.shape):
        return None, f"shape mismatch: A {list(ta.shape)} vs B {list(tb.shape)}", notes
    try:
        return compare_tensors(ta, tb), None, notes
    except MetricInputError as exc:
        return None, str(exc), notes


def _floor_metrics(floor: tuple[RunView, RunView] | None) -> dict[LogicalKey, TensorMetrics]:
    if floor is None:
        return {}
    fa, fb = group_logical(floor[0].tensors), group_logical(floor[1].tensors)
    out = {}
    keys = sorted(fa.keys() & fb.keys(), key=lambda k: (k[0], repr(k[1])))
    for key, (m, _err, _) in zip(keys, _measure_all([(fa[k], fb[k]) for k in keys])):
        if m is not None:
            out[key] = m
    return out


def _measure_all(pairs: list[tuple[LogicalTensor, LogicalTensor]]) -> Iterator[tuple[TensorMetrics | None, str | None, list[str]]]:
    """``_measure`` of each pair, in order, several pairs at a time (the kernels release the GIL).

    At most ``workers`` pairs are loaded at once, so memory stays bounded by the largest pairs, not by
    the run; safetensors inputs are memory-mapped and read lazily.
    """
    workers = _pair_workers(len(pairs))
    if workers <= 1:
        yield from (_measure(la, lb) for la, lb in pairs)
        return
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="compare-pair") as ex:
        yield from ex.map(lambda p: _measure(*p), pairs)


def _pair_workers(n: int) -> int:
    from .kernels.cpu import threads

    return max(1, min(n, threads()))


def compare_runs(
    a: RunView,
    b: RunView,
    *,
    policy: Policy | None = None,
    floor: tuple[RunView, RunView] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Comparison:
    policy = policy or Policy()
    ga, gb = group_logical(a.tensors), group_logical(b.tensors)
    floor_m = _floor_metrics(floor)
    keys = sorted(ga.keys() & gb.keys(), key=lambda k: (k[0], repr(k[1])))
    pairs: list[PairResult] = []
    measured = _measure_all([(ga[k], gb[k]) for k in keys])
    for i, (key, (m, err, notes)) in enumerate(zip(keys, measured)):
        la, lb = ga[key], gb[key]
        fm = floor_m.get(key)
        if m is None:
            status, d = "error", Decision("fail", None, (err or "",))
        else:
            d = policy.decide(la.name, m, fm, have_floor=floor is not None, dtypes=(la.dtype, lb.dtype))
            status = d.status
        pairs.append(
            PairResult(
                name=la.name,
                coords=la.coords.to_dict(),
                label=la.label,
                status=status,
                metrics=m,
                decision=d,
                floor_rel_l2=fm.rel_l2 if fm else None,
                shape_a=la.shape(),
                shape_b=lb.shape(),
                notes=tuple(notes),
            )
        )
        if progress:
            progress(i + 1, len(keys))
    only_a = sorted(ga[k].label for k in ga.keys() - gb.keys())
    only_b = sorted(gb[k].label for k in gb.keys() - ga.keys())
    pairs.sort(key=lambda p: (_STATUS_ORDER[p.status], -(p.ratio or 0.0), p.label))
    sections: dict[str, Any] = {}
    verdicts: list[str] = []
    reasons: list[str] = []
    if ga or gb:
        v, r = _verdict(pairs, only_a, only_b, policy)
        verdicts.append(v)
        reasons += r
    if a.has_acceptance and b.has_acceptance:
        acc = _acceptance_section(a, b, policy)
        sections["acceptance"] = acc
        verdicts.append(acc["verdict"])
        reasons += [f"acceptance: {r}" for r in acc["reasons"]]
    elif a.has_acceptance or b.has_acceptance:
        reasons.append(f"acceptance records only in {'A' if a.has_acceptance else 'B'}: not compared")
    if a.engine_metrics_file is not None and b.engine_metrics_file is not None:
        from .engine_metrics import compare_engine_metrics
        from .scrape import load_metrics_doc

        opts = {k: v for k, v in policy.extra.get("acceptance", {}).items() if k in ("margin", "alpha")}
        eng = compare_engine_metrics(load_metrics_doc(a.engine_metrics_file), load_metrics_doc(b.engine_metrics_file), **opts)
        sections["engine_metrics"] = eng
        verdicts.append(eng["verdict"])
        reasons += [f"engine metrics: {r}" for r in eng["reasons"]]
    if a.gsm8k_file is not None and b.gsm8k_file is not None:
        gsm = _gsm8k_section(a, b)
        sections["gsm8k"] = gsm
        verdicts.append(gsm["verdict"])
        reasons += [f"gsm8k: {r}" for r in gsm["reasons"]]
    for side, view in (("A", a), ("B", b)):
        cov = view.manifest.get("coverage")
        if isinstance(cov, dict) and not cov.get("ok", True):
            verdicts.append("fail")
            reasons += [f"{side}: capture coverage: {p}" for p in cov.get("problems", [])] or [f"{side}: capture coverage incomplete"]
    if not verdicts:
        verdicts.append("inconclusive")
        reasons.append("nothing to compare: neither tensors nor acceptance records in both runs")
    return Comparison(
        a=a.name,
        b=b.name,
        verdict=merge_verdicts(*verdicts),
        reasons=reasons,
        pairs=pairs,
        only_a=only_a,
        only_b=only_b,
        floor=(floor[0].name, floor[1].name) if floor else None,
        policy=policy.source,
        sections=sections,
    )


GSM8K_ALPHA = 0.05


def _gsm8k_section(a: RunView, b: RunView) -> dict[str, Any]:
    """Accuracy on the questions both runs answered; fails when B loses significantly (exact McNemar)."""
    from .gsm8k import compare_gsm8k, load_gsm8k_rows

    assert a.gsm8k_file is not None and b.gsm8k_file is not None
    doc = compare_gsm8k(load_gsm8k_rows(a.gsm8k_file), load_gsm8k_rows(b.gsm8k_file), names=(a.name, b.name))
    lost, gained, p = doc["lost"], doc["gained"], doc["mcnemar_p"]
    if not doc["matched"]:
        verdict, reasons = "inconclusive", ["no GSM8K question in common"]
    elif lost > gained and p is not None and p < GSM8K_ALPHA:
        verdict, reasons = "fail", [f"accuracy fell by {-doc['delta']:.4f}: {lost} lost vs {gained} gained (McNemar p={p:.3g})"]
    else:
        verdict = "pass"
        reasons = [f"{lost} question(s) lost, {gained} gained of {doc['matched']} (McNemar p={p:.3g}): no significant loss"]
    return {**doc, "verdict": verdict, "reasons": reasons}


_ACCEPTANCE_KEYS = {"margin", "alpha", "power", "resamples", "seed", "min_reached", "min_requests"}


def _acceptance_section(a: RunView, b: RunView, policy: Policy) -> dict[str, Any]:
    """Per-position acceptance divergence (validator.acceptance_stats), as a report section."""
    from .acceptance_stats import compare_acceptance

    opts = dict(policy.extra.get("acceptance", {}))
    unknown = set(opts) - _ACCEPTANCE_KEYS
    if unknown:
        raise InputError(f"{policy.source}: unknown [acceptance] key(s) {sorted(unknown)}; known: {sorted(_ACCEPTANCE_KEYS)}")
    df_a, df_b = a.load_acceptance(), b.load_acceptance()  # bad records: their own error, naming the file
    try:
        result = compare_acceptance(df_a, df_b, labels=("A", "B"), **opts)
    except (TypeError, ValueError) as exc:
        if isinstance(exc, InputError):
            raise
        raise InputError(f"{policy.source}: bad [acceptance] settings: {exc}") from None
    return {**result.to_dict(), "table": result.format_table()}


def _verdict(pairs: list[PairResult], only_a: list[str], only_b: list[str], policy: Policy) -> tuple[str, list[str]]:
    reasons: list[str] = []
    failed = [p for p in pairs if p.status in ("fail", "error")]
    for p in failed[:20]:
        reasons.append(f"{p.label}: {'; '.join(p.decision.reasons) if p.decision else p.status}")
    if len(failed) > 20:
        reasons.append(f"... and {len(failed) - 20} more failing pairs")
    missing = len(only_a) + len(only_b)
    if missing:
        reasons.append(f"{len(only_a)} tensor(s) only in A, {len(only_b)} only in B")
    if failed or (missing and policy.missing == "fail"):
        return "fail", reasons
    undecided = [p for p in pairs if p.status == "inconclusive"]
    if not pairs:
        return "inconclusive", reasons + ["no tensors in common to compare"]
    if undecided:
        return "inconclusive", reasons + [f"{len(undecided)} pair(s) could not be judged (no noise floor)"]
    return "pass", reasons or [f"all {len(pairs)} pairs within thresholds"]


def merge_verdicts(*verdicts: str) -> str:
    if "fail" in verdicts:
        return "fail"
    if "inconclusive" in verdicts:
        return "inconclusive"
    return "pass"
