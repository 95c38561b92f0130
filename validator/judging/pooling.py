"""Pooled units: the tensors of one capture point judged together, as well as alone.

A capture point (a tensor name) is captured many times in a run: at every decode step, for every request, in
every layer it names. Each capture is a pair, judged alone (:mod:`validator.judging.policy`); a pair of 8 or 64
elements alone cannot support a PASS at any honest level. A *pooled unit* adds the block sums of several pairs
of one name (``Σd²``, ``Σa²``, and their floors' sums) and judges the pooled ratio with the same interval
(:func:`validator.numerics.floors.judged_intervals`, parametric parts only) against the same limit:

- ``all``: every pair of the name; its PASS settles the pairs of that name that are inconclusive alone only
  because their intervals are wide (borderline);
- ``step=S``, ``layer=L``, ``request=R``: the pairs of the name with that coordinate, where the name's pairs have
  more than one value of it; they find a drift confined to one step, layer or request that the whole pool
  dilutes.

Every unit, pair or pooled, counts in the comparison's multiplicity (``policy.fail_level``): a FAIL needs the
lower end of the unit's interval at level ``1 - 0.05 / units`` beyond its limit. docs/policy.md, "Pooled units",
gives the rates ``benchmarks/calibration.py`` measured.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from validator.judging.text import fmt_interval, fmt_judged
from validator.numerics.floors import LEVEL, BlockSums, judged_intervals_at
from validator.numerics.jsonsafe import json_safe

__all__ = ["POOL_BY", "SETTLE_LEVEL", "Member", "PooledUnit", "plan_units", "judge_units", "settled"]

POOL_BY = ("step", "layer", "request")  # coordinates a capture point's pairs are also pooled by
# A unit whose interval at this (two-sided) level lies beyond its limit leans beyond it: it keeps the pairs it holds
# from being settled by their name's passing unit, though it cannot FAIL them (benchmarks/calibration.md: a 2x drift
# confined to one layer of a run of 20 small pairs PASSes 22% of runs without this, and null runs of 2,000 small
# pairs stay PASS).
SETTLE_LEVEL = 0.6


@dataclass(frozen=True)
class Member:
    """What a pooled unit needs of one pair: the values it was judged by and its block sums."""

    judged: str | None  # "x floor" | "rel_l2" | None (not judged by a ratio: not poolable)
    limit: float | None
    floor_kind: str | None
    blocks: BlockSums | None
    floor: BlockSums | None
    elements: int

    @property
    def key(self) -> tuple[str | None, float | None, str | None] | None:
        """Pairs pool only with pairs of the same key (what is judged, against which limit and floor kind)."""
        if self.judged is None or self.limit is None or self.blocks is None:
            return None
        if self.judged == "x floor" and self.floor is None:
            return None
        return (self.judged, self.limit, self.floor_kind if self.judged == "x floor" else None)


@dataclass(frozen=True)
class PooledUnit:
    name: str
    scope: str  # "all", or "layer=19", "step=3", "request=r1"
    members: tuple[int, ...]  # the pooled pairs (indices into the comparison's pairs as judged)
    status: str  # pass | fail | inconclusive
    judged: str
    value: float
    interval: tuple[float, float]
    fail_bound: float
    limit: float
    floor_kind: str | None
    elements: int
    lean_bound: float = 0.0  # the lower end of its interval at SETTLE_LEVEL

    @property
    def label(self) -> str:
        return f"{self.name} [{self.scope}, {len(self.members)} pairs]"

    def describe(self) -> str:
        """'1.02x measured floor [0.95, 1.1] <= 1.5x' and the like: the unit's value, interval and limit."""
        value, shown = fmt_judged(self.value, limit=self.limit), fmt_interval(*self.interval, limit=self.limit)
        if self.judged == "x floor":
            text, limit = f"{value}x {self.floor_kind} floor {shown}", f"{self.limit:g}x"
        else:
            text, limit = f"rel_l2 {value} {shown}", f"{self.limit:.3g}"
        rel = {"pass": "<=", "fail": ">"}.get(self.status, "straddles")
        return f"{text} {rel} {limit}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "scope": self.scope,
            "label": self.label,
            "pairs": len(self.members),
            "elements": self.elements,
            "status": self.status,
            "judged": self.judged,
            "value": json_safe(self.value),
            "interval": [json_safe(x) for x in self.interval],
            "fail_bound": json_safe(self.fail_bound),
            "lean_bound": json_safe(self.lean_bound),
            "limit": json_safe(self.limit),
            "floor_kind": self.floor_kind,
            "reason": f"{self.label}: {self.describe()}",
        }


def plan_units(identities: Sequence[tuple[str, dict[str, Any]]]) -> list[tuple[str, str, tuple[int, ...]]]:
    """The pooled units of pairs ``(name, coords)``: ``(name, scope, member indices)``, before any is measured (so
    that the multiplicity is known when the first pair is judged). A unit has at least two pairs, and a
    coordinate's units exist only where the name's pairs have more than one value of that coordinate."""
    by_name: dict[str, list[int]] = {}
    for i, (name, _) in enumerate(identities):
        by_name.setdefault(name, []).append(i)
    out: list[tuple[str, str, tuple[int, ...]]] = []
    for name, idx in by_name.items():
        if len(idx) < 2:
            continue
        out.append((name, "all", tuple(idx)))
        for dim in POOL_BY:
            values: dict[str, list[int]] = {}
            for i in idx:
                v = identities[i][1].get(dim)
                if v is not None:
                    values.setdefault(str(v), []).append(i)
            if len(values) < 2:
                continue
            out += [(name, f"{dim}={v}", tuple(m)) for v, m in values.items() if len(m) >= 2]
    return out


def judge_units(
    plan: Sequence[tuple[str, str, tuple[int, ...]]], members: Sequence[Member | None], *, level: float
) -> list[PooledUnit]:
    """Each planned unit judged: its poolable members (those sharing the key of its first poolable one) pooled and
    their ratio's interval drawn, FAILing on its lower end at ``level`` (``policy.fail_level``). A unit with fewer
    than two poolable members is left out."""
    keys = [None if m is None else m.key for m in members]  # each member's once, not once per unit that holds it
    todo: list[tuple[str, str, tuple[int, ...], Member, BlockSums, BlockSums | None, int, float]] = []
    for name, scope, idx in plan:
        first_i = next((i for i in idx if keys[i] is not None), None)
        if first_i is None:
            continue
        first, key = members[first_i], keys[first_i]
        assert first is not None
        same = [i for i in idx if keys[i] == key]
        if len(same) < 2:
            continue
        ms = [m for i in same if (m := members[i]) is not None]
        cand = _concat([m.blocks for m in ms if m.blocks is not None], paired=True)
        floor = None
        if first.judged == "x floor":
            fl = [m.floor for m in ms if m.floor is not None]
            paired = all(f.rows == m.blocks.rows and len(f.d2) == len(m.blocks.d2) for f, m in zip(fl, ms) if m.blocks is not None)
            floor = _concat(fl, paired=paired)
        elements = sum(m.elements for m in ms)
        value = _ratio(cand, floor)
        todo.append((name, scope, tuple(same), first, cand, floor, elements, value))
    wanted = [(c, f, n) for _, _, _, _, c, f, n, _ in todo]
    # the interval at LEVEL with its FAIL end at ``level``, and at SETTLE_LEVEL: the blocks' sums worked out once
    drawn, leaning = judged_intervals_at(wanted, [(LEVEL, level), (SETTLE_LEVEL, LEVEL)], bootstrap=False)
    out = []
    for (name, scope, idx, first, _, _, elements, value), (ci, fail_lo), (lean, _) in zip(todo, drawn, leaning):
        assert first.limit is not None and first.judged is not None
        limit = first.limit
        if fail_lo > limit:
            status = "fail"
        elif ci[1] <= limit and value <= limit:
            status = "pass"
        else:
            status = "inconclusive"
        out.append(PooledUnit(name, scope, idx, status, first.judged, value, ci, fail_lo, limit, first.floor_kind, elements,
                              lean[0]))
    return out


def settled(units: Sequence[PooledUnit]) -> set[int]:
    """Pairs that a passing ``all`` unit of their name settles, unless a unit that holds them fails or leans beyond
    its limit (the lower end of its interval at SETTLE_LEVEL above it)."""
    beyond = {i for u in units if u.status == "fail" or u.lean_bound > u.limit for i in u.members}
    return {i for u in units if u.scope == "all" and u.status == "pass" for i in u.members} - beyond


def _concat(parts: list[BlockSums], *, paired: bool) -> BlockSums:
    """One BlockSums of several pairs' blocks, in order; ``rows`` that never matches another's when unpaired."""
    rows = sum(p.rows for p in parts) if paired else -1
    return BlockSums(np.concatenate([p.d2 for p in parts]), np.concatenate([p.a2 for p in parts]), rows)


def _ratio(cand: BlockSums, floor: BlockSums | None) -> float:
    r = cand.rel_l2
    if floor is None:
        return r
    f = floor.rel_l2
    if f == 0:
        return 1.0 if r == 0 else math.inf
    return r / f
