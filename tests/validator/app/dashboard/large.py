"""A Kimi-scale comparison for the dashboard: 5,000 pairs, stored through the real ingest and compare paths.

93 layers x 3 capture points x 16 steps (4,464 tensors), plus a fourth capture point on the last 33 layers
(528) and 8 pipeline-stage sums at the last step (8): 5,000 logical tensors per run. Three runs:

- ``ref``: the reference; ``rerun``: the same at small noise (the noise floor pair is ref vs rerun);
- ``cand``: floor-level noise, except layers 80 and up from step 12 on, where the error grows: those 208
  pairs (13 layers x 4 steps x 4 capture points) fail.

Tensors are tiny (4 x 16 float32): the page's cost is in the number of pairs, not their size. Building
takes about a minute on a 2-core box, most of it the comparison (10,000 measured pairs with the floor
pair's).

    python -m tests.validator.app.dashboard.large HOME     # build a store at HOME (benchmarks/dashboard_bench.py)
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from probes import BundleWriter
from validator.service import Service
from validator.settings import Settings

LAYERS, STEPS = 93, 16
POINTS = ("attn.out", "mlp.out", "hidden")
ROUTER = "moe.router"  # the fourth capture point, on layers ROUTER_FROM.. only
ROUTER_FROM = 60
STAGES = 8  # pipeline-stage sums ("after_stage=N") at the last step
DRIFT_LAYER, DRIFT_STEP = 80, 12  # cand drifts from here on
SHAPE = (4, 16)
NAMES = {"ref": "kimi-d-ref", "rerun": "kimi-d-rerun", "cand": "kimi-pd-cand"}
FAILING = (LAYERS - DRIFT_LAYER) * (STEPS - DRIFT_STEP) * (len(POINTS) + 1)


def tensors() -> Iterator[tuple[str, dict[str, Any]]]:
    """(capture point, coords) of every logical tensor, in capture order: per step, per layer, per point."""
    for step in range(STEPS):
        for layer in range(LAYERS):
            for name in POINTS:
                yield name, {"step": step, "layer": layer}
            if layer >= ROUTER_FROM:
                yield ROUTER, {"step": step, "layer": layer}
    for stage in range(STAGES):
        yield "pp.sum", {"step": STEPS - 1, "after_stage": stage}


N_PAIRS = sum(1 for _ in tensors())


def drifts(coords: dict[str, Any]) -> bool:
    layer, step = coords.get("layer"), coords.get("step")
    return isinstance(layer, int) and isinstance(step, int) and layer >= DRIFT_LAYER and step >= DRIFT_STEP


def write_bundle(path: Path, run_name: str, *, noise: float, seed: int, drift: bool) -> Path:
    base = torch.Generator().manual_seed(0)
    g = torch.Generator().manual_seed(seed)
    with BundleWriter(path, run_name=run_name, part="rank0", labels={"model": "kimi-k3-toy"}) as w:
        for name, coords in tensors():
            t = torch.randn(SHAPE, generator=base)
            scale = noise
            if drift and drifts(coords):
                scale = noise * 40.0 * (1 + coords["layer"] - DRIFT_LAYER)
            w.add(name, t + t.abs().mean() * scale * torch.randn(SHAPE, generator=g), **coords)
    return path


def build_store(home: Path, work: Path) -> dict[str, str]:
    """Ingest the three runs into the store at ``home``; returns role -> run name."""
    specs = {"ref": (0.0, 1, False), "rerun": (2e-4, 2, False), "cand": (2e-4, 3, True)}
    svc = Service(Settings(home=home))
    try:
        for role, (noise, seed, drift) in specs.items():
            svc.ingest(write_bundle(work / role, NAMES[role], noise=noise, seed=seed, drift=drift), name=NAMES[role])
    finally:
        svc.close()
    return dict(NAMES)


def compare(home: Path, names: dict[str, str]) -> int:
    """The cached comparison of cand against ref with the floor pair (computed now); returns its id."""
    svc = Service(Settings(home=home))
    try:
        rec = svc.cached_comparison(names["ref"], names["cand"], floor=(names["ref"], names["rerun"]), background=False)
    finally:
        svc.close()
    assert rec["status"] == "done", rec
    return int(rec["id"])


if __name__ == "__main__":
    home = Path(sys.argv[1])
    names = build_store(home, home.parent / (home.name + "-bundles"))
    print(names, "comparison", compare(home, names))
