"""The projection probe: a reference implementation of the DFlash context path, three ways.

From the same target hidden states (one ``[tokens, hidden]`` tensor per capture layer) it computes

- ``concat``: one GEMM over the concatenated features, ``cat(h_a, h_b, ...) @ W.T`` (PP1 / SGLang main);
- ``partial-<acc>``: per-stage GEMMs ``x_local @ W[:, cols].T`` added into a running sum that is handed
  from stage to stage in pipeline order, in accumulation dtype ``<acc>`` (``bf16`` as deployed, or
  ``fp32``); a stage with no capture layer hands the sum on untouched;
- ``ref``: the same in float64 throughout (torch kernels only),

then, for each path, the RMSNorm'd context (``hidden_norm``, applied once after the full sum) and, for
every draft layer, K (K rows of the fused QKV weight -> per-head ``k_norm`` -> neox RoPE) and V (V rows).

Layout checks run before any arithmetic and raise :class:`ProjectionConfigError`. Needs torch only;
flashinfer is imported lazily, on CUDA, for RMSNorm and RoPE. Writes one run bundle per path.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .bundle import BundleWriter
from .shards import ShardSpec

__all__ = [
    "DTYPES",
    "Kernels",
    "PathResult",
    "ProbeRun",
    "ProjectionConfig",
    "ProjectionConfigError",
    "ProjectionLayout",
    "ProjectionWeights",
    "StageOutput",
    "StagePlan",
    "compute_path",
    "default_paths",
    "even_split",
    "handoff_bytes",
    "load_hidden_states",
    "make_hidden_states",
    "make_weights",
    "parse_pp_split",
    "plan_layout",
    "run_probe",
    "select_kernels",
]

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
HIDDEN_NAME = "target.hidden"


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
        raise ProjectionConfigError(
            f"unknown dtype {name!r}; expected one of {', '.join(DTYPES)} (or bfloat16, ...)"
        )
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
        raise ProjectionConfigError(
            f"head_dim {cfg.head_dim} must be even for neox RoPE (rotary dim = head_dim)"
        )
    if not (cfg.eps > 0 and math.isfinite(cfg.eps)) or not (
        cfg.rope_theta > 1 and math.isfinite(cfg.rope_theta)
    ):
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
            raise ProjectionConfigError(
                f"capture layer {c!r} is out of range for a {cfg.layers}-layer target"
            )
    dup = sorted({c for c in caps if caps.count(c) > 1})
    if dup:
        raise ProjectionConfigError(
            f"capture layer(s) {dup} listed twice: each feature block must be a distinct layer"
        )
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
        raise ProjectionConfigError(
            f"layer(s) {_ranges_text(missing)} are in no stage (split {_fmt_ranges(ranges)})"
        )
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


def _check_path(name: str) -> str | None:
    """Accumulation dtype of a partial path, None for concat/ref; raises on unknown names."""
    if name in ("concat", "ref"):
        return None
    if name.startswith("partial-") and name.removeprefix("partial-") in DTYPES:
        return name.removeprefix("partial-")
    raise ProjectionConfigError(
        f"unknown path {name!r}; expected concat, ref or partial-<{'|'.join(DTYPES)}>"
    )


# -- inputs ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProjectionWeights:
    fc: torch.Tensor  # [hidden, n_capture * hidden], bias-free
    hidden_norm: torch.Tensor  # [hidden]
    kv: tuple[
        torch.Tensor, ...
    ]  # per draft layer: K rows then V rows of the fused QKV weight, [2*kv*hd, hidden]
    k_norm: tuple[torch.Tensor, ...]  # per draft layer: [head_dim]


def _gen(seed: int, stream: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed * 1_000_003 + stream)


def make_hidden_states(cfg: ProjectionConfig, device: torch.device | str = "cpu") -> dict[int, torch.Tensor]:
    """Seeded synthetic hidden states, one ``[tokens, hidden]`` per capture layer, in ``cfg.dtype``.

    Residual streams are not white noise: a few channels (about one per thousand) carry 10-100x the
    typical magnitude with a stable sign, the same channels in every layer, and the overall scale grows
    with depth. Generated on the CPU so the values do not depend on the device.
    """
    g = _gen(cfg.seed, 0)
    n_out = max(1, cfg.hidden // 1000)
    chans = torch.randperm(cfg.hidden, generator=g)[:n_out]
    mags = 10.0 ** (1.0 + torch.rand(n_out, generator=g))  # log-uniform in [10, 100]
    signs = torch.where(torch.rand(n_out, generator=g) < 0.5, -1.0, 1.0)
    out = {}
    for c in cfg.capture_layers:
        scale = 1.0 + 2.0 * c / cfg.layers
        h = torch.randn(cfg.tokens, cfg.hidden, generator=g)
        h[:, chans] = mags * (signs + 0.3 * h[:, chans])
        out[c] = (h * scale).to(cfg.torch_dtype).to(device)
    return out


def make_weights(cfg: ProjectionConfig, device: torch.device | str = "cpu") -> ProjectionWeights:
    """Seeded weights at realistic scale: N(0, 1/fan_in) matrices, norm weights near 1."""
    g = _gen(cfg.seed, 1)
    n_in = len(cfg.capture_layers) * cfg.hidden
    dt = cfg.torch_dtype

    def mat(rows: int, cols: int) -> torch.Tensor:
        return (torch.randn(rows, cols, generator=g) / math.sqrt(cols)).to(dt).to(device)

    def norm_w(n: int) -> torch.Tensor:
        return (1.0 + 0.1 * torch.randn(n, generator=g)).to(dt).to(device)

    fc = mat(cfg.hidden, n_in)
    hidden_norm = norm_w(cfg.hidden)
    kv_rows = 2 * cfg.kv_heads * cfg.head_dim
    kv = tuple(mat(kv_rows, cfg.hidden) for _ in range(cfg.draft_layers))
    k_norm = tuple(norm_w(cfg.head_dim) for _ in range(cfg.draft_layers))
    return ProjectionWeights(fc, hidden_norm, kv, k_norm)


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
                    f"{pj}: {name} layer={coords['layer']} is a {kind} shard; "
                    "the probe needs whole hidden states"
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
            raise ProjectionConfigError(
                f"{root}: {len(recs)} {name!r} tensors for layer {c}; pass step= to pick one"
            )
        part_dir, r = recs[0]
        with safe_open(str(part_dir / r["file"]), framework="pt") as f:
            t = f.get_tensor(r["key"])
        out[c] = t.reshape(-1, t.shape[-1])
    shapes = {tuple(t.shape) for t in out.values()}
    if len(shapes) != 1:
        raise ProjectionConfigError(f"{root}: capture layers have different shapes {sorted(shapes)}")
    return out


def kind_of(record: Mapping[str, Any]) -> str:
    return str((record.get("shard") or {}).get("kind", "full"))


# -- kernels ---------------------------------------------------------------------------------


@dataclass
class Kernels:
    """RMSNorm and neox RoPE. ``flashinfer`` is None for the torch implementations."""

    flashinfer: Any = None
    version: str | None = None
    note: str | None = None  # why flashinfer is not used, when it was asked for or auto-selected

    def describe(self) -> dict[str, str]:
        who = f"flashinfer {self.version}" if self.flashinfer is not None else "torch"
        return {"rmsnorm": who, "rope": who}

    def rmsnorm(self, x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
        if self.flashinfer is not None and x.dtype in (torch.bfloat16, torch.float16):
            shape = x.shape
            out: torch.Tensor = self.flashinfer.norm.rmsnorm(
                x.reshape(-1, shape[-1]).contiguous(), w, eps=eps
            )
            return out.reshape(shape)
        return torch_rmsnorm(x, w, eps)

    def rope(self, k: torch.Tensor, theta: float) -> torch.Tensor:
        """Neox RoPE on ``k`` ``[tokens, heads, head_dim]`` at positions 0..tokens-1, rotary dim = head_dim."""
        if self.flashinfer is not None and k.dtype in (torch.bfloat16, torch.float16):
            t, h, d = k.shape
            cos, sin = rope_cos_sin(t, d, theta, torch.float32, k.device)
            cache = torch.cat([cos, sin], dim=-1).contiguous()
            pos = torch.arange(t, device=k.device, dtype=torch.int64)
            key = k.reshape(t, h * d).clone()  # the kernel works in place: never on the caller's tensor
            query = key.clone()  # the kernel rotates a query too; this one is thrown away
            self.flashinfer.rope.apply_rope_with_cos_sin_cache_inplace(
                pos, query, key, d, cache, is_neox=True
            )
            return key.reshape(t, h, d)
        return torch_rope(k, theta)


def _compute_dtype(dt: torch.dtype) -> torch.dtype:
    return torch.float64 if dt == torch.float64 else torch.float32


def torch_rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """``x / rms(x) * w`` over the last dim, computed in float32 (float64 for float64 inputs), rounded once."""
    cd = _compute_dtype(x.dtype)
    xf = x.to(cd)
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.to(cd)
    return y.to(x.dtype)


def rope_cos_sin(
    tokens: int, dim: int, theta: float, dtype: torch.dtype, device: torch.device | str
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables ``[tokens, dim/2]``, built in ``dtype`` the way the serving engines build them."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=dtype, device=device) / dim))
    ang = torch.arange(tokens, dtype=dtype, device=device)[:, None] * inv_freq[None, :]
    return ang.cos(), ang.sin()


def torch_rope(k: torch.Tensor, theta: float) -> torch.Tensor:
    t, _, d = k.shape
    cd = _compute_dtype(k.dtype)
    cos, sin = rope_cos_sin(t, d, theta, cd, k.device)
    cos, sin = cos[:, None, :], sin[:, None, :]
    x1, x2 = k[..., : d // 2].to(cd), k[..., d // 2 :].to(cd)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(k.dtype)


def select_kernels(mode: str, device: torch.device) -> Kernels:
    """``auto``: flashinfer on CUDA when importable (and a small smoke call works), else torch.
    ``torch``: always torch. ``flashinfer``: flashinfer or an error."""
    if mode not in ("auto", "torch", "flashinfer"):
        raise ProjectionConfigError(f"kernels must be auto, torch or flashinfer, got {mode!r}")
    if mode == "torch":
        return Kernels()
    if device.type != "cuda":
        if mode == "flashinfer":
            raise ProjectionConfigError("flashinfer kernels need a CUDA device")
        return Kernels(note="not CUDA")
    try:
        import flashinfer
        import flashinfer.norm
        import flashinfer.rope

        k = Kernels(flashinfer, str(getattr(flashinfer, "__version__", "?")))
        x = torch.randn(64, 2, 128, device=device, dtype=torch.bfloat16)
        w = 1 + 0.1 * torch.randn(128, device=device, dtype=torch.bfloat16)
        x0 = x.clone()
        torch.testing.assert_close(k.rmsnorm(x, w, 1e-6), torch_rmsnorm(x, w, 1e-6), atol=0.02, rtol=0.02)
        torch.testing.assert_close(k.rope(x, 1e4), torch_rope(x, 1e4), atol=0.05, rtol=0.02)
        assert torch.equal(x, x0), "a kernel changed its input"
        return k
    except Exception as exc:  # an import failure, a JIT build failure or a wrong answer
        if mode == "flashinfer":
            raise ProjectionConfigError(
                f"flashinfer kernels unavailable: {type(exc).__name__}: {exc}"
            ) from exc
        return Kernels(note=f"flashinfer unavailable: {type(exc).__name__}: {str(exc)[:300]}")


# -- the computation ---------------------------------------------------------------------------


@dataclass
class StageOutput:
    stage: int
    partial: torch.Tensor | None  # this stage's contribution, None when it owns no capture layer
    running: torch.Tensor  # the running sum handed to the next stage (after this stage's add)


@dataclass
class PathResult:
    name: str
    compute_dtype: str  # dtype of the GEMM inputs and of the stored outputs
    accum_dtype: str | None  # dtype of the PP running sum (partial paths; ref keeps a float64 one)
    pre_norm: torch.Tensor  # [tokens, hidden]
    normed: torch.Tensor  # [tokens, hidden]
    k: list[torch.Tensor]  # per draft layer, [tokens, kv_heads, head_dim]
    v: list[torch.Tensor]
    stages: list[StageOutput] = field(default_factory=list)
    kernels: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0


def _stage_partials(
    hidden: Sequence[torch.Tensor],
    fc: torch.Tensor,
    layout: ProjectionLayout,
    compute: torch.dtype,
    accum: torch.dtype,
) -> list[StageOutput]:
    """Per-stage ``x_local @ W[:, cols].T`` added into a running sum in ``accum``, in stage order.

    When ``accum`` is wider than ``compute`` the stage GEMM keeps its output in ``accum`` (inputs upcast:
    the products of bf16 numbers are exact in float32, so this is a bf16 GEMM with a float32 output);
    otherwise the GEMM output is rounded to ``compute`` and then to ``accum``.
    """
    n_hidden = fc.shape[0]
    tokens = hidden[0].shape[0]
    gemm = accum if torch.finfo(accum).bits > torch.finfo(compute).bits else compute
    running = torch.zeros(tokens, n_hidden, dtype=accum, device=fc.device)
    out = []
    for st in layout.stages:
        if not st.features:
            out.append(StageOutput(st.stage, None, running))  # passed on untouched
            continue
        x_local = torch.cat([hidden[f].to(gemm) for f in st.features], dim=1)
        lo, hi = st.features[0] * n_hidden, (st.features[-1] + 1) * n_hidden
        w_local = fc[:, lo:hi].to(gemm).contiguous()
        part = (x_local @ w_local.T).to(compute).to(accum) if gemm == compute else x_local @ w_local.T
        del x_local, w_local
        running = running + part
        out.append(StageOutput(st.stage, part, running))
    return out


def compute_path(
    name: str,
    hidden: Sequence[torch.Tensor],
    weights: ProjectionWeights,
    cfg: ProjectionConfig,
    layout: ProjectionLayout,
    kernels: Kernels,
) -> PathResult:
    """One path end to end. ``hidden`` is in feature order, in ``cfg.dtype``, on the compute device."""
    accum_name = _check_path(name)
    model_dt = cfg.torch_dtype
    dt = torch.float64 if name == "ref" else model_dt
    kern = Kernels() if name == "ref" else kernels
    sync = hidden[0].device.type == "cuda"
    if sync:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    stages: list[StageOutput] = []
    if name in ("concat", "ref"):
        x = torch.cat([h.to(dt) for h in hidden], dim=1)
        pre = x @ weights.fc.to(dt).T
        del x
        if name == "ref":  # float64 stage view, for the stage-by-stage comparison
            stages = _stage_partials(hidden, weights.fc, layout, dt, torch.float64)
    else:
        assert accum_name is not None
        stages = _stage_partials(hidden, weights.fc, layout, dt, DTYPES[accum_name])
        pre = stages[-1].running.to(dt)  # the last stage hands the full sum to hidden_norm, once
    normed = kern.rmsnorm(pre, weights.hidden_norm.to(dt), cfg.eps)
    ks, vs = [], []
    kv_size = cfg.kv_heads * cfg.head_dim
    for w_kv, w_kn in zip(weights.kv, weights.k_norm):  # one draft layer at a time
        kv = normed @ w_kv.to(dt).T
        k = kv[:, :kv_size].reshape(cfg.tokens, cfg.kv_heads, cfg.head_dim)
        v = kv[:, kv_size:].reshape(cfg.tokens, cfg.kv_heads, cfg.head_dim).contiguous()
        k = kern.rope(kern.rmsnorm(k.contiguous(), w_kn.to(dt), cfg.eps), cfg.rope_theta)
        ks.append(k)
        vs.append(v)
        del kv
    if sync:
        torch.cuda.synchronize()
    return PathResult(
        name=name,
        compute_dtype=short_dtype(dt),
        accum_dtype=accum_name if name != "ref" else "fp64",
        pre_norm=pre,
        normed=normed,
        k=ks,
        v=vs,
        stages=stages,
        kernels=kern.describe(),
        seconds=time.perf_counter() - t0,
    )


def handoff_bytes(cfg: ProjectionConfig, layout: ProjectionLayout) -> dict[str, Any]:
    """Size of the PP running-sum hand-off (``tokens x hidden`` in the accumulation dtype) per stage boundary."""
    out: dict[str, Any] = {
        "tokens": cfg.tokens,
        "hidden": cfg.hidden,
        "boundaries": cfg.pp - 1,
        # boundaries that must carry a non-zero sum (from the first stage owning a capture layer on)
        "boundaries_carrying_sum": cfg.pp - 1 - layout.first_contributing_stage,
        "raw_features_instead_bytes_per_token": len(cfg.capture_layers)
        * cfg.hidden
        * cfg.torch_dtype.itemsize,
    }
    for acc in ("bf16", "fp32"):
        per_token = cfg.hidden * DTYPES[acc].itemsize
        out[acc] = {
            "bytes_per_token_per_stage": per_token,
            "bytes_per_handoff": per_token * cfg.tokens,
            "bytes_per_chunk_all_boundaries": per_token * cfg.tokens * out["boundaries_carrying_sum"],
        }
    return out


# -- the probe run -----------------------------------------------------------------------------


@dataclass
class ProbeRun:
    config: ProjectionConfig
    layout: ProjectionLayout
    kernels: Kernels
    paths: dict[str, PathResult]
    handoff: dict[str, Any]
    environment: dict[str, Any]
    bundles: dict[str, str]
    input_source: str


def environment(device: torch.device, kernels: Kernels) -> dict[str, Any]:
    env: dict[str, Any] = {"torch": torch.__version__, "device": str(device)}
    if device.type == "cuda":
        env.update(
            gpu=torch.cuda.get_device_name(device),
            cuda=torch.version.cuda,
            allow_tf32=torch.backends.cuda.matmul.allow_tf32,
            allow_bf16_reduced_precision_reduction=torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction,
        )
    env["flashinfer"] = kernels.version
    if kernels.note:
        env["kernels_note"] = kernels.note
    return env


def _write_bundle(out_dir: Path, prefix: str, res: PathResult, run: ProbeRun, write_stages: bool) -> str:
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
        "accum": str(res.accum_dtype),
    }
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


def run_probe(
    cfg: ProjectionConfig,
    out_dir: str | Path | None = None,
    *,
    device: str | torch.device = "auto",
    paths: Sequence[str] | None = None,
    kernels: str = "auto",
    hidden: Mapping[int, torch.Tensor] | None = None,
    input_source: str | None = None,
    prefix: str = "projection",
    write_stages: bool = True,
) -> ProbeRun:
    """Check the layout, build (or take) the inputs, compute every path, and write one bundle per path
    under ``out_dir/<path>/`` when ``out_dir`` is given. ``hidden`` overrides the synthetic inputs
    (``{layer: [tokens, hidden]}``; tokens and hidden size are taken from it)."""
    if hidden is not None:
        first = next(iter(hidden.values()))
        cfg = dataclasses.replace(cfg, tokens=int(first.shape[0]), hidden=int(first.shape[-1]))
    layout = plan_layout(cfg)  # every structural check before any arithmetic
    names = tuple(paths) if paths else default_paths(cfg)
    for n in names:
        _check_path(n)
    if len(set(names)) != len(names):
        raise ProjectionConfigError(f"paths listed twice: {names}")
    dev = (
        torch.device("cuda" if torch.cuda.is_available() else "cpu")
        if device == "auto"
        else torch.device(device)
    )
    kern = select_kernels(kernels, dev)
    if hidden is None:
        hs = make_hidden_states(cfg, dev)
        source = f"synthetic(seed={cfg.seed})"
    else:
        missing = [c for c in cfg.capture_layers if c not in hidden]
        if missing:
            raise ProjectionConfigError(f"hidden states missing capture layer(s) {missing}")
        hs = {c: hidden[c].to(device=dev, dtype=cfg.torch_dtype) for c in cfg.capture_layers}
        source = input_source or "given"
    feats = [hs[c] for c in cfg.capture_layers]
    weights = make_weights(cfg, dev)
    run = ProbeRun(cfg, layout, kern, {}, handoff_bytes(cfg, layout), environment(dev, kern), {}, source)
    with torch.no_grad():
        for n in names:
            res = compute_path(n, feats, weights, cfg, layout, kern)
            run.paths[n] = res
            if out_dir is not None:
                run.bundles[n] = _write_bundle(Path(out_dir), prefix, res, run, write_stages)
    return run
