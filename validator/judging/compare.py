"""Comparing two runs: pair logical tensors, measure each pair, judge it against the policy, give a verdict.

Run A is the reference (``rel_l2 = ||b - a|| / ||a||``). Tensors pair by name and identity coordinates
(step, request, token range, layer) after shard reassembly, so a TP4 run and a TP32 run line up.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, NamedTuple

from validator.errors import InputError
from validator.judging.exit_codes import VERDICT_EXIT
from validator.judging.frontier import Frontier, Node, divergence_frontier
from validator.judging.policy import Decision, Floor, Policy, fail_level
from validator.judging.pooling import Member, PooledUnit, judge_units, plan_units, settled
from validator.judging.text import fmt_interval, fmt_judged, frontier_note
from validator.numerics.floors import BlockSums, measure_blocks_many, more_precise, rounding_sums
from validator.numerics.jsonsafe import json_safe
from validator.numerics.metrics import MetricInputError, TensorMetrics
from validator.runs.reassembly import LogicalKey, LogicalTensor, group_logical, materialize_many
from validator.runs.view import RunView

if TYPE_CHECKING:
    from validator.numerics.host import Array

__all__ = [
    "PairResult", "Comparison", "Measured", "PairExecutor", "PairToMeasure", "compare_runs", "measure_pair", "measure_tensors", "floor_from", "merge_verdicts",
    "pair_frontier", "tensor_verdict",
]

_STATUS_ORDER = {"error": 0, "fail": 1, "inconclusive": 2, "pass": 3}


@dataclass(frozen=True)
class PairResult:
    name: str
    coords: dict[str, Any]
    label: str
    status: str  # pass | fail | inconclusive | error
    metrics: TensorMetrics | None
    decision: Decision | None
    shape_a: tuple[int, ...] = ()
    shape_b: tuple[int, ...] = ()
    notes: tuple[str, ...] = ()
    capture_index: int | None = None  # the tensor's place in run A's capture order (records as written)
    pooled_pass: bool = False  # inconclusive alone (its interval too wide), settled by its name's passing pooled unit

    @property
    def floor_rel_l2(self) -> float | None:
        """The rel_l2 of the floor this pair was judged against (measured or rounding)."""
        return self.decision.floor_rel_l2 if self.decision else None

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
        """JSON-safe (non-finite floats as the strings "inf", "-inf", "nan", as in ``TensorMetrics``)."""
        m = self.metrics.to_dict() if self.metrics else None
        d = self.decision
        return {
            "name": self.name,
            "coords": self.coords,
            "label": self.label,
            "status": self.status,
            "rel_l2": m["rel_l2"] if m else None,
            "cosine": m["cosine"] if m else None,
            "max_abs": m["max_abs"] if m else None,
            "threshold": json_safe(d.threshold) if d else None,
            "floor_rel_l2": json_safe(d.floor_rel_l2) if d else None,
            "floor_ratio": json_safe(self.floor_ratio),
            "limit_ratio": json_safe(self.ratio),
            "floor_kind": d.floor_kind if d else None,
            "judged": d.judged if d else None,
            "value": json_safe(d.value) if d else None,
            "interval": [json_safe(x) for x in d.interval] if d and d.interval else None,
            "limit": json_safe(d.limit) if d else None,
            "borderline": d.borderline if d else False,
            "reasons": list(d.reasons) if d else [],
            "notes": [*self.notes, *d.notes] if d else list(self.notes),
            "shape_a": list(self.shape_a),
            "shape_b": list(self.shape_b),
            "capture_index": self.capture_index,
            "fail_bound": json_safe(d.fail_bound) if d and d.fail_bound is not None else None,
            "pooled_pass": self.pooled_pass,
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
    headline: str = ""  # the deciding reason of the verdict, one line
    frontier: Frontier | None = None  # where the runs first part (judging.frontier); None: of ``pairs``, when asked
    pooled: list[PooledUnit] = field(default_factory=list)  # the pairs of one capture point judged together

    def divergence(self) -> Frontier:
        """The frontier stored with the comparison, or that of its pairs (one built by hand)."""
        return self.frontier if self.frontier is not None else pair_frontier(self.pairs)

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

    def pooled_counts(self) -> dict[str, int]:
        """Pooled units by status, and the pairs settled by pooling (``pooled_pass``)."""
        out = {k: 0 for k in ("fail", "inconclusive", "pass")}
        for u in self.pooled:
            out[u.status] += 1
        out["settled_pairs"] = sum(p.pooled_pass for p in self.pairs)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "headline": self.headline,
            "reasons": self.reasons,
            **self.divergence().to_dict(),
            "a": self.a,
            "b": self.b,
            "floor": list(self.floor) if self.floor else None,
            "policy": self.policy,
            "counts": self.counts(),
            "pooled_counts": self.pooled_counts(),
            "pairs": [p.to_dict() for p in self.pairs],
            "pooled": [u.to_dict() for u in self.pooled],
            "only_a": self.only_a,
            "only_b": self.only_b,
            **self.sections,
        }


@dataclass
class Measured:
    """One pair measured: its metrics (or why not), its block sums for the interval and NaN counts, and
    the reference's rounding floor when one was asked for."""

    metrics: TensorMetrics | None
    error: str | None
    notes: list[str] = field(default_factory=list)
    blocks: BlockSums | None = None
    rounding: BlockSums | None = None

    @property
    def usable_as_floor(self) -> bool:
        """Measured, with no NaN and no Inf difference: fit to be another pair's floor."""
        if self.metrics is None or self.metrics.nonfinite_mismatch:
            return False
        return self.blocks is None or not (self.blocks.nan_a or self.blocks.nan_b)


def measure_tensors(ta: Array, tb: Array, *, rounding_dtype: str | None = None) -> Measured:
    """The metrics of a pair of equal-shape tensors and its block sums; with ``rounding_dtype``, also the
    rounding floor of ``ta`` in that dtype."""
    return measure_tensors_many([(ta, tb, rounding_dtype)])[0]


def measure_tensors_many(pairs: list[tuple[Array, Array, str | None]]) -> list[Measured]:
    """:func:`measure_tensors` of each ``(ta, tb, rounding_dtype)``, in order; the small pairs on the CPU
    are measured together, in one pass of the engine (``floors.measure_blocks_many``), with the same bits."""
    same = [tuple(ta.shape) == tuple(tb.shape) for ta, tb, _ in pairs]
    got = iter(measure_blocks_many([(ta, tb) for (ta, tb, _), ok in zip(pairs, same) if ok]))
    out = []
    for (ta, tb, rounding_dtype), ok in zip(pairs, same):
        if not ok:
            out.append(Measured(None, f"shape mismatch: A {list(ta.shape)} vs B {list(tb.shape)}"))
            continue
        r = next(got)
        if isinstance(r, MetricInputError):
            out.append(Measured(None, str(r)))
        elif not (ta.is_floating_point() and tb.is_floating_point()):
            out.append(Measured(r[0], None))
        else:
            out.append(Measured(r[0], None, blocks=r[1], rounding=rounding_sums(ta, rounding_dtype) if rounding_dtype else None))
    return out


def floor_from(floor_pair: Measured | None, pair: Measured, *, have_floor: bool) -> Floor:
    """The floor ``pair`` is judged against: the floor pair's measurement when it has this tensor and it
    is usable, else the rounding floor, else none with the reason."""
    note = ""
    if floor_pair is not None and floor_pair.metrics is not None:
        if floor_pair.usable_as_floor:
            return Floor("measured", floor_pair.metrics.rel_l2, floor_pair.blocks)
        note = "the floor pair has NaN or differing Inf for this tensor: its measured floor is not used"
    if pair.rounding is not None and pair.rounding.rel_l2 > 0:
        return Floor("rounding", pair.rounding.rel_l2, pair.rounding, note=note)
    why = note or ("not in the floor pair" if have_floor else "no floor pair given")
    if pair.rounding is not None:
        return Floor("none", reason=f"{why}; the reference is exact in the candidate's dtype")
    return Floor("none", reason=f"{why}; the reference is not more precise than the candidate")


def _measure(la: LogicalTensor, lb: LogicalTensor, rounding: bool = False) -> Measured:
    return _measure_loaded([PairToMeasure(la, lb, rounding)], [la.materialize()], [lb.materialize()])[0]


# the measurement of one pair that compare_runs maps over the pairs: the public name an executor documents
measure_pair = _measure


def _measure_batch(pairs: list[PairToMeasure]) -> list[Measured]:
    """``_measure`` of each pair, the pairs' tensors read side by side (``materialize_many``: small pairs) and
    measured in one pass of the engine."""
    return _measure_loaded(pairs, materialize_many([p.a for p in pairs]), materialize_many([p.b for p in pairs]))


def _measure_loaded(pairs: list[PairToMeasure], ta: Sequence[Array], tb: Sequence[Array]) -> list[Measured]:
    """``_measure`` of each pair, its tensors loaded already (``ta``, ``tb``)."""
    loaded = [(a, b, p.b.dtype if p.rounding_floor and more_precise(p.a.dtype, p.b.dtype) else None) for a, b, p in zip(ta, tb, pairs)]
    got = measure_tensors_many(loaded)
    for m, p in zip(got, pairs):
        if p.a.notes or p.b.notes:
            m.notes = [f"A: {n}" for n in p.a.notes] + [f"B: {n}" for n in p.b.notes]
    return got


class PairToMeasure(NamedTuple):
    """One pair a comparison measures: run A's tensor, run B's, and whether to measure A's rounding floor too
    (A rounded to B's dtype, when A is the more precise: the floor a pair with no measured floor is judged
    against)."""

    a: LogicalTensor
    b: LogicalTensor
    rounding_floor: bool


# Maps a measurement over pairs and yields the results in the pairs' order: the seam where a comparison's
# measurements can run elsewhere (validator.executors: on a Ray cluster). ``measure`` is a module-level
# function, so it can be sent by reference. An executor either calls it on each pair unchanged, or (for a pair
# too large for one task) builds the same ``Measured`` from validator.numerics.ranges' range partials, merged in
# the engine's order: the bits must be those of ``measure``.
PairExecutor = Callable[[Callable[[LogicalTensor, LogicalTensor, bool], Measured], list[PairToMeasure]], Iterable[Measured]]


def _floor_pairs(floor: tuple[RunView, RunView] | None, executor: PairExecutor | None = None) -> dict[LogicalKey, Measured]:
    if floor is None:
        return {}
    fa, fb = group_logical(floor[0].tensors), group_logical(floor[1].tensors)
    keys = sorted(fa.keys() & fb.keys(), key=lambda k: (k[0], repr(k[1])))
    measured = _measure_all([PairToMeasure(fa[k], fb[k], rounding_floor=False) for k in keys], executor)
    return {key: got for key, got in zip(keys, measured) if got.metrics is not None}


def _measure_all(pairs: list[PairToMeasure], executor: PairExecutor | None = None) -> Iterator[Measured]:
    """``_measure`` of each pair, in order, with the same bits (:func:`_measure_batches`, one by one)."""
    for batch in _measure_batches(pairs, executor):
        yield from batch


def _measure_batches(pairs: list[PairToMeasure], executor: PairExecutor | None = None) -> Iterator[list[Measured]]:
    """``_measure`` of each pair, in order, with the same bits, in lists: when every pair is small (at most
    SMALL_PAIR elements), BATCH_ELEMS elements of pairs at a time, measured in one pass of the engine; else a
    pair at a time, several pairs at once on threads (the kernels release the GIL).

    At most ``workers`` pairs (or one batch) are loaded at once, so memory stays bounded by the largest
    pairs, not by the run; safetensors inputs are memory-mapped and read lazily. With ``executor``, it maps
    ``_measure`` over the pairs instead (the same function on each pair, so the same results).
    """
    if executor is not None:
        for got in executor(_measure, pairs):
            yield [got]
        return
    workers = _pair_workers(len(pairs))
    sizes = [_elements(p.a) for p in pairs]
    if workers <= 1 or max(sizes) <= SMALL_PAIR:
        # small pairs: measured in the calling thread, BATCH_ELEMS at a time in one pass of the engine
        for batch in _batches(pairs, sizes):
            yield _measure_batch(batch)
        return
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="compare-pair") as ex:
        for got in ex.map(lambda p: _measure(*p), pairs):
            yield [got]


SMALL_PAIR = 1 << 18  # elements: pairs no larger are measured in the calling thread
BATCH_ELEMS = 1 << 20  # elements of the pairs loaded and measured together (bounds the memory a batch holds)


def _batches(pairs: list[PairToMeasure], sizes: list[int]) -> Iterator[list[PairToMeasure]]:
    """The pairs in order, in runs of at most BATCH_ELEMS elements (``sizes``: each pair's; a larger pair alone)."""
    batch: list[PairToMeasure] = []
    size = 0
    for p, n in zip(pairs, sizes):
        if batch and size + n > BATCH_ELEMS:
            yield batch
            batch, size = [], 0
        batch.append(p)
        size += n
    if batch:
        yield batch


def _elements(t: LogicalTensor) -> int:
    return math.prod(t.shape())


def _pair_workers(n: int) -> int:
    return max(1, min(n, os.cpu_count() or 1))


def compare_runs(
    a: RunView,
    b: RunView,
    *,
    policy: Policy | None = None,
    floor: tuple[RunView, RunView] | None = None,
    progress: Callable[[int, int], None] | None = None,
    executor: PairExecutor | None = None,
) -> Comparison:
    """``executor``: where the pairs are measured (default: this process, see ``_measure_batches``)."""
    policy = policy or Policy()
    ga, gb = group_logical(a.tensors), group_logical(b.tensors)
    floor_m = _floor_pairs(floor, executor)
    keys = sorted(ga.keys() & gb.keys(), key=lambda k: (k[0], repr(k[1])))
    captured = {k: i for i, k in enumerate(ga)}  # run A's records in the order they were written
    pairs: list[PairResult] = []
    have = floor is not None
    both = [(ga[k], gb[k]) for k in keys]
    dtypes = [(la.dtype, lb.dtype) for la, lb in both]
    rounding = [not (k in floor_m and floor_m[k].usable_as_floor) and policy.effective_rule(k[0], dt, have_floor=have).floor_multiple is not None for k, dt in zip(keys, dtypes)]
    work = [PairToMeasure(la, lb, r) for (la, lb), r in zip(both, rounding)]
    plan = plan_units([(la.name, la.coords.to_dict()) for la, _ in both])
    units = len(keys) + len(plan)  # every unit judged counts in the FAIL level (policy.fail_level)
    members: list[Member | None] = []
    for batch in _measure_batches(work, executor):  # judged as measured, a batch at a time: its intervals drawn together
        done = len(pairs)
        got = list(zip(keys[done : done + len(batch)], work[done : done + len(batch)], batch, dtypes[done : done + len(batch)]))
        judging = [
            (todo.a.name, g.metrics, floor_from(floor_m.get(key), g, have_floor=have), dt, g.blocks)
            for key, todo, g, dt in got
            if g.metrics is not None
        ]
        decisions = iter(policy.decide_many(judging, have_floor=have, units=units))
        floors = iter([fl for _, _, fl, _, _ in judging])
        for key, todo, g, _ in got:
            la, lb = todo.a, todo.b
            if g.metrics is None:
                status, d = "error", Decision("fail", None, (g.error or "",))
                members.append(None)
            else:
                d = next(decisions)
                disagree = tuple(n for n in g.notes if "declared replicas disagree" in n)  # reassembly.replica_note
                if disagree:  # copies the layout declares replicated differ: the pair fails, naming their ranks
                    d = replace(d, status="fail", reasons=(*d.reasons, *disagree), borderline=False)
                status = d.status
                members.append(_member(d, g, next(floors)))
            pairs.append(
                PairResult(
                    name=la.name,
                    coords=la.coords.to_dict(),
                    label=la.label,
                    status=status,
                    metrics=g.metrics,
                    decision=d,
                    shape_a=la.shape(),
                    shape_b=lb.shape(),
                    notes=tuple(g.notes),
                    capture_index=captured[key],
                )
            )
            if progress:
                progress(len(pairs), len(keys))
    pooled = judge_units(plan, members, level=fail_level(units))
    by_pool = settled(pooled)
    pairs = [replace(p, pooled_pass=True) if i in by_pool and p.status == "inconclusive" and p.decision is not None
             and p.decision.borderline else p for i, p in enumerate(pairs)]
    only_a = sorted(ga[k].label for k in ga.keys() - gb.keys())
    only_b = sorted(gb[k].label for k in gb.keys() - ga.keys())
    pairs.sort(key=lambda p: (_STATUS_ORDER[p.status], -(p.ratio or 0.0), p.label))
    front = pair_frontier(pairs)
    sections: dict[str, Any] = {}
    verdicts: list[str] = []
    reasons: list[str] = []
    deciding: list[tuple[str, str]] = []  # (a section's verdict, its deciding reason)
    if ga or gb:
        v, r = tensor_verdict(pairs, only_a, only_b, policy, front, pooled)
        verdicts.append(v)
        reasons += r
        deciding.append((v, r[0] if r else v))
    if a.has_acceptance and b.has_acceptance:
        acc = _acceptance_section(a, b, policy)
        sections["acceptance"] = acc
        verdicts.append(acc["verdict"])
        reasons += [f"acceptance: {r}" for r in acc["reasons"]]
        deciding.append((acc["verdict"], "acceptance: " + (acc["reasons"] or [acc["verdict"]])[0]))
    elif a.has_acceptance or b.has_acceptance:
        reasons.append(f"acceptance records only in {'A' if a.has_acceptance else 'B'}: not compared")
    if a.engine_metrics_file is not None and b.engine_metrics_file is not None:
        from validator.judging.engine_metrics import compare_engine_metrics
        from validator.runs.workload_files import load_metrics_doc

        opts = {k: v for k, v in policy.extra.get("acceptance", {}).items() if k in ("margin", "alpha")}
        eng = compare_engine_metrics(load_metrics_doc(a.engine_metrics_file), load_metrics_doc(b.engine_metrics_file), **opts)
        sections["engine_metrics"] = eng
        verdicts.append(eng["verdict"])
        reasons += [f"engine metrics: {r}" for r in eng["reasons"]]
        deciding.append((eng["verdict"], "engine metrics: " + (eng["reasons"] or [eng["verdict"]])[0]))
    if a.gsm8k_file is not None and b.gsm8k_file is not None:
        gsm = _gsm8k_section(a, b)
        sections["gsm8k"] = gsm
        verdicts.append(gsm["verdict"])
        reasons += [f"gsm8k: {r}" for r in gsm["reasons"]]
        deciding.append((gsm["verdict"], "gsm8k: " + (gsm["reasons"] or [gsm["verdict"]])[0]))
    for side, view in (("A", a), ("B", b)):
        cov = view.manifest.get("coverage")
        if isinstance(cov, dict) and not cov.get("ok", True):
            verdicts.append("fail")
            cov_reasons = [f"{side}: capture coverage: {p}" for p in cov.get("problems", [])] or [f"{side}: capture coverage incomplete"]
            reasons += cov_reasons
            deciding.append(("fail", cov_reasons[0]))
    if not verdicts:
        verdicts.append("inconclusive")
        reasons.append("nothing to compare: neither tensors nor acceptance records in both runs")
        deciding.append(("inconclusive", reasons[-1]))
    verdict = merge_verdicts(*verdicts)
    return Comparison(
        a=a.name,
        b=b.name,
        verdict=verdict,
        headline=next((r for v, r in deciding if v == verdict), verdict),
        reasons=reasons,
        pairs=pairs,
        only_a=only_a,
        only_b=only_b,
        floor=(floor[0].name, floor[1].name) if floor else None,
        policy=policy.source,
        sections=sections,
        frontier=front,
        pooled=pooled,
    )


def _member(d: Decision, g: Measured, floor: Floor) -> Member | None:
    """What a pooled unit needs of a judged pair (None: nothing numeric was judged)."""
    if g.metrics is None or d.no_finite:
        return None
    m = g.metrics
    return Member(d.judged, d.limit, d.floor_kind, g.blocks, floor.blocks, max(1, m.numel - m.nonfinite_a - m.nonfinite_b))


def pair_frontier(pairs: list[PairResult]) -> Frontier:
    """The divergence frontier of a comparison's pairs (``judging.frontier``), each known by its index in ``pairs``."""
    return divergence_frontier(
        Node(i, p.name, p.label, p.coords, p.status, p.capture_index, p.floor_ratio,
             tuple(p.decision.reasons) if p.decision else ())
        for i, p in enumerate(pairs)
    )


GSM8K_ALPHA = 0.05


def _gsm8k_section(a: RunView, b: RunView) -> dict[str, Any]:
    """Accuracy on the questions both runs answered; fails when B loses significantly (exact McNemar)."""
    from validator.judging.gsm8k_scoring import compare_gsm8k
    from validator.runs.workload_files import load_gsm8k_rows

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


_ACCEPTANCE_KEYS = {"margin", "log_odds_margin", "alpha", "power", "resamples", "seed", "min_reached", "min_requests"}


def _acceptance_section(a: RunView, b: RunView, policy: Policy) -> dict[str, Any]:
    """Per-position acceptance divergence (validator.judging.acceptance), as a report section."""
    from validator.judging.acceptance import compare_acceptance

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


def _pair_reason(p: PairResult) -> str:
    return f"{p.label}: {'; '.join(p.decision.reasons) if p.decision and p.decision.reasons else p.status}"


def tensor_verdict(
    pairs: list[PairResult], only_a: list[str], only_b: list[str], policy: Policy, front: Frontier,
    pooled: list[PooledUnit] | None = None,
) -> tuple[str, list[str]]:
    """The tensor verdict and its reasons, the deciding one first: when pairs fail, the first divergence
    (with what follows it), then the worst failing pairs, then the failing pooled units. A pair inconclusive
    alone that its capture point's passing pooled unit settles (``pooled_pass``) does not hold the verdict back."""
    pooled = pooled or []
    reasons: list[str] = []
    failed = [p for p in pairs if p.status in ("fail", "error")]
    pool_failed = [u for u in pooled if u.status == "fail"]
    missing = []
    if only_a:
        missing.append(f"{len(only_a)} tensor(s) only in A")
    if only_b:
        missing.append(f"{len(only_b)} tensor(s) only in B")
    if failed:
        first = pairs[front.first_divergence.index] if front.first_divergence is not None else failed[0]
        note = f" ({frontier_note(front.to_dict())})" if len(failed) > 1 else ""
        reasons.append(_pair_reason(first) + note)
        reasons += [_pair_reason(p) for p in [p for p in failed if p is not first][:19]]
        if len(failed) > 20:
            reasons.append(f"... and {len(failed) - 20} more failing pairs")
    if pool_failed:
        # the most specific failing unit first: the one of fewest pairs, i.e. where the drift is confined
        ranked = sorted(pool_failed, key=lambda u: (len(u.members), -(u.fail_bound / u.limit), u.label))
        reasons += [f"pooled {u.label}: {u.describe()}" for u in ranked[:10]]
        if len(ranked) > 10:
            reasons.append(f"... and {len(ranked) - 10} more failing pooled units")
    if missing and policy.missing == "fail":
        reasons.insert(0 if not (failed or pool_failed) else 1, ", ".join(missing) + " (missing = fail)")
    elif missing:
        reasons.append(", ".join(missing) + " (missing = warn)")
    if failed or pool_failed or (missing and policy.missing == "fail"):
        return "fail", reasons
    undecided = [p for p in pairs if p.status == "inconclusive" and not p.pooled_pass]
    if not pairs:
        return "inconclusive", ["no tensors in common to compare"] + reasons
    if undecided:
        border = [p for p in undecided if p.decision and p.decision.borderline]
        # by identity: a list's ``in`` compares the pairs field by field, for every pair of thousands
        seen = {id(p) for p in border}
        nonfinite = [p for p in undecided if id(p) not in seen and p.decision and p.decision.no_finite]
        seen.update(id(p) for p in nonfinite)
        nofloor = [p for p in undecided if id(p) not in seen]
        head = []
        if border:
            head.append(f"{len(border)} pair(s) borderline, e.g. {_pair_reason(border[0])}")
        if nonfinite:
            head.append(f"{len(nonfinite)} pair(s) with no finite element, e.g. {_pair_reason(nonfinite[0])}")
        if nofloor:
            head.append(f"{len(nofloor)} pair(s) without a floor, e.g. {_pair_reason(nofloor[0])}")
        return "inconclusive", ["; ".join(head)] + [_pair_reason(p) for p in undecided[:20]] + reasons
    judged = [(p, p.decision) for p in pairs if p.decision is not None and p.decision.value is not None and not p.pooled_pass]
    worst = max(judged, key=lambda pd: (pd[1].value or 0.0) / (pd[1].limit or 1.0), default=(None, None))[0]
    together = [p for p in pairs if p.pooled_pass]
    if together:
        passing = [u for u in pooled if u.scope == "all" and u.status == "pass"]
        closest = max(passing, key=lambda u: u.interval[1] / u.limit)
        summary = (f"all {len(pairs)} pairs within their limits: {len(pairs) - len(together)} alone, {len(together)} too small "
                   f"to judge alone and judged with their capture point in {len(passing)} pooled unit(s) "
                   f"(closest: {closest.label}, {closest.describe()})")
    else:
        summary = f"all {len(pairs)} pairs within their limits"
        if worst is not None and worst.decision is not None:
            summary += f" (closest: {worst.label}, {_describe(worst.decision)})"
    matched = [p for p in pairs if p.decision is not None and p.decision.no_finite]
    if matched:  # passed on matching NaN/Inf alone (nonfinite = "match"): the headline says so
        summary += (f"; {len(matched)} of them with no finite element, passed on matching NaN/Inf alone "
                    f'(nonfinite = "match"), e.g. {matched[0].label}')
    return "pass", [summary] + reasons


def _describe(d: Decision) -> str:
    """'1.99x measured floor [1.97, 2.01], limit 1.5x' or 'rel_l2 0.0123 [0.011, 0.013], limit 0.03'."""
    if d.value is None:
        return ""
    if d.judged == "x floor":
        text = f"{fmt_judged(d.value, limit=d.limit)}x {d.floor_kind} floor"
        if d.interval:
            text += f" {fmt_interval(*d.interval, limit=d.limit)}"
        return text + (f", limit {d.limit:g}x" if d.limit is not None else "")
    text = f"rel_l2 {fmt_judged(d.value, limit=d.limit)}"
    if d.interval:
        text += f" {fmt_interval(*d.interval, limit=d.limit)}"
    return text + (f", limit {d.limit:.3g}" if d.limit is not None else "")


def merge_verdicts(*verdicts: str) -> str:
    if "fail" in verdicts:
        return "fail"
    if "inconclusive" in verdicts:
        return "inconclusive"
    return "pass"
