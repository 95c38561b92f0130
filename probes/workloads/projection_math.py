"""The arithmetic of the projection probe: seeded inputs, RMSNorm and neox RoPE (torch, or flashinfer on
CUDA), and the three paths (``concat``, ``partial-<acc>``, ``ref``) from hidden states to draft K and V."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .projection_config import (
    DTYPES,
    ProjectionConfig,
    ProjectionConfigError,
    ProjectionLayout,
    check_path,
    short_dtype,
)

# -- inputs ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProjectionWeights:
    fc: torch.Tensor  # [hidden, n_capture * hidden], bias-free
    hidden_norm: torch.Tensor  # [hidden]
    kv: tuple[torch.Tensor, ...]  # per draft layer: K rows then V rows of the fused QKV weight, [2*kv*hd, hidden]
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
            out: torch.Tensor = self.flashinfer.norm.rmsnorm(x.reshape(-1, shape[-1]).contiguous(), w, eps=eps)
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
            self.flashinfer.rope.apply_rope_with_cos_sin_cache_inplace(pos, query, key, d, cache, is_neox=True)
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
            raise ProjectionConfigError(f"flashinfer kernels unavailable: {type(exc).__name__}: {exc}") from exc
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
    accum_name = check_path(name)
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
