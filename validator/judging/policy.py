"""Thresholds: which pairs pass. A policy is a list of rules matched by tensor-name glob, first match wins.

TOML form (``--policy FILE``)::

    missing = "fail"            # tensors present on one side only: "fail" or "warn"

    [[rule]]
    match = "draft.k*"          # fnmatch glob on the tensor name (or regex = "...": a full match, as SGLang's)
    rel_l2_max = 0.02           # absolute bound on rel_l2 (optional)
    cosine_min = 0.9995         # optional
    max_abs_max = 0.5           # optional
    rel_diff_max = 1e-3         # optional point bounds, as SGLang's comparator checks: rel_diff, mean_abs
    mean_abs_max = 0.01
    any_of = [{rel_diff_max = 8.5e-3}, {max_abs_max = 1e-3}]  # passes when one table's bounds all hold
    floor_multiple = 1.5        # rel_l2 <= floor_multiple x the tensor's floor (measured, else rounding)
    rounding_multiple = 4.0     # the multiple when the floor is the rounding floor (default: by dtype)
    floor_min_rel_l2 = 0.0      # never demand less than this rel_l2 (0: a bitwise floor demands bitwise)
    nonfinite = "fail"          # "fail": any NaN, or differing NaN/Inf; "match": differing only; "ignore"

Without a matching rule: with a floor pair (``--floor``), ``floor_multiple = FLOOR_MULTIPLE``; otherwise
``rel_l2 <= default_rel_l2(dtypes)``. Every judged ratio carries an interval (``floors.judged_intervals``: the
envelope of a block bootstrap, a log-scale t interval and the F interval of the pair's elements): a pair passes when
the whole 95% interval is within its limit, fails when the whole interval at the comparison's FAIL level
(:func:`fail_level`, Bonferroni over the units it judges) is beyond it, and is ``inconclusive (borderline)``
otherwise. The defaults were chosen by ``benchmarks/calibration.py``; docs/policy.md gives its false-alarm and
detection rates.
"""

from __future__ import annotations

import fnmatch
import functools
import math
import re
import tomllib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from validator.errors import InputError
from validator.judging.text import fmt_interval, fmt_judged
from validator.numerics.floors import BlockSums, judged_intervals

if TYPE_CHECKING:
    from validator.numerics.metrics import TensorMetrics

__all__ = [
    "Rule",
    "Policy",
    "Decision",
    "Floor",
    "default_rel_l2",
    "default_rounding_multiple",
    "FLOOR_MULTIPLE",
    "JUDGING_VERSION",
    "FAMILY_ALPHA",
    "fail_level",
]

# Bumped whenever a default or a judging rule changes, so that cached comparisons are judged again.
JUDGING_VERSION = 7  # 3: row blocks from the measuring pass (aligned boundaries), bootstrap by count matrix; 4: the
# divergence frontier (first_divergence, problem_nodes, downstream) in the document and the headline; 5: a pair with
# no finite element is inconclusive unless nonfinite = "match" (then noted), intervals printed rounded outward; 6:
# intervals that hold at every size (bootstrap, log-scale t and F envelope), FAILs at the run's Bonferroni level,
# pooled units; 7: a pair whose declared replicated copies differ fails

# Chosen by benchmarks/calibration.py (docs/policy.md, "Calibration").
FLOOR_MULTIPLE = 1.5
# False FAILs allowed per comparison, over all the units it judges (pairs and pooled units): each unit FAILs only
# when the lower end of its interval at level 1 - FAMILY_ALPHA / units is beyond its limit (Bonferroni).
FAMILY_ALPHA = 0.05


def fail_level(units: int) -> float:
    """The two-sided level of the interval whose lower end a unit FAILs on, in a comparison of ``units`` units."""
    return 1.0 - FAMILY_ALPHA / max(1, units)

# Results stored in <= 16 bits: a short chain of roundings (a bf16 GEMM is 1x, GEMM-norm-GEMM-norm-RoPE 2.5x).
_ROUNDING_MULTIPLE_NARROW = 4.0
# float32/float64 results: accumulation error, not the final rounding, sets their error, and it grows with
# the reduction length (a CPU fp32 GEMM 8-10x, cuBLAS at K = 7168 50x). 1024x still demands 14 of float32's
# 24 bits; what it exists to catch, an fp32 value that went through bf16 on the way, is ~60,000x.
_ROUNDING_MULTIPLE_WIDE = 1024.0

_DTYPE_REL_L2 = {
    "float64": 1e-9,
    "float32": 1e-4,
    "float16": 4e-3,
    "bfloat16": 3e-2,
    "float8_e4m3fn": 0.25,
    "float8_e5m2": 0.25,
}
_PRECISION_ORDER = ["float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2"]
_NONFINITE = ("fail", "match", "ignore")


def default_rel_l2(dtype_a: str, dtype_b: str) -> float:
    """The default rel_l2 bound for a pair: set by the less precise dtype (integers: exact)."""
    worst = max(
        (d for d in (dtype_a, dtype_b) if d in _DTYPE_REL_L2),
        key=_PRECISION_ORDER.index,
        default=None,
    )
    return 0.0 if worst is None else _DTYPE_REL_L2[worst]


def default_rounding_multiple(dtype: str) -> float:
    """How many rounding floors a valid result stored in ``dtype`` may be from the exact value."""
    return _ROUNDING_MULTIPLE_WIDE if dtype in ("float32", "float64") else _ROUNDING_MULTIPLE_NARROW


@dataclass(frozen=True)
class Floor:
    """The floor a pair is judged against: ``kind`` is "measured", "rounding" or "none" (then ``reason``
    says why). ``blocks``: the floor pair's block sums, for the interval."""

    kind: str
    rel_l2: float | None = None
    blocks: BlockSums | None = None
    reason: str = ""
    note: str = ""  # e.g. why a measured floor was not used


# Point bounds: checked on the pair's metrics as they are, without an interval (SGLang's comparator's checks,
# validator.judging.sglang_rules). ``any_of`` holds tables of these.
POINT_BOUNDS = ("rel_diff_max", "max_abs_max", "mean_abs_max")
_STRINGS = ("match", "regex", "nonfinite")


@dataclass(frozen=True)
class Rule:
    match: str = "*"
    rel_l2_max: float | None = None
    cosine_min: float | None = None
    max_abs_max: float | None = None
    floor_multiple: float | None = None
    rounding_multiple: float | None = None
    floor_min_rel_l2: float = 0.0
    nonfinite: str = "fail"
    regex: str | None = None  # a Python regex the whole name must match (instead of the glob ``match``)
    rel_diff_max: float | None = None
    mean_abs_max: float | None = None
    any_of: tuple[tuple[tuple[str, float], ...], ...] = ()  # alternatives of point bounds: one must hold

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str) -> Rule:
        known = set(cls.__dataclass_fields__)
        unknown = set(d) - known
        if unknown:
            raise InputError(f"{where}: unknown rule key(s) {sorted(unknown)}; known: {sorted(known)}")
        for k, v in d.items():
            if k in _STRINGS:
                if not isinstance(v, str):
                    raise InputError(f"{where}: {k} must be a string")
            elif k != "any_of":
                _check_number(v, f"{where}: {k}")
        if d.get("nonfinite", "fail") not in _NONFINITE:
            raise InputError(f"{where}: nonfinite must be one of {list(_NONFINITE)}")
        if "regex" in d:
            if "match" in d:
                raise InputError(f"{where}: give match (a glob) or regex, not both")
            try:
                re.compile(d["regex"])
            except (re.error, RecursionError, OverflowError) as exc:
                raise InputError(f"{where}: regex {d['regex']!r} does not compile: {exc}") from None
        kw: dict[str, Any] = {k: (v if k in _STRINGS else float(v)) for k, v in d.items() if k != "any_of"}
        if "any_of" in d:
            kw["any_of"] = _any_of(d["any_of"], f"{where}: any_of")
        return cls(**kw)

    def matches(self, name: str) -> bool:
        if self.regex is not None:
            return re.fullmatch(self.regex, name) is not None
        return fnmatch.fnmatchcase(name, self.match)


def _check_number(v: Any, what: str) -> None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise InputError(f"{what} must be a non-negative number, got {v!r}")


def _any_of(raw: Any, where: str) -> tuple[tuple[tuple[str, float], ...], ...]:
    """``[{rel_diff_max = 1e-3}, {max_abs_max = 1e-3}]`` -> alternatives of ``(key, bound)``."""
    if not isinstance(raw, list) or not raw or not all(isinstance(t, dict) and t for t in raw):
        raise InputError(f"{where} must be a non-empty list of non-empty tables of {list(POINT_BOUNDS)}")
    out = []
    for i, table in enumerate(raw):
        bad = set(table) - set(POINT_BOUNDS)
        if bad:
            raise InputError(f"{where} table {i + 1}: unknown key(s) {sorted(bad)}; known: {list(POINT_BOUNDS)}")
        for k, v in table.items():
            _check_number(v, f"{where} table {i + 1}: {k}")
        out.append(tuple((k, float(v)) for k, v in table.items()))
    return tuple(out)


def _point_fails(bounds: Sequence[tuple[str, float]], m: TensorMetrics) -> list[str]:
    """Why ``m`` breaks these point bounds (NaN metrics break every bound); empty when all hold."""
    out = []
    for key, bound in bounds:
        metric = key.removesuffix("_max")
        value = getattr(m, metric)
        if not value <= bound:
            out.append(f"{metric} {value:.3g} > {bound:.3g}")
    return out


@functools.lru_cache(maxsize=64)
def _default_rule(dtypes: tuple[str, str], have_floor: bool) -> Rule:
    """The rule of a tensor no rule matches (one immutable Rule per case, shared by every such pair)."""
    return Rule(floor_multiple=FLOOR_MULTIPLE) if have_floor else Rule(rel_l2_max=default_rel_l2(*dtypes))


@dataclass(frozen=True)
class Decision:
    """How one pair was judged. ``threshold``: the rel_l2 bound applied; ``judged``: what the interval is
    of ("x floor" or "rel_l2"); ``limit``: the bound that quantity was held to."""

    status: str  # "pass" | "fail" | "inconclusive"
    threshold: float | None  # the rel_l2 bound applied, if any
    reasons: tuple[str, ...] = ()
    floor_kind: str | None = None  # "measured" | "rounding" | "none"; None: the rule needs no floor
    floor_rel_l2: float | None = None
    judged: str | None = None
    value: float | None = None
    interval: tuple[float, float] | None = None
    limit: float | None = None
    notes: tuple[str, ...] = ()
    borderline: bool = False
    no_finite: bool = False  # no element is finite in both runs: nothing numeric was judged (policy.md)
    fail_bound: float | None = None  # the lower end of the interval at the comparison's FAIL level (fail_level)


class _Pending(NamedTuple):
    """A value to judge against its limit once its interval is drawn (:meth:`Policy.decide_many`): rel_l2, or
    with ``floor_kind`` its multiple of that floor; ``sums``: the block sums the interval is drawn from (None:
    the interval is the value alone); ``kept``: the interval is the decision's."""

    value: float
    limit: float
    floor_kind: str | None
    sums: tuple[BlockSums, BlockSums | None] | None
    kept: bool
    elements: int = 1  # elements finite in the pair: the degrees of freedom its F interval may claim

    def words(self, ci: tuple[float, float]) -> tuple[str, str]:
        """How a reason shows the value with its interval, and the limit."""
        # rounded outward, and never onto the limit's other side: a FAIL never prints a bound within its limit
        value, shown = fmt_judged(self.value, limit=self.limit), fmt_interval(ci[0], ci[1], limit=self.limit)
        if self.floor_kind is None:
            return f"rel_l2 {value} {shown}", f"{self.limit:.3g}"
        return f"{value}x {self.floor_kind} floor {shown}", f"{self.limit:g}x"


@dataclass
class _Verdicts:
    fails: list[str] = field(default_factory=list)
    borderline: list[str] = field(default_factory=list)
    undecided: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    pending: list[_Pending] = field(default_factory=list)

    def judge(self, p: _Pending, ci: tuple[float, float], fail_lo: float, level: float) -> None:
        """Interval entirely within the limit: fine; entirely beyond it at the comparison's FAIL level (lower end
        ``fail_lo``): fail; else borderline."""
        value, limit = p.value, p.limit
        if fail_lo > limit or (value > limit and ci[0] == ci[1]):
            shown, limit_text = p.words(ci)
            self.fails.append(f"{shown} > {limit_text}")
        elif ci[0] > limit:  # beyond at 95%, not at the level that keeps a comparison's false FAILs at 5%
            shown, limit_text = p.words(ci)
            self.borderline.append(f"borderline: {shown} > {limit_text} at 95%, but its lower end at the comparison's "
                                   f"FAIL level ({level:.6g}) is {fail_lo:.3g}")
        elif not ci[1] <= limit or not value <= limit:  # an infinite or undefined bound never passes
            shown, limit_text = p.words(ci)
            self.borderline.append(f"borderline: {shown} straddles {limit_text}")


@dataclass(frozen=True)
class Policy:
    rules: tuple[Rule, ...] = ()
    missing: str = "fail"
    source: str = "defaults"
    extra: dict[str, Any] = field(default_factory=dict)  # other sections (e.g. [acceptance])

    @classmethod
    def load(cls, path: str | Path) -> Policy:
        p = Path(path)
        try:
            doc = tomllib.loads(p.read_text())
        except OSError as exc:
            raise InputError(f"{p}: cannot read policy: {exc.strerror or exc}") from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError, RecursionError) as exc:
            raise InputError(f"{p}: not valid TOML: {exc}") from None
        return cls.from_dict(doc, source=str(p))

    @classmethod
    def from_dict(cls, doc: dict[str, Any], *, source: str = "policy") -> Policy:
        missing = doc.get("missing", "fail")
        if missing not in ("fail", "warn"):
            raise InputError(f"{source}: missing must be 'fail' or 'warn', got {missing!r}")
        raw_rules = doc.get("rule", [])
        if not isinstance(raw_rules, list) or not all(isinstance(r, dict) for r in raw_rules):
            raise InputError(f"{source}: [[rule]] entries must be tables")
        rules = tuple(Rule.from_dict(r, f"{source} rule {i + 1}") for i, r in enumerate(raw_rules))
        extra = {k: v for k, v in doc.items() if k not in ("missing", "rule")}
        unknown = set(extra) - {"acceptance"}
        if unknown:
            raise InputError(f"{source}: unknown section(s) {sorted(unknown)}")
        if not isinstance(extra.get("acceptance", {}), dict):
            raise InputError(f"{source}: [acceptance] must be a table")
        return cls(rules=rules, missing=missing, source=source, extra=extra)

    def rule_for(self, name: str) -> Rule | None:
        if not self.rules:  # the default policy: asked twice per pair
            return None
        return next((r for r in self.rules if r.matches(name)), None)

    def effective_rule(self, name: str, dtypes: tuple[str, str], *, have_floor: bool) -> Rule:
        """The matching rule, or the default one for these (captured) dtypes."""
        rule = self.rule_for(name)
        return rule if rule is not None else _default_rule(dtypes, have_floor)

    def decide(
        self,
        name: str,
        m: TensorMetrics,
        floor: Floor | None,
        *,
        have_floor: bool,
        dtypes: tuple[str, str] | None = None,
        blocks: BlockSums | None = None,
    ) -> Decision:
        """Judge one pair. ``floor``: the floor found for this tensor (``None``: none looked for);
        ``dtypes``: the captured dtypes (default: the compared tensors'); ``blocks``: the pair's block
        sums, for intervals and NaN counts (without them the interval is the point value)."""
        return self.decide_many([(name, m, floor, dtypes, blocks)], have_floor=have_floor)[0]

    def decide_many(
        self,
        pairs: Sequence[tuple[str, TensorMetrics, Floor | None, tuple[str, str] | None, BlockSums | None]],
        *,
        have_floor: bool,
        units: int = 1,
    ) -> list[Decision]:
        """:meth:`decide` of each pair ``(name, m, floor, dtypes, blocks)``, in order, with the same results: the
        intervals of all of them are drawn together (``floors.judged_intervals``). ``units``: how many units the
        comparison judges in all (its pairs and pooled units), which sets the level a FAIL needs (:func:`fail_level`)."""
        started = [self._start(name, m, floor, have_floor, dtypes, blocks) for name, m, floor, dtypes, blocks in pairs]
        wanted = [(*p.sums, p.elements) for j in started for p in j.v.pending if p.sums is not None]
        level = fail_level(units)
        intervals = iter(judged_intervals(wanted, fail_level=level))
        return [_finish(j, intervals, level) for j in started]

    def _start(
        self, name: str, m: TensorMetrics, floor: Floor | None, have_floor: bool, dtypes: tuple[str, str] | None,
        blocks: BlockSums | None,
    ) -> _Judging:  # fmt: skip
        """A pair judged up to its intervals: the values they are drawn for left pending."""
        da, db = dtypes or (m.dtype_a, m.dtype_b)
        rule = self.effective_rule(name, (da, db), have_floor=have_floor)
        v = _Verdicts()
        out: dict[str, Any] = {"no_finite": _nonfinite(rule.nonfinite, m, blocks, v)}
        if rule.floor_multiple is not None:
            _against_floor(rule, m, floor or Floor("none", reason="no floor pair given"), db, blocks, v, out)
        if rule.rel_l2_max is not None:
            bound = rule.rel_l2_max
            out["threshold"] = bound if out.get("threshold") is None else min(out["threshold"], bound)
            if m.rel_l2 > 0:
                kept = "judged" not in out
                if kept:
                    out.update(judged="rel_l2", value=m.rel_l2, limit=bound)
                sums = None if blocks is None else (blocks, None)
                v.pending.append(_Pending(m.rel_l2, bound, None, sums, kept, _finite(m)))
        return _Judging(rule, m, v, out)


class _Judging(NamedTuple):
    """A pair judged up to its intervals (:meth:`Policy.decide_many`)."""

    rule: Rule
    m: TensorMetrics
    v: _Verdicts
    out: dict[str, Any]


def _finite(m: TensorMetrics) -> int:
    """Elements finite in both runs, at least (a NaN or Inf in either drops the element)."""
    return max(1, m.numel - m.nonfinite_a - m.nonfinite_b)


def _finish(j: _Judging, intervals: Iterator[tuple[tuple[float, float], float]], level: float) -> Decision:
    """The pair's decision, its pending values judged with their intervals (the next ones of ``intervals``)."""
    rule, m, v, out = j
    for p in v.pending:
        ci, fail_lo = next(intervals) if p.sums is not None else ((p.value, p.value), p.value)
        if p.kept:
            out["interval"], out["fail_bound"] = ci, fail_lo
        v.judge(p, ci, fail_lo, level)
    if rule.cosine_min is not None and not m.cosine >= rule.cosine_min:
        v.fails.append(f"cosine {m.cosine:.6f} < {rule.cosine_min}")
    v.fails += _point_fails([(k, getattr(rule, k)) for k in POINT_BOUNDS if getattr(rule, k) is not None], m)
    if rule.any_of and all(_point_fails(alt, m) for alt in rule.any_of):
        v.fails.append("none of any_of holds: " + "; ".join(" and ".join(_point_fails(alt, m)) for alt in rule.any_of))
    status = "fail" if v.fails else "inconclusive" if (v.borderline or v.undecided) else "pass"
    return Decision(
        status,
        out.get("threshold"),
        tuple(v.fails + v.borderline + v.undecided),
        floor_kind=out.get("floor_kind"),
        floor_rel_l2=out.get("floor_rel_l2"),
        judged=out.get("judged"),
        value=out.get("value"),
        interval=out.get("interval"),
        limit=out.get("limit"),
        notes=tuple(v.notes),
        borderline=bool(v.borderline) and not v.fails,
        no_finite=out["no_finite"],
        fail_bound=out.get("fail_bound"),
    )


def _nonfinite(mode: str, m: TensorMetrics, blocks: BlockSums | None, v: _Verdicts) -> bool:
    """The rule's ``nonfinite`` setting applied to one pair; returns whether the pair has no element finite in
    both runs (one run, or both, non-finite everywhere). Such a pair rests on no finite number: it passes only
    where the rule asks for matching non-finite values (``"match"``), with a note that says so, and is
    inconclusive otherwise, unless its non-finite values fail it already."""
    no_finite = m.numel > 0 and max(m.nonfinite_a, m.nonfinite_b) == m.numel
    failed = len(v.fails)
    if mode != "ignore":
        if mode == "fail" and blocks is None and (m.nonfinite_a or m.nonfinite_b):  # no NaN count: be strict
            v.fails.append(f"non-finite (NaN or Inf): {m.nonfinite_a} in A, {m.nonfinite_b} in B")
        elif mode == "fail" and blocks is not None and (blocks.nan_a or blocks.nan_b):
            v.fails.append(f"NaN: {blocks.nan_a} in A, {blocks.nan_b} in B")
        if m.nonfinite_mismatch:
            v.fails.append(f"{m.nonfinite_mismatch} element(s) differ in NaN/Inf")
        if blocks is not None and blocks.inf_matched:
            v.notes.append(f"{blocks.inf_matched} matching ±Inf element(s), counted and not compared")
        if mode == "match" and not m.nonfinite_mismatch:  # what "match" let through, always said
            if blocks is not None and blocks.nan_a:
                v.notes.append(f'{blocks.nan_a} matching NaN element(s), accepted by nonfinite = "match" and not compared')
            elif blocks is None and m.nonfinite_a:
                v.notes.append(f'{m.nonfinite_a} matching NaN/±Inf element(s), accepted by nonfinite = "match" and not compared')
    if no_finite and len(v.fails) == failed:
        what = _nonfinite_counts(m, blocks)
        if mode == "match":
            v.notes.append(f'no finite element: passes on its {what} alone (nonfinite = "match")')
        else:
            v.undecided.append(
                f'no finite element: {what}, nothing to judge (nonfinite = "{mode}"'
                + ('; a rule with nonfinite = "match" accepts matching NaN/Inf)' if mode == "fail" else ")")
            )
    return no_finite


def _nonfinite_counts(m: TensorMetrics, blocks: BlockSums | None) -> str:
    """'4096 matching ±Inf element(s)', '64 matching NaN and 4032 matching ±Inf element(s)', or per run."""
    if m.nonfinite_mismatch:
        return f"{m.nonfinite_a} of {m.numel} element(s) non-finite in A, {m.nonfinite_b} in B"
    if blocks is None:
        return f"{m.nonfinite_a} matching NaN/±Inf element(s)"
    parts = [f"{n} matching {kind}" for n, kind in ((blocks.nan_a, "NaN"), (blocks.inf_matched, "±Inf")) if n]
    return " and ".join(parts) + " element(s)"


def _against_floor(
    rule: Rule, m: TensorMetrics, floor: Floor, dtype_b: str, blocks: BlockSums | None, v: _Verdicts, out: dict[str, Any]
) -> None:
    out["floor_kind"] = floor.kind
    if floor.note:
        v.notes.append(floor.note)
    if floor.kind == "none" or floor.rel_l2 is None or not math.isfinite(floor.rel_l2):
        out["floor_kind"] = "none"
        if m.rel_l2 == 0:
            return  # identical on every compared element: no floor needed
        if rule.rel_l2_max is None:
            v.undecided.append(f"no floor: {floor.reason or 'none available'}")
        else:
            v.notes.append(f"no floor ({floor.reason or 'none available'}): judged by rel_l2_max alone")
        return
    multiple = rule.floor_multiple if floor.kind == "measured" else rule.rounding_multiple
    if multiple is None:
        multiple = default_rounding_multiple(dtype_b)
    threshold = max(multiple * floor.rel_l2, rule.floor_min_rel_l2)
    out.update(floor_rel_l2=floor.rel_l2, threshold=threshold, limit=multiple)
    if m.rel_l2 <= rule.floor_min_rel_l2 or m.rel_l2 == 0:
        out.update(judged="x floor", value=_ratio(m.rel_l2, floor.rel_l2))
        return
    if floor.rel_l2 == 0:
        v.fails.append(f"rel_l2 {m.rel_l2:.3g} > 0: the {floor.kind} floor is exact for this tensor")
        out.update(judged="x floor", value=math.inf)
        return
    ratio = m.rel_l2 / floor.rel_l2
    out.update(judged="x floor", value=ratio)
    sums = (blocks, floor.blocks) if blocks is not None and floor.blocks is not None else None
    v.pending.append(_Pending(ratio, multiple, floor.kind, sums, True, _finite(m)))


def _ratio(x: float, floor: float) -> float:
    if floor == 0:
        return 1.0 if x == 0 else math.inf
    return x / floor
