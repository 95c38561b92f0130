"""Thresholds: which pairs pass. A policy is a list of rules matched by tensor-name glob, first match wins.

TOML form (``--policy FILE``)::

    missing = "fail"            # tensors present on one side only: "fail" or "warn"

    [[rule]]
    match = "draft.k*"          # fnmatch glob on the tensor name
    rel_l2_max = 0.02           # absolute bound on rel_l2 (optional)
    cosine_min = 0.9995         # optional
    max_abs_max = 0.5           # optional
    floor_multiple = 2.0        # rel_l2 <= floor_multiple * rel_l2 of the noise-floor pair (needs --floor)
    floor_min_rel_l2 = 0.0      # lower bound for the floor-derived threshold (0: a bitwise floor demands bitwise)
    nonfinite = "fail"          # "fail" when NaN/Inf patterns differ, or "ignore"

Without a matching rule, the default depends on the dtypes: rel_l2 <= 8 units of roundoff of the
less precise of the two (bf16 0.03, fp16 0.004, fp8 0.25), 1e-4 for fp32 and 1e-9 for fp64; when a
floor pair is given, the default is ``floor_multiple = 2``. See docs/policy.md.
"""

from __future__ import annotations

import fnmatch
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import InputError
from .metrics import TensorMetrics

__all__ = ["Rule", "Policy", "Decision", "default_rel_l2"]

_DTYPE_REL_L2 = {
    "float64": 1e-9,
    "float32": 1e-4,
    "float16": 4e-3,
    "bfloat16": 3e-2,
    "float8_e4m3fn": 0.25,
    "float8_e5m2": 0.25,
}
_PRECISION_ORDER = ["float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2"]


def default_rel_l2(dtype_a: str, dtype_b: str) -> float:
    """The default rel_l2 bound for a pair: set by the less precise dtype (integers: exact)."""
    worst = max(
        (d for d in (dtype_a, dtype_b) if d in _DTYPE_REL_L2),
        key=_PRECISION_ORDER.index,
        default=None,
    )
    return 0.0 if worst is None else _DTYPE_REL_L2[worst]


@dataclass(frozen=True)
class Rule:
    match: str = "*"
    rel_l2_max: float | None = None
    cosine_min: float | None = None
    max_abs_max: float | None = None
    floor_multiple: float | None = None
    floor_min_rel_l2: float = 0.0
    nonfinite: str = "fail"

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str) -> Rule:
        known = set(cls.__dataclass_fields__)
        unknown = set(d) - known
        if unknown:
            raise InputError(f"{where}: unknown rule key(s) {sorted(unknown)}; known: {sorted(known)}")
        for k, v in d.items():
            if k in ("match", "nonfinite"):
                if not isinstance(v, str):
                    raise InputError(f"{where}: {k} must be a string")
            elif isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise InputError(f"{where}: {k} must be a non-negative number, got {v!r}")
        if d.get("nonfinite", "fail") not in ("fail", "ignore"):
            raise InputError(f"{where}: nonfinite must be 'fail' or 'ignore'")
        kw: dict[str, Any] = {k: (v if k in ("match", "nonfinite") else float(v)) for k, v in d.items()}
        return cls(**kw)


@dataclass(frozen=True)
class Decision:
    status: str  # "pass" | "fail" | "inconclusive"
    threshold: float | None  # the rel_l2 bound applied, if any
    reasons: tuple[str, ...] = ()


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
        return next((r for r in self.rules if fnmatch.fnmatchcase(name, r.match)), None)

    def decide(
        self,
        name: str,
        m: TensorMetrics,
        floor: TensorMetrics | None,
        *,
        have_floor: bool,
        dtypes: tuple[str, str] | None = None,
    ) -> Decision:
        """Judge one pair. ``floor``: the same tensor's metrics in the noise-floor comparison, if any.
        ``dtypes``: the captured dtypes (default: the compared tensors' dtypes)."""
        rule = self.rule_for(name)
        if rule is None:
            da, db = dtypes or (m.dtype_a, m.dtype_b)
            rule = Rule(floor_multiple=2.0) if have_floor else Rule(rel_l2_max=default_rel_l2(da, db))
        fails: list[str] = []
        threshold: float | None = None
        if rule.nonfinite == "fail" and m.nonfinite_mismatch:
            fails.append(f"{m.nonfinite_mismatch} element(s) differ in NaN/Inf")
        if rule.floor_multiple is not None:
            if floor is None:
                return Decision("inconclusive", None, ("no noise-floor measurement for this tensor",))
            threshold = max(rule.floor_multiple * floor.rel_l2, rule.floor_min_rel_l2)
            if not m.rel_l2 <= threshold:
                fails.append(
                    f"rel_l2 {m.rel_l2:.3g} > {rule.floor_multiple:g} x floor {floor.rel_l2:.3g}"
                )
        if rule.rel_l2_max is not None:
            threshold = rule.rel_l2_max if threshold is None else min(threshold, rule.rel_l2_max)
            if not m.rel_l2 <= rule.rel_l2_max:
                fails.append(f"rel_l2 {m.rel_l2:.3g} > {rule.rel_l2_max:.3g}")
        if rule.cosine_min is not None and not m.cosine >= rule.cosine_min:
            fails.append(f"cosine {m.cosine:.6f} < {rule.cosine_min}")
        if rule.max_abs_max is not None and not m.max_abs <= rule.max_abs_max:
            fails.append(f"max_abs {m.max_abs:.3g} > {rule.max_abs_max:.3g}")
        return Decision("fail" if fails else "pass", threshold, tuple(fails))
