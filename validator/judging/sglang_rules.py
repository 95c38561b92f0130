"""SGLang comparator threshold rules as policy rules (``validator policy import-sglang``; docs/sglang.md).

SGLang 0.5.23's comparator (``python -m sglang.srt.debug_utils.comparator --diff-threshold ...``) takes either one
float, shorthand for ``'.*' 'rel <= X'``, or ``REGEX PREDICATE`` pairs; a tensor uses the predicate of the first
regex that matches its whole name (``re.fullmatch``), and no rules at all means ``rel <= 0.001``. A predicate is a
Python expression over ``rel`` (its ``rel_diff``, ``1 - 2<a,b>/(|a|^2 + |b|^2)`` in float64), ``max_abs`` and
``mean_abs`` (of ``|b - a|``), with comparisons, ``and`` and ``or``.

Each rule becomes a policy rule with the same regex (``regex``, or ``match`` when the regex is a plain glob) and the
predicate's point bounds (``rel_diff_max``, ``max_abs_max``, ``mean_abs_max``; the metrics of the same names,
docs/metrics.md): a conjunction directly, a disjunction as ``any_of`` tables (the predicate in disjunctive normal
form). ``x < c`` is ``x <= `` the float below ``c``, which is the same test on floats. What has no bound form is
refused with the reason (:class:`InputError`): lower bounds on a difference, arithmetic, ``not``, other names.
Pure: strings in, a policy document or its TOML text out.
"""

from __future__ import annotations

import ast
import json
import math
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from validator.errors import InputError

__all__ = ["SGLangRule", "SGLANG_DEFAULT_PREDICATE", "parse_sglang_rules", "policy_doc", "policy_toml"]

SGLANG_DEFAULT_PREDICATE = "rel <= 0.001"  # the comparator's DEFAULT_PREDICATE
_METRICS = {"rel": "rel_diff_max", "max_abs": "max_abs_max", "mean_abs": "mean_abs_max"}
_FLOAT_MAX = sys.float_info.max
_MAX_ALTERNATIVES = 32  # a predicate's disjunctive normal form may have at most this many terms

Bounds = dict[str, float]  # a conjunction of upper bounds: policy key -> bound


@dataclass(frozen=True)
class SGLangRule:
    """One ``REGEX PREDICATE`` pair and the point bounds it means: the predicate holds when every bound of one
    of ``alternatives`` holds (an empty alternative: always)."""

    pattern: str
    predicate: str
    alternatives: tuple[tuple[tuple[str, float], ...], ...]

    def policy_rule(self) -> dict[str, object]:
        """The ``[[rule]]`` table of this rule."""
        glob = _as_glob(self.pattern)
        rule: dict[str, object] = {"match": glob} if glob is not None else {"regex": self.pattern}
        if len(self.alternatives) == 1:
            rule.update(dict(self.alternatives[0]))
        elif self.alternatives:
            rule["any_of"] = [dict(alt) for alt in self.alternatives]
        return rule


def parse_sglang_rules(args: Sequence[str]) -> list[SGLangRule]:
    """The rules of ``--diff-threshold ARGS...``, as SGLang's ``parse_diff_threshold_rules`` reads them."""
    if not args:
        return [_rule(".*", SGLANG_DEFAULT_PREDICATE, 1)]
    if len(args) == 1:
        try:
            value = float(args[0])
        except ValueError:
            raise InputError(
                f"one argument must be a float (shorthand for '.*' 'rel <= X'), got {args[0]!r}; "
                "otherwise give REGEX PREDICATE pairs"
            ) from None
        return [_rule(".*", f"rel <= {value!r}", 1)]
    if len(args) % 2:
        raise InputError(f"expected REGEX PREDICATE pairs, got an odd number of arguments ({len(args)}): {list(args)}")
    return [_rule(args[i], args[i + 1], i // 2 + 1) for i in range(0, len(args), 2)]


def policy_doc(rules: Sequence[SGLangRule]) -> dict[str, object]:
    """The policy document (what ``Policy.from_dict`` reads) holding these rules, first match first."""
    return {"rule": [r.policy_rule() for r in rules]}


def policy_toml(rules: Sequence[SGLangRule], *, command: str = "") -> str:
    """The policy as a TOML file, each rule headed by the SGLang rule it came from."""
    lines = ["# Imported from SGLang comparator --diff-threshold rules (docs/sglang.md, 'Threshold rules')."]
    if command:
        lines.append(f"# {command}")
    lines += [
        "# A tensor that matches no rule is judged by validator's defaults (SGLang's comparator stops with an error).",
        "",
    ]
    for r in rules:
        lines += ["[[rule]]", f"# {r.pattern!r} {r.predicate!r}"]
        for key, value in r.policy_rule().items():
            lines.append(f"{key} = {_toml_value(value)}")
        lines.append("")
    return "\n".join(lines)


def _toml_value(value: object) -> str:
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a TOML basic string (\uXXXX escapes included)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join("{" + ", ".join(f"{k} = {v!r}" for k, v in t.items()) + "}" for t in value) + "]"
    raise TypeError(type(value))


def _rule(pattern: str, predicate: str, number: int) -> SGLangRule:
    where = f"rule {number} ({pattern!r} {predicate!r})"
    try:
        re.compile(pattern)
    except (re.error, RecursionError, OverflowError) as exc:
        raise InputError(f"{where}: the regex does not compile: {exc}") from None
    try:
        tree = ast.parse(predicate.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError) as exc:
        raise InputError(f"{where}: not a predicate: {exc}") from None
    alternatives = _simplest(_dnf(tree.body, where), where)
    return SGLangRule(pattern, predicate, tuple(tuple(sorted(a.items())) for a in alternatives))


def _dnf(node: ast.expr, where: str) -> list[Bounds]:
    """The predicate as alternatives (or) of conjunctions (and) of upper bounds."""
    if isinstance(node, ast.BoolOp):
        parts = [_dnf(v, where) for v in node.values]
        if isinstance(node.op, ast.Or):
            return [alt for part in parts for alt in part]
        out: list[Bounds] = [{}]
        for part in parts:
            out = [_both(a, b) for a in out for b in part]
            if len(out) > _MAX_ALTERNATIVES:
                raise InputError(f"{where}: more than {_MAX_ALTERNATIVES} alternatives once written as or of ands")
        return out
    if isinstance(node, ast.Compare):
        bounds: Bounds = {}
        left = node.left
        for op, right in zip(node.ops, node.comparators):
            atom = _atom(left, op, right, where)
            if atom is None:
                return []  # never true: nothing to offer this alternative
            bounds = _both(bounds, atom)
            left = right
        return [bounds]
    raise InputError(f"{where}: {ast.unparse(node)!r} is not a comparison of rel, max_abs or mean_abs with a number "
                     "(only <, <=, >, >=, == 0, 'and', 'or' map to policy bounds)")


def _both(a: Bounds, b: Bounds) -> Bounds:
    out = dict(a)
    for k, v in b.items():
        out[k] = min(out.get(k, math.inf), v)
    return out


def _atom(left: ast.expr, op: ast.cmpop, right: ast.expr, where: str) -> Bounds | None:
    """One comparison as upper bounds: ``{}`` when always true (a metric is never negative), ``None`` when never."""
    text = f"{ast.unparse(left)} {_OPS.get(type(op), '?')} {ast.unparse(right)}"
    metric, number = _operand(left, where), _operand(right, where)
    if isinstance(metric, str) == isinstance(number, str):
        raise InputError(f"{where}: {text!r} must compare one of rel, max_abs, mean_abs with a number")
    if isinstance(number, str):  # number on the left: turn it round
        metric, number = number, metric
        op = _MIRROR.get(type(op), op)
    assert isinstance(metric, str) and isinstance(number, float)
    key = _METRICS[metric]
    if isinstance(op, ast.LtE):
        return None if number < 0 else {key: number}
    if isinstance(op, ast.Lt):
        return None if number <= 0 else {key: math.nextafter(number, -math.inf)}
    if isinstance(op, ast.Eq) and number == 0:
        return {key: 0.0}
    if (isinstance(op, ast.GtE) and number <= 0) or (isinstance(op, ast.Gt) and number < 0):
        return {}  # rel, max_abs and mean_abs are never negative
    if isinstance(op, (ast.Gt, ast.GtE)):
        raise InputError(f"{where}: {text!r} is a lower bound on a difference: a policy bounds differences from "
                         "above only (a pair never fails for being too close)")
    raise InputError(f"{where}: {text!r}: only <, <=, >, >= (and == 0) map to policy bounds")


_OPS = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!="}
_MIRROR: dict[type[ast.cmpop], ast.cmpop] = {ast.Lt: ast.Gt(), ast.LtE: ast.GtE(), ast.Gt: ast.Lt(), ast.GtE: ast.LtE()}


def _operand(node: ast.expr, where: str) -> str | float:
    """A metric name, or a finite number (``1e-3``, ``-1``, ``+2``)."""
    if isinstance(node, ast.Name):
        if node.id not in _METRICS:
            raise InputError(f"{where}: unknown name {node.id!r}; SGLang's predicates use {sorted(_METRICS)}")
        return node.id
    sign = 1.0
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        sign = -1.0 if isinstance(node.op, ast.USub) else 1.0
        node = node.operand
    value = node.value if isinstance(node, ast.Constant) else None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value == value and abs(value) <= _FLOAT_MAX:
        return sign * float(value)
    raise InputError(f"{where}: {ast.unparse(node)!r} is neither rel, max_abs, mean_abs nor a finite number")


def _simplest(alternatives: list[Bounds], where: str) -> list[Bounds]:
    """Alternatives without those another one implies (a tighter set of the same or more bounds); one empty
    alternative (always true) leaves just it."""
    if not alternatives:
        raise InputError(f"{where}: never true (a bound below 0, which no difference is), so it fails every tensor: not imported")
    kept: list[Bounds] = []
    for i, a in enumerate(alternatives):
        looser = (b for j, b in enumerate(alternatives) if j != i and _implies(a, b) and (not _implies(b, a) or j < i))
        if next(looser, None) is None:
            kept.append(a)
    return kept


def _implies(a: Bounds, b: Bounds) -> bool:
    """Every pair within ``a``'s bounds is within ``b``'s."""
    return all(k in a and a[k] <= v for k, v in b.items())


_GLOB_SAFE = re.compile(r"[A-Za-z0-9_\-/:,=@ ]")


def _as_glob(pattern: str) -> str | None:
    """The fnmatch glob that matches exactly the names ``re.fullmatch(pattern)`` does, when there is a plain one
    (``.*expert.*`` -> ``*expert*``, ``layers\\.0\\..*`` -> ``layers.0.*``); else None."""
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith(".*", i):
            out.append("*")
            i += 2
        elif c == ".":
            out.append("?")
            i += 1
        elif c == "\\" and i + 1 < len(pattern) and pattern[i + 1] in ".-_/:[]*?+()":
            nxt = pattern[i + 1]
            out.append(f"[{nxt}]" if nxt in "*?[" else nxt)
            i += 2
        elif _GLOB_SAFE.fullmatch(c):
            out.append(c)
            i += 1
        else:
            return None
    return "".join(out)
