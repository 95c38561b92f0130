"""How often the acceptance verdict fails equal runs, finds a real shift, and calls a halved rate equivalent.

    python benchmarks/acceptance_calibration.py [--null 600] [--shifted 100] [--halving 200] [--seed 0]
        [--log-odds-margin W | --margin W] [--json out.json]

For each setup, seeded synthetic runs go through ``compare_acceptance`` with its defaults (log-odds margin
0.125, alpha 0.05, 2,000 bootstrap resamples) unless a margin is given. *Null*: A and B drawn from one
distribution; the false-fail rate is the share of overall ``fail``. *Shifted*: B's conditional rate at one
position is 0.05 lower; the detection rate is the share of comparisons that fail overall with that
position ``different``. The column "no correction" counts the same comparisons as the verdict did before
the Holm adjustment: a fail whenever any selected position has a raw p < alpha and its effect beyond the
margin.

*Halving*: one draft per step at a rate of 0.2, 0.03 or 0.005, at 2,000 and 20,000 verify steps; equal runs
and runs whose B rate is half A's, each judged with the margin under test and with the absolute margin
0.02 (the default before) for contrast. A halving must be ``fail`` or ``inconclusive``, never ``pass``.

A verify step proposes every draft; position k is accepted with probability ``rates[k]`` once reached, so
the accepted count is the run of leading successes. ``request_sd`` adds a per-request offset on the logit
scale (steps of one request correlated); ``paired`` runs share request ids and those offsets (the same
prompts in both runs), so the comparison pairs them and bootstraps both runs with one draw.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from validator.judging.acceptance import (  # noqa: E402
    AcceptanceComparison,
    StepArrays,
    compare_acceptance,
)

SHIFT = 0.05
HALVING_RATES = (0.2, 0.03, 0.005)
HALVING_STEPS = ((2_000, 100, 20), (20_000, 200, 100))  # (steps, requests, steps per request)
OLD_MARGIN = {"margin": 0.02}  # the absolute default before the log-odds margin


@dataclass(frozen=True)
class Setup:
    name: str
    rates: tuple[float, ...]
    requests: int
    steps_per_request: int
    shift_at: int  # the position shifted in the detection runs (about 2,000 reached trials per run)
    request_sd: float = 0.0
    paired: bool = False

    @property
    def reached_at_shift(self) -> float:
        return self.requests * self.steps_per_request * math.prod(self.rates[: self.shift_at])


SETUPS = (
    Setup("issue 16: 0.8 x 4, 100 req x 20", (0.8,) * 4, 100, 20, shift_at=0),
    Setup("decay 0.95..0.60 x 8, 125 req x 22", (0.95, 0.9, 0.85, 0.8, 0.75, 0.7, 0.65, 0.6), 125, 22, shift_at=3),
    Setup(
        "decay 0.85..0.60 x 6, 400 req x 6, clustered, paired",
        (0.85, 0.8, 0.75, 0.7, 0.65, 0.6),
        400,
        6,
        shift_at=1,
        request_sd=0.5,
        paired=True,
    ),
    Setup("low 0.60..0.45 x 4, 30 req x 70, clustered", (0.6, 0.55, 0.5, 0.45), 30, 70, shift_at=0, request_sd=0.3),
    Setup("low 0.60..0.45 x 4, 100 req x 21", (0.6, 0.55, 0.5, 0.45), 100, 21, shift_at=0),
)


def _steps(rng: np.random.Generator, p: np.ndarray, setup: Setup, prefix: str) -> StepArrays:
    """One run: ``p`` holds each request's per-position rates (requests x positions)."""
    n_req, per = setup.requests, setup.steps_per_request
    request = np.repeat(np.arange(n_req), per)
    ok = rng.random((n_req * per, p.shape[1])) < p[request]
    accepted = np.cumprod(ok, axis=1).sum(axis=1)
    n = len(request)
    return StepArrays(
        request_ids=tuple(f"{prefix}{r}" for r in range(n_req)),
        prompt_hashes=(None,) * n_req,
        request=request.astype(np.int64),
        step=np.tile(np.arange(per), n_req).astype(np.int64),
        num_proposed=np.full(n, p.shape[1], dtype=np.int64),
        accepted=accepted.astype(np.int64),
        bonus=np.ones(n, dtype=bool),
    )


def _request_rates(rng: np.random.Generator, setup: Setup) -> np.ndarray:
    rates = np.asarray(setup.rates)
    offset = rng.normal(0.0, setup.request_sd, size=(setup.requests, 1)) if setup.request_sd else 0.0
    out: np.ndarray = 1 / (1 + np.exp(-(np.log(rates / (1 - rates))[None, :] + offset)))
    return np.broadcast_to(out, (setup.requests, len(rates)))


def pair(
    rng: np.random.Generator, setup: Setup, shift: float, factor: float = 1.0
) -> tuple[StepArrays, StepArrays]:
    """Runs A and B; B's rate at ``setup.shift_at`` multiplied by ``factor`` and lowered by ``shift``
    (per request)."""
    p_a = _request_rates(rng, setup)
    p_b = (p_a if setup.paired else _request_rates(rng, setup)).copy()
    p_b[:, setup.shift_at] = np.clip(p_b[:, setup.shift_at] * factor - shift, 0.0, 1.0)
    prefix_b = "r" if setup.paired else "b"
    return _steps(rng, p_a, setup, "r" if setup.paired else "a"), _steps(rng, p_b, setup, prefix_b)


def uncorrected_fail(c: AcceptanceComparison) -> bool:
    s = c.settings
    return any(p.selected and p.p_difference < s.alpha and abs(p.effect) > s.margin for p in c.positions)


def run_setup(setup: Setup, n_null: int, n_shifted: int, seed: int, **margin: float) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    t0 = time.perf_counter()
    fails = raw_fails = 0
    reached: list[int] = []
    deff: list[float] = []
    family: list[int] = []
    for _ in range(n_null):
        c = compare_acceptance(*pair(rng, setup, 0.0), **margin)
        fails += c.verdict == "fail"
        raw_fails += uncorrected_fail(c)
        family.append(0 if c.multiplicity is None else c.multiplicity.size)
    found = raw_found = other = 0
    for _ in range(n_shifted):
        c = compare_acceptance(*pair(rng, setup, SHIFT), **margin)
        k = c.positions[setup.shift_at]
        reached.append(min(k.reached_a, k.reached_b))
        deff.append(k.design_effect)
        found += c.verdict == "fail" and k.verdict == "different"
        raw_found += uncorrected_fail(c) and k.p_difference < c.settings.alpha and abs(k.effect) > c.settings.margin
        other += any(p.verdict == "different" for p in c.positions if p.position != setup.shift_at)
    return {
        "setup": setup.name,
        "rates": list(setup.rates),
        "requests": setup.requests,
        "steps_per_request": setup.steps_per_request,
        "request_sd": setup.request_sd,
        "paired": setup.paired,
        "family_size": int(np.median(family)) if family else 0,
        "null_runs": n_null,
        "false_fail": fails / n_null if n_null else math.nan,
        "false_fail_uncorrected": raw_fails / n_null if n_null else math.nan,
        "shifted_runs": n_shifted,
        "shift_at": setup.shift_at,
        "rate_at_shift": setup.rates[setup.shift_at],
        "median_reached_at_shift": float(np.median(reached)) if reached else math.nan,
        "median_design_effect_at_shift": float(np.median(deff)) if deff else math.nan,
        "detected": found / n_shifted if n_shifted else math.nan,
        "detected_uncorrected": raw_found / n_shifted if n_shifted else math.nan,
        "other_position_flagged": other / n_shifted if n_shifted else math.nan,
        "seconds": time.perf_counter() - t0,
    }


def _shares(verdicts: list[str]) -> dict[str, float]:
    n = len(verdicts)
    return {v: (verdicts.count(v) / n if n else math.nan) for v in ("pass", "inconclusive", "fail")}


def run_halving(rate: float, steps: int, requests: int, per: int, n: int, seed: int, **margin: float) -> dict[str, Any]:
    """One draft per step at ``rate``: ``n`` equal-run and ``n`` halved-run comparisons with ``margin`` (the
    margin under test), the halved ones also with the old absolute margin."""
    setup = Setup(f"{rate:g} x 1", (rate,), requests, per, shift_at=0)
    rng = np.random.default_rng(seed)
    t0 = time.perf_counter()
    equal: list[str] = []
    halved: list[str] = []
    halved_old: list[str] = []
    needed: list[int] = []
    for _ in range(n):
        c = compare_acceptance(*pair(rng, setup, 0.0), **margin)
        equal.append(c.verdict)
        if c.positions[0].needed_steps is not None:
            needed.append(c.positions[0].needed_steps)
        runs = pair(rng, setup, 0.0, 0.5)
        halved.append(compare_acceptance(*runs, **margin).verdict)
        halved_old.append(compare_acceptance(*runs, **OLD_MARGIN).verdict)
    return {
        "rate": rate,
        "steps": steps,
        "requests": requests,
        "runs": n,
        "equal": _shares(equal),
        "equal_median_needed_steps": float(np.median(needed)) if needed else math.nan,
        "halved": _shares(halved),
        "halved_absolute_002": _shares(halved_old),
        "seconds": time.perf_counter() - t0,
    }


def _ci95(rate: float, n: int) -> str:
    """Wilson 95% interval of a rate measured over n replicates."""
    if n == 0:
        return "-"
    z = 1.959964
    centre = (rate + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(rate * (1 - rate) / n + z * z / (4 * n * n))
    return f"[{100 * max(0.0, centre - half):.1f}, {100 * min(1.0, centre + half):.1f}]"


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| setup | tests (m) | false fail (95% CI) | no correction | rate at shifted pos | reached there"
        " | design effect there | detected (95% CI) | no correction | other pos flagged |\n"
        "|---|---|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for r in rows:
        lines.append(
            f"| {r['setup']} | {r['family_size']} | {100 * r['false_fail']:.1f}% {_ci95(r['false_fail'], r['null_runs'])}"
            f" | {100 * r['false_fail_uncorrected']:.1f}% | {r['rate_at_shift']:.2f} (pos {r['shift_at']})"
            f" | {r['median_reached_at_shift']:,.0f} | {r['median_design_effect_at_shift']:.2f}"
            f" | {100 * r['detected']:.1f}% {_ci95(r['detected'], r['shifted_runs'])}"
            f" | {100 * r['detected_uncorrected']:.1f}% | {100 * r['other_position_flagged']:.1f}% |"
        )
    return "\n".join(lines)


def halving_table(rows: list[dict[str, Any]]) -> str:
    def pct(d: dict[str, float], n: int) -> str:
        return " / ".join(f"{100 * d[v]:.0f}%" for v in ("pass", "inconclusive", "fail"))

    lines = [
        "| rate | steps | equal: pass / inconcl. / fail | false fail (95% CI) | steps needed to pass (median)"
        " | halved: pass / inconcl. / fail | halved, absolute 0.02: pass / inconcl. / fail |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        n = r["runs"]
        need = r["equal_median_needed_steps"]
        lines.append(
            f"| {r['rate']:g} | {r['steps']:,} | {pct(r['equal'], n)} | {100 * r['equal']['fail']:.1f}%"
            f" {_ci95(r['equal']['fail'], n)} | {'-' if not math.isfinite(need) else f'{need:,.0f}'}"
            f" | {pct(r['halved'], n)} | {pct(r['halved_absolute_002'], n)} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--null", type=int, default=600, help="equal-run comparisons per setup")
    p.add_argument("--shifted", type=int, default=100, help="shifted-run comparisons per setup")
    p.add_argument("--halving", type=int, default=200, help="equal and halved comparisons per rate and length")
    p.add_argument("--seed", type=int, default=0)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--log-odds-margin", type=float, help="the log-odds margin under test (default: the default)")
    g.add_argument("--margin", type=float, help="an absolute margin under test instead")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    margin: dict[str, float] = {}
    if args.log_odds_margin is not None:
        margin["log_odds_margin"] = args.log_odds_margin
    if args.margin is not None:
        margin["margin"] = args.margin
    halving = []
    for i, rate in enumerate(HALVING_RATES):
        for j, (steps, requests, per) in enumerate(HALVING_STEPS):
            halving.append(run_halving(rate, steps, requests, per, args.halving, args.seed + 100 + 10 * i + j, **margin))
            h = halving[-1]
            print(
                f"rate {rate:g}, {steps:,} steps: equal fail {100 * h['equal']['fail']:.1f}%, halved pass"
                f" {100 * h['halved']['pass']:.1f}% ({h['seconds']:.0f} s)",
                file=sys.stderr,
                flush=True,
            )
    rows = []
    for i, setup in enumerate(SETUPS):
        rows.append(run_setup(setup, args.null, args.shifted, args.seed + i, **margin))
        r = rows[-1]
        print(
            f"{setup.name}: false fail {100 * r['false_fail']:.1f}% (uncorrected {100 * r['false_fail_uncorrected']:.1f}%),"
            f" detected {100 * r['detected']:.1f}% ({r['seconds']:.0f} s)",
            file=sys.stderr,
            flush=True,
        )
    print(table(rows))
    print()
    print(halving_table(halving))
    if args.json:
        args.json.write_text(json.dumps({"setups": rows, "halving": halving}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
