"""Configuration and layer layout of the projection probe: dtypes, :class:`ProjectionConfig`, the PP stage
plan with every structural check (run before any arithmetic), path names, and the hand-off sizes."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

DTYPES: dict[str, torch.dtype] = {
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp32": torch.float32,
    "fp64": torch.float64,
}
_ALIASES = {
    "bfloat16": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "float32": "fp32",
    "float": "fp32",
    "float64": "fp64",
    "double": "fp64",
}


class ProjectionConfigError(ValueError):
    """A probe configuration or layer layout that cannot describe a valid DFlash context path."""


def short_dtype(name: str | torch.dtype) -> str:
    if isinstance(name, torch.dtype):
        for k, v in DTYPES.items():
            if v == name:
                return k
        raise ProjectionConfigError(f"unsupported dtype {name}")
    key = _ALIASES.get(name.lower(), name.lower())
    if key not in DTYPES:
        raise ProjectionConfigError(f"unknown dtype {name!r}; expected one of {', '.join(DTYPES)} (or bfloat16, ...)")
    return key


# -- configuration and layout -------------------------------------------------------------------


@dataclass(frozen=True)
class ProjectionConfig:
    """Shapes and numerics of one probe run. Defaults: Kimi-K3 target + DFlash draft, PP8, one 8192 chunk."""

    hidden: int = 7168
    layers: int = 93
    capture_layers: tuple[int, ...] = (19, 37, 54, 66, 78, 90)
    pp: int = 8
    # Stage ranges [start, end) in stage order; None = even split (first stages take the remainder).
    pp_split: tuple[tuple[int, int], ...] | None = None
    draft_layers: int = 6
    kv_heads: int = 8
    head_dim: int = 128
    rope_theta: float = 10000.0
    eps: float = 1e-6
    tokens: int = 8192
    dtype: str = "bf16"
    seed: int = 0
    # Where hidden_norm goes. Only "after_sum" is valid; "per_stage" exists so the mistake can be asked
    # for (and refused) explicitly.
    norm: str = "after_sum"
    model: str = "kimi-k3"
    draft: str = "dflash"

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[short_dtype(self.dtype)]

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["capture_layers"] = list(self.capture_layers)
        d["pp_split"] = None if self.pp_split is None else [list(r) for r in self.pp_split]
        d["dtype"] = short_dtype(self.dtype)
        return d


@dataclass(frozen=True)
class StagePlan:
    stage: int
    start: int  # first layer owned
    end: int  # one past the last layer owned
    capture_layers: tuple[int, ...]  # capture layers owned, ascending
    features: tuple[int, ...]  # their positions in the feature order (column blocks of W)

    def to_dict(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "layers": [self.start, self.end],
            "capture_layers": list(self.capture_layers),
            "features": list(self.features),
        }


@dataclass(frozen=True)
class ProjectionLayout:
    stages: tuple[StagePlan, ...]
    split_source: str  # "even" or "given"

    @property
    def sizes(self) -> list[int]:
        return [s.end - s.start for s in self.stages]

    @property
    def first_contributing_stage(self) -> int:
        return next(s.stage for s in self.stages if s.capture_layers)

    def to_dict(self) -> dict[str, Any]:
        return {"split": self.split_source, "sizes": self.sizes, "stages": [s.to_dict() for s in self.stages]}


def even_split(layers: int, pp: int) -> tuple[tuple[int, int], ...]:
    """Layers over stages as SGLang does by default: ``layers // pp`` each, the first ``layers % pp`` get one more."""
    if pp < 1 or layers < pp:
        raise ProjectionConfigError(f"cannot split {layers} layers over {pp} pipeline stages")
    base, extra = divmod(layers, pp)
    out, start = [], 0
    for s in range(pp):
        n = base + (1 if s < extra else 0)
        out.append((start, start + n))
        start += n
    return tuple(out)


def parse_pp_split(text: str) -> tuple[tuple[int, int], ...]:
    """``"12,12,11"`` (layers per stage) or ``"0:12,12:24,24:35"`` (explicit [start, end) ranges)."""
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise ProjectionConfigError(f"empty PP split {text!r}")
    try:
        if all(":" in t for t in items):
            return tuple((int(a), int(b)) for a, b in (t.split(":", 1) for t in items))
        if any(":" in t for t in items):
            raise ProjectionConfigError(f"PP split {text!r} mixes sizes and ranges")
        out, start = [], 0
        for t in items:
            n = int(t)
            out.append((start, start + n))
            start += n
        return tuple(out)
    except ValueError as exc:
        if isinstance(exc, ProjectionConfigError):
            raise
        raise ProjectionConfigError(f"cannot parse PP split {text!r}: {exc}") from None


def _ranges_text(layers: Sequence[int]) -> str:
    """Compress sorted layer ids: [3, 4, 5, 9] -> '3-5, 9'."""
    runs: list[list[int]] = []
    for x in layers:
        if runs and runs[-1][1] == x - 1:
            runs[-1][1] = x
        else:
            runs.append([x, x])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def plan_layout(cfg: ProjectionConfig) -> ProjectionLayout:
    """All structural checks, before any arithmetic. Raises :class:`ProjectionConfigError`."""
    for name in ("hidden", "layers", "pp", "draft_layers", "kv_heads", "head_dim", "tokens"):
        v = getattr(cfg, name)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ProjectionConfigError(f"{name} must be a positive integer, got {v!r}")
    if cfg.head_dim % 2:
        raise ProjectionConfigError(f"head_dim {cfg.head_dim} must be even for neox RoPE (rotary dim = head_dim)")
    if not (cfg.eps > 0 and math.isfinite(cfg.eps)) or not (cfg.rope_theta > 1 and math.isfinite(cfg.rope_theta)):
        raise ProjectionConfigError(f"eps must be > 0 and rope_theta > 1, got {cfg.eps}, {cfg.rope_theta}")
    short_dtype(cfg.dtype)
    if cfg.norm != "after_sum":
        raise ProjectionConfigError(
            f"norm placement {cfg.norm!r} refused: hidden_norm must be applied once, after the full sum of the "
            "stage partials (RMSNorm is not additive: norm(a) + norm(b) != norm(a + b))"
        )
    caps = list(cfg.capture_layers)
    if not caps:
        raise ProjectionConfigError("no capture layers given")
    for c in caps:
        if isinstance(c, bool) or not isinstance(c, int) or not 0 <= c < cfg.layers:
            raise ProjectionConfigError(f"capture layer {c!r} is out of range for a {cfg.layers}-layer target")
    dup = sorted({c for c in caps if caps.count(c) > 1})
    if dup:
        raise ProjectionConfigError(f"capture layer(s) {dup} listed twice: each feature block must be a distinct layer")
    for i in range(1, len(caps)):
        if caps[i] < caps[i - 1]:
            raise ProjectionConfigError(
                f"capture layers {caps} are out of order ({caps[i - 1]} before {caps[i]}): the feature order "
                "(column blocks of fc) must follow checkpoint layer order"
            )
    ranges = cfg.pp_split if cfg.pp_split is not None else even_split(cfg.layers, cfg.pp)
    if len(ranges) != cfg.pp:
        raise ProjectionConfigError(f"PP split has {len(ranges)} stages, PP size is {cfg.pp}")
    owner: dict[int, list[int]] = {}
    for s, (a, b) in enumerate(ranges):
        if b <= a:
            raise ProjectionConfigError(f"stage {s} owns no layers ({a}:{b}); every stage needs at least one")
        if a < 0 or b > cfg.layers:
            raise ProjectionConfigError(f"stage {s} range {a}:{b} is outside layers 0..{cfg.layers - 1}")
        for layer in range(a, b):
            owner.setdefault(layer, []).append(s)
    lost_caps = [c for c in caps if c not in owner]
    if lost_caps:
        raise ProjectionConfigError(
            f"capture layer(s) {lost_caps} belong to no pipeline stage: their features would be silently dropped "
            f"(split {_fmt_ranges(ranges)} over {cfg.layers} layers)"
        )
    multi_caps = [c for c in caps if len(owner[c]) > 1]
    if multi_caps:
        raise ProjectionConfigError(
            f"capture layer(s) {multi_caps} belong to more than one stage ({ {c: owner[c] for c in multi_caps} }): "
            "their features would be counted twice"
        )
    missing = [layer for layer in range(cfg.layers) if layer not in owner]
    if missing:
        raise ProjectionConfigError(f"layer(s) {_ranges_text(missing)} are in no stage (split {_fmt_ranges(ranges)})")
    overlap = sorted(layer for layer, o in owner.items() if len(o) > 1)
    if overlap:
        raise ProjectionConfigError(f"layer(s) {_ranges_text(overlap)} are in more than one stage")
    for s in range(1, len(ranges)):
        if ranges[s][0] != ranges[s - 1][1]:
            raise ProjectionConfigError(
                f"stages are not in layer order: stage {s} starts at {ranges[s][0]}, "
                f"stage {s - 1} ends at {ranges[s - 1][1]}"
            )
    stages = []
    for s, (a, b) in enumerate(ranges):
        own = tuple(c for c in caps if a <= c < b)
        stages.append(StagePlan(s, a, b, own, tuple(caps.index(c) for c in own)))
    return ProjectionLayout(tuple(stages), "given" if cfg.pp_split is not None else "even")


def _fmt_ranges(ranges: Sequence[tuple[int, int]]) -> str:
    return ",".join(f"{a}:{b}" for a, b in ranges)


def default_paths(cfg: ProjectionConfig) -> tuple[str, ...]:
    out = ["concat", f"partial-{short_dtype(cfg.dtype)}", "partial-fp32", "ref"]
    return tuple(dict.fromkeys(out))


def check_path(name: str) -> str | None:
    """Accumulation dtype of a partial path, None for concat/ref; raises on unknown names."""
    if name in ("concat", "ref"):
        return None
    if name.startswith("partial-") and name.removeprefix("partial-") in DTYPES:
        return name.removeprefix("partial-")
    raise ProjectionConfigError(f"unknown path {name!r}; expected concat, ref or partial-<{'|'.join(DTYPES)}>")


def handoff_bytes(cfg: ProjectionConfig, layout: ProjectionLayout) -> dict[str, Any]:
    """Size of the PP running-sum hand-off (``tokens x hidden`` in the accumulation dtype) per stage boundary."""
    out: dict[str, Any] = {
        "tokens": cfg.tokens,
        "hidden": cfg.hidden,
        "boundaries": cfg.pp - 1,
        # boundaries that must carry a non-zero sum (from the first stage owning a capture layer on)
        "boundaries_carrying_sum": cfg.pp - 1 - layout.first_contributing_stage,
        "raw_features_instead_bytes_per_token": len(cfg.capture_layers) * cfg.hidden * cfg.torch_dtype.itemsize,
    }
    for acc in ("bf16", "fp32"):
        per_token = cfg.hidden * DTYPES[acc].itemsize
        out[acc] = {
            "bytes_per_token_per_stage": per_token,
            "bytes_per_handoff": per_token * cfg.tokens,
            "bytes_per_chunk_all_boundaries": per_token * cfg.tokens * out["boundaries_carrying_sum"],
        }
    return out
