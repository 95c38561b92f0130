"""How often the acceptance verdict fails equal runs, and how often it finds a real shift.

    python benchmarks/acceptance_calibration.py [--null 600] [--shifted 400] [--seed 0] [--json out.json]

For each setup, seeded synthetic runs go through ``compare_acceptance`` with its defaults (margin 0.02,
alpha 0.05, 2,000 bootstrap resamples). *Null*: A and B drawn from one distribution; the false-fail rate is
the share of overall ``fail``. *Shifted*: B's conditional rate at one position is 0.05 lower; the
detection rate is the share of comparisons that fail overall with that position ``different``. The
column "no correction" counts the same comparisons as the verdict did before the Holm adjustment: a fail
whenever any selected position has a raw p < alpha and ``|B - A| >`` margin.

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

from validator.judging.acceptance import AcceptanceComparison, StepArrays, compare_acceptance  # noqa: E402

SHIFT = 0.05


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


def pair(rng: np.random.Generator, setup: Setup, shift: float) -> tuple[StepArrays, StepArrays]:
    """Runs A and B; B's rate at ``setup.shift_at`` lowered by ``shift`` (per request)."""
    p_a = _request_rates(rng, setup)
    p_b = (p_a if setup.paired else _request_rates(rng, setup)).copy()
    p_b[:, setup.shift_at] = np.clip(p_b[:, setup.shift_at] - shift, 0.0, 1.0)
    prefix_b = "r" if setup.paired else "b"
    return _steps(rng, p_a, setup, "r" if setup.paired else "a"), _steps(rng, p_b, setup, prefix_b)


def uncorrected_fail(c: AcceptanceComparison) -> bool:
    s = c.settings
    return any(p.selected and p.p_difference < s.alpha and abs(p.diff) > s.margin for p in c.positions)


def run_setup(setup: Setup, n_null: int, n_shifted: int, seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    t0 = time.perf_counter()
    fails = raw_fails = 0
    reached: list[int] = []
    deff: list[float] = []
    family: list[int] = []
    for _ in range(n_null):
        c = compare_acceptance(*pair(rng, setup, 0.0))
        fails += c.verdict == "fail"
        raw_fails += uncorrected_fail(c)
        family.append(0 if c.multiplicity is None else c.multiplicity.size)
    found = raw_found = other = 0
    for _ in range(n_shifted):
        c = compare_acceptance(*pair(rng, setup, SHIFT))
        k = c.positions[setup.shift_at]
        reached.append(min(k.reached_a, k.reached_b))
        deff.append(k.design_effect)
        found += c.verdict == "fail" and k.verdict == "different"
        raw_found += uncorrected_fail(c) and k.p_difference < c.settings.alpha and abs(k.diff) > c.settings.margin
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--null", type=int, default=600, help="equal-run comparisons per setup")
    p.add_argument("--shifted", type=int, default=400, help="shifted-run comparisons per setup")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    rows = []
    for i, setup in enumerate(SETUPS):
        rows.append(run_setup(setup, args.null, args.shifted, args.seed + i))
        r = rows[-1]
        print(
            f"{setup.name}: false fail {100 * r['false_fail']:.1f}% (uncorrected {100 * r['false_fail_uncorrected']:.1f}%),"
            f" detected {100 * r['detected']:.1f}% ({r['seconds']:.0f} s)",
            file=sys.stderr,
            flush=True,
        )
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
