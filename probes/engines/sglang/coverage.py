"""Capture coverage under pipeline parallelism: was every capture layer captured on the stage that owns it?

Each rank's part records (``extra.probe.sglang.coverage``) the layers its stage owns, the layers SGLang
itself was configured to capture there (``layers_to_capture`` / ``dspark_layers_to_capture``, normalised
to layer-output ids) and the capture layers the probes saw. :func:`check_coverage` combines the parts:
a capture layer that no stage owns, that its owner is not configured to capture (the bug class of
SGLang's "capture only on the last PP rank", PR #39644), or that was never seen, is a problem. Pure
Python; :func:`read_reports` reads the JSON of a bundle's parts.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["CoverageResult", "check_coverage", "read_reports"]


@dataclass(frozen=True)
class CoverageResult:
    capture_layers: tuple[int, ...]
    stages: Mapping[int, tuple[int, int]]  # pp stage -> owned [start, end)
    problems: tuple[str, ...]
    layers: Mapping[int, dict[str, Any]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return bool(self.capture_layers) and not self.problems

    def __bool__(self) -> bool:
        return self.ok

    def lines(self) -> list[str]:
        head = f"capture layers {list(self.capture_layers)} over {len(self.stages)} PP stage(s): {'OK' if self.ok else 'PROBLEMS'}"
        return [head, *(f"  {p}" for p in self.problems)]


def read_reports(bundle: str | Path) -> list[dict[str, Any]]:
    """The plugin reports (``extra.probe.sglang``) of every complete part of a bundle."""
    out = []
    for pj in sorted(Path(bundle).glob("parts/*/part.json")):
        doc = json.loads(pj.read_text())
        rep = ((doc.get("extra") or {}).get("probe") or {}).get("sglang")
        if isinstance(rep, dict):
            out.append({**rep, "part": doc.get("part", pj.parent.name)})
    return out


def check_coverage(reports: Iterable[Mapping[str, Any]], capture_layers: Iterable[int] | None = None) -> CoverageResult:
    reps = list(reports)
    layers: list[int] = list(capture_layers or [])
    if not layers:
        for r in reps:
            cov = r.get("coverage") or {}
            cl = cov.get("capture_layers") or r.get("capture_layers")
            if cl:
                layers = [int(x) for x in cl]
                break
    stages: dict[int, tuple[int, int]] = {}
    configured: dict[int, set[int] | None] = {}
    seen: set[int] = set()
    problems: list[str] = []
    for r in reps:
        cov = r.get("coverage") or {}
        stage = int((r.get("coords") or {}).get("pp_stage", 0))
        owned = cov.get("owned")
        if owned:
            span = (int(owned[0]), int(owned[1]))
            if stage in stages and stages[stage] != span:
                problems.append(f"stage {stage}: parts disagree on the layers it owns ({stages[stage]} vs {span})")
            stages[stage] = span
        cfg = cov.get("sglang_capture")
        if cfg is not None:
            prev = configured.get(stage)
            configured[stage] = (prev or set()) | {int(x) for x in cfg}
        else:
            configured.setdefault(stage, None)
        seen |= {int(x) for x in cov.get("seen") or []}
    if not layers:
        problems.append("no capture layers known (set VALIDATOR_SGLANG_CAPTURE_LAYERS, or capture ctx.project)")
    per_layer: dict[int, dict[str, Any]] = {}
    for layer in layers:
        owners = [s for s, (a, b) in stages.items() if a <= layer < b]
        conf = [configured.get(s) for s in owners]
        info = {
            "owners": owners,
            "configured": None if not conf or conf[0] is None else layer in conf[0],
            "seen": layer in seen,
        }
        per_layer[layer] = info
        if stages and not owners:
            problems.append(f"layer {layer}: no PP stage owns it (stages own {sorted(stages.values())})")
        if info["configured"] is False:
            problems.append(
                f"layer {layer}: stage {owners[0]} owns it but SGLang does not capture it there "
                f"(configured: {sorted(conf[0] or [])}); its feature is missing or taken from elsewhere"
            )
        if not info["seen"]:
            problems.append(f"layer {layer}: never seen by the probes on any stage")
    return CoverageResult(tuple(layers), stages, tuple(problems), per_layer)
