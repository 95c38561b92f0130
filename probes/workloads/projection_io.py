"""Bundles of the projection probe: hidden states read from a captured run bundle, one bundle written per path."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from probes.core.bundle import BundleWriter
from probes.core.shards import ShardSpec

from .projection_config import ProjectionConfig, ProjectionConfigError, ProjectionLayout, short_dtype
from .projection_math import Kernels, PathResult

HIDDEN_NAME = "target.hidden"


def load_hidden_states(
    bundle: str | Path,
    capture_layers: Sequence[int],
    *,
    name: str = HIDDEN_NAME,
    step: int | None = None,
) -> dict[int, torch.Tensor]:
    """Hidden states from a captured run bundle: tensors named ``name`` (default ``target.hidden``),
    coords ``layer=<target layer id>`` (the hidden state entering that layer), full or replicated shard,
    shape ``[tokens, hidden]`` (leading dims are flattened). Every capture layer must be present once.
    """
    from safetensors import safe_open

    root = Path(bundle)
    parts = sorted((root / "parts").glob("*/part.json"))
    if not parts:
        raise ProjectionConfigError(f"{root}: no complete parts (parts/*/part.json) in this bundle")
    found: dict[int, list[tuple[Path, dict[str, Any]]]] = {}
    for pj in parts:
        try:
            records = json.loads(pj.read_text())["tensors"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ProjectionConfigError(f"{pj}: unreadable part record: {exc}") from None
        for r in records:
            coords = r.get("coords") or {}
            if r.get("name") != name or coords.get("layer") not in capture_layers:
                continue
            if step is not None and coords.get("step") != step:
                continue
            kind = (r.get("shard") or {}).get("kind", "full")
            if kind not in ("full", "replicated"):
                raise ProjectionConfigError(
                    f"{pj}: {name} layer={coords['layer']} is a {kind} shard; the probe needs whole hidden states"
                )
            found.setdefault(coords["layer"], []).append((pj.parent, r))
    missing = [c for c in capture_layers if c not in found]
    if missing:
        raise ProjectionConfigError(
            f"{root}: no {name!r} tensor for capture layer(s) {missing} (found layers {sorted(found)}): "
            "the feature set would be incomplete"
        )
    out: dict[int, torch.Tensor] = {}
    for c in capture_layers:
        recs = found[c]
        if kind_of(recs[0][1]) == "full" and len(recs) > 1:
            raise ProjectionConfigError(f"{root}: {len(recs)} {name!r} tensors for layer {c}; pass step= to pick one")
        part_dir, r = recs[0]
        with safe_open(str(part_dir / r["file"]), framework="pt") as f:
            t = f.get_tensor(r["key"])
        out[c] = t.reshape(-1, t.shape[-1])
    shapes = {tuple(t.shape) for t in out.values()}
    if len(shapes) != 1:
        raise ProjectionConfigError(f"{root}: capture layers have different shapes {sorted(shapes)}")
    return out


@dataclass
class ProbeRun:
    """One run of the projection probe (``projection.run_probe``): what its bundles record."""

    config: ProjectionConfig
    layout: ProjectionLayout
    kernels: Kernels
    paths: dict[str, PathResult]
    handoff: dict[str, Any]
    environment: dict[str, Any]
    bundles: dict[str, str]
    input_source: str


def kind_of(record: Mapping[str, Any]) -> str:
    return str((record.get("shard") or {}).get("kind", "full"))


def write_path_bundle(out_dir: Path, prefix: str, res: PathResult, run: ProbeRun, write_stages: bool) -> str:
    """One path's results as a run bundle under ``out_dir/<path>/`` (its directory is returned)."""
    cfg, layout = run.config, run.layout
    kern = res.kernels
    labels = {
        "model": cfg.model,
        "draft": cfg.draft,
        "topology": f"pp{cfg.pp}",
        "pp_split": ",".join(map(str, layout.sizes)),
        "dtype": short_dtype(cfg.dtype),
        "tokens": str(cfg.tokens),
        "seed": str(cfg.seed),
        "kernels": f"rmsnorm={kern['rmsnorm']},rope={kern['rope']}",
        "path": res.name,
    }
    if res.accum_dtype is not None:  # the single-GEMM path has no running sum, so no accumulation dtype
        labels["accum"] = str(res.accum_dtype)
    extra = {
        "probe": "projection",
        "config": cfg.to_dict(),
        "layout": layout.to_dict(),
        "kernels": kern,
        "path": {"name": res.name, "compute_dtype": res.compute_dtype, "accum_dtype": res.accum_dtype},
        "handoff_bytes": run.handoff,
        "environment": run.environment,
        "inputs": run.input_source,
    }
    root = out_dir / res.name
    tok = (0, cfg.tokens)
    with BundleWriter(root, run_name=f"{prefix}-{res.name}", labels=labels, manifest=extra) as w:
        w.add("ctx.pre_norm", res.pre_norm, tokens=tok)
        w.add("ctx.normed", res.normed, tokens=tok)
        for i, (k, v) in enumerate(zip(res.k, res.v)):
            w.add("draft.k", k, tokens=tok, layer=i)
            w.add("draft.v", v, tokens=tok, layer=i)
        if write_stages:
            for so in res.stages:
                if so.partial is not None:
                    w.add(
                        "ctx.partial",
                        so.partial,
                        tokens=tok,
                        pp_stage=so.stage,
                        shard=ShardSpec.partial(so.stage, cfg.pp),
                    )
                w.add("ctx.running", so.running, tokens=tok, pp_stage=so.stage, after_stage=so.stage)
    return str(root)
