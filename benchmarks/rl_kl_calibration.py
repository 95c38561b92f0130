"""How often the RL train/rollout KL verdict fails a flat series (false alarm), and how often it catches drift.

    python benchmarks/rl_kl_calibration.py [--series 200] [--seed 0] [--json out.json]

Synthetic token log-ratios ``r = train - rollout`` with KL(rollout || train) = ``L_t`` at step t: each token's
``r ~ N(-v/2, v)`` (so ``E[exp r] = 1``, a proper density ratio, and KL = ``v/2``), with ``v`` a mixture (97% of
tokens small, 3% twenty times larger: heavy tails) times a per-sample factor (lognormal, sd 0.5, mean 1: tokens
of one sample correlated). Series:

- *null*: flat at the floor 2e-3; *null, jittered*: each step's level times a lognormal of mean 1 and sd 0.1
  (batches differ); *null, jittered 25%* and *40%*: sd 0.25 and 0.4 (a healthy run whose batches move k3 as much
  as benchmarks/rl_h200.md's did);
- *drift to 2x* / *drift to 1.5x*: linear growth from the floor to 2x (1.5x) at the last step;
- *stale weights*: 3 consecutive steps at 2.5x in the second half; *step up*: 1.6x from the middle on.

Each series is judged with the floor declared (2e-3) and estimated (first 5 steps; also with ``variation =
"sampling"``, the estimated floor judged by sampling error alone, for comparison). ``step_stats`` runs once per
series and ``judge_steps`` once per setting, so the grid costs little. A *false alarm* is a null series judged
``above floor`` or ``diverging``; a *detection* a drifting one judged so.
"""

from __future__ import annotations

import argparse
import itertools
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

from validator.judging.rl_kl import KLSettings, StepStats, judge_steps, step_stats  # noqa: E402

FLOOR = 2e-3
TAIL_SHARE, TAIL_FACTOR, SAMPLE_SD = 0.03, 20.0, 0.5


@dataclass(frozen=True)
class Setup:
    name: str
    steps: int
    samples: int
    tokens: int


SETUPS = (
    Setup("40 steps x 64 samples x 128 tokens", 40, 64, 128),
    Setup("20 steps x 16 samples x 64 tokens", 20, 16, 64),
    Setup("100 steps x 32 samples x 64 tokens", 100, 32, 64),
)


def levels(kind: str, steps: int, rng: np.random.Generator) -> np.ndarray:
    t = np.arange(steps, dtype=np.float64)
    base = np.full(steps, FLOOR)
    if kind == "null":
        return base
    if kind == "null, jittered":
        return base * rng.lognormal(-0.1**2 / 2, 0.1, steps)
    if kind == "null, jittered 25%":
        return base * rng.lognormal(-0.25**2 / 2, 0.25, steps)
    if kind == "null, jittered 40%":
        return base * rng.lognormal(-0.4**2 / 2, 0.4, steps)
    if kind == "drift to 2x":
        return FLOOR * (1 + t / (steps - 1))
    if kind == "drift to 1.5x":
        return FLOOR * (1 + 0.5 * t / (steps - 1))
    if kind == "stale weights":
        at = int(rng.integers(steps // 2, steps - 3))
        base[at : at + 3] *= 2.5
        return base
    if kind == "step up":
        base[steps // 2 :] *= 1.6
        return base
    raise ValueError(kind)


KINDS = ("null", "null, jittered", "null, jittered 25%", "null, jittered 40%", "drift to 2x", "drift to 1.5x", "stale weights", "step up")
NULL_KINDS = ("null", "null, jittered")  # the grid's "worst false alarm"; the 25% and 40% jitters are reported apart
MODES = ("declared", "estimated", "estimated, sampling")


def series_stats(setup: Setup, lv: np.ndarray, rng: np.random.Generator, settings: KLSettings) -> StepStats:
    s, n, t = setup.steps, setup.samples, setup.tokens
    mix = 1.0 - TAIL_SHARE + TAIL_SHARE * TAIL_FACTOR
    per_sample = rng.lognormal(-SAMPLE_SD**2 / 2, SAMPLE_SD, (s, n, 1))
    tail = np.where(rng.random((s, n, t)) < TAIL_SHARE, TAIL_FACTOR, 1.0)
    v = 2 * lv[:, None, None] / mix * per_sample * tail
    r = rng.normal(size=(s, n, t)) * np.sqrt(v) - v / 2
    step = np.repeat(np.arange(s), n * t)
    sample = np.tile(np.repeat(np.arange(n), t), s)
    ro = np.full(step.size, -1.0)
    return step_stats(step, sample, ro, ro + r.ravel(), resamples=settings.resamples, seed=settings.seed)


GRID = {
    "tolerance": (1.25, 1.5, 2.0),
    "trend_alpha": (0.01, 0.05),
    "min_rise": (0.0, 0.25, 0.5),
}


def run(n_series: int, seed: int) -> dict[str, Any]:
    base = KLSettings()
    combos = [dict(zip(GRID, vals)) for vals in itertools.product(*GRID.values())]
    out: dict[str, Any] = {"series": n_series, "seed": seed, "default": {k: getattr(base, k) for k in GRID}, "setups": []}
    for si, setup in enumerate(SETUPS):
        rng = np.random.default_rng([seed, si])
        counts: dict[tuple[str, str, int], dict[str, int]] = {}
        t0 = time.perf_counter()
        for kind in KINDS:
            for _ in range(n_series):
                stats = series_stats(setup, levels(kind, setup.steps, rng), rng, base)
                for floor_mode, floor in zip(MODES, (FLOOR, None, None)):
                    for ci, combo in enumerate(combos):
                        if floor_mode == "estimated, sampling" and combo != {k: getattr(base, k) for k in GRID}:
                            continue  # the comparison: the defaults only
                        variation = "sampling" if floor_mode == "estimated, sampling" else base.variation
                        cfg = KLSettings(floor=floor, variation=variation, **combo)  # type: ignore[arg-type]
                        verdict = judge_steps(stats, cfg).verdict
                        c = counts.setdefault((kind, floor_mode, ci), {})
                        c[verdict] = c.get(verdict, 0) + 1
        rows = []
        for (kind, floor_mode, ci), c in counts.items():
            fail = c.get("above floor", 0) + c.get("diverging", 0)
            rows.append(
                {
                    "kind": kind,
                    "floor": floor_mode,
                    "settings": combos[ci],
                    "verdicts": c,
                    "fail_rate": fail / n_series,
                    "fail_ci": wilson(fail, n_series),
                    "inconclusive_rate": c.get("inconclusive", 0) / n_series,
                    "at_floor_rate": c.get("at floor", 0) / n_series,
                }
            )
        out["setups"].append({"name": setup.name, "seconds": round(time.perf_counter() - t0, 1), "rows": rows})
        print(f"{setup.name}: {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return out


def wilson(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z / d * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (max(0.0, c - h), min(1.0, c + h))


def table(doc: dict[str, Any], settings: dict[str, float]) -> str:
    """Markdown: one row per setup and floor mode, the rates of each series kind under ``settings``."""
    head = "| setup | floor | " + " | ".join(KINDS) + " |"
    lines = [head, "|" + "---|" * (len(KINDS) + 2)]
    for s in doc["setups"]:
        for mode in MODES:
            cells = []
            for kind in KINDS:
                (row,) = [r for r in s["rows"] if r["kind"] == kind and r["floor"] == mode and r["settings"] == settings]
                lo, hi = row["fail_ci"]
                inc = f", inc. {100 * row['inconclusive_rate']:.0f}%" if row["inconclusive_rate"] else ""
                cells.append(f"{100 * row['fail_rate']:.1f}% [{100 * lo:.1f}, {100 * hi:.1f}]{inc}")
            lines.append(f"| {s['name']} | {mode} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def at_floor_table(doc: dict[str, Any], settings: dict[str, float]) -> str:
    """Markdown: per setup and floor mode, the share of each null kind judged ``at floor``."""
    nulls = KINDS[: len(NULL_KINDS) + 2]
    lines = ["| setup | floor | " + " | ".join(nulls) + " |", "|" + "---|" * (len(nulls) + 2)]
    for s in doc["setups"]:
        for mode in MODES:
            cells = []
            for kind in nulls:
                (row,) = [r for r in s["rows"] if r["kind"] == kind and r["floor"] == mode and r["settings"] == settings]
                cells.append(f"{100 * row['at_floor_rate']:.1f}%")
            lines.append(f"| {s['name']} | {mode} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def grid_table(doc: dict[str, Any]) -> str:
    """Markdown: per setting, the worst false-alarm rate and the mean detection rate per drifting kind, over setups."""
    combos = {json.dumps(r["settings"], sort_keys=True) for s in doc["setups"] for r in s["rows"]}
    drifts = KINDS[len(NULL_KINDS) + 2 :]
    lines = ["| tolerance | trend_alpha | min_rise | worst false alarm | jittered 25% | jittered 40% | " + " | ".join(drifts) + " |",
             "|" + "---|" * (6 + len(drifts))]
    for key in sorted(combos):
        st = json.loads(key)
        rows = [r for s in doc["setups"] for r in s["rows"] if r["settings"] == st and r["floor"] != MODES[2]]
        fa = max(r["fail_rate"] for r in rows if r["kind"] in NULL_KINDS)
        j25 = max(r["fail_rate"] for r in rows if r["kind"] == "null, jittered 25%")
        j40 = max(r["fail_rate"] for r in rows if r["kind"] == "null, jittered 40%")
        det = [np.mean([r["fail_rate"] for r in rows if r["kind"] == k]) for k in drifts]
        lines.append(f"| {st['tolerance']} | {st['trend_alpha']} | {st['min_rise']} | {100 * fa:.1f}% | {100 * j25:.1f}% | {100 * j40:.1f}% | "
                     + " | ".join(f"{100 * d:.1f}%" for d in det) + " |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--series", type=int, default=200, help="series per kind and setup (default 200)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write the full results here")
    args = ap.parse_args()
    t0 = time.perf_counter()
    doc = run(args.series, args.seed)
    doc["seconds"] = round(time.perf_counter() - t0, 1)
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=1))
    print(f"## Defaults {doc['default']}\n")
    print(table(doc, doc["default"]))
    print("\n## Healthy series confirmed: the share judged `at floor` (defaults)\n")
    print(at_floor_table(doc, doc["default"]))
    print("\n## Grid (worst false alarm over setups and floor modes; detection averaged over them)\n")
    print(grid_table(doc))
    print(f"\n{doc['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
