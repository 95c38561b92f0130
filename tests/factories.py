"""Test data: bundles written with the real probes writer, at small shapes."""

from __future__ import annotations

from pathlib import Path

import torch

from probes import BundleWriter, ShardSpec


def tensors(seed: int = 0, tokens: int = 8, hidden: int = 16, heads: int = 8, head_dim: int = 4) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "ctx": torch.randn(tokens, hidden, generator=g),
        "k": torch.randn(tokens, heads, head_dim, generator=g),
    }


def write_tp_bundle(
    root: Path,
    name: str,
    full: dict[str, torch.Tensor],
    *,
    tp: int,
    kv_heads: int = 8,
    dtype: torch.dtype = torch.bfloat16,
    noise: float = 0.0,
    seed: int = 1,
) -> Path:
    """One part per TP rank. ``ctx`` is replicated; ``k`` is split by heads (replicated when tp > heads).
    ``noise`` is drawn once per tensor, so the copies of a replicated tensor are equal, as a real run's are."""
    path = root / name
    g = torch.Generator().manual_seed(seed)
    full = {key: t + noise * torch.randn(t.shape, generator=g) for key, t in full.items()}
    per = max(1, kv_heads // tp)
    reps = max(1, tp // kv_heads)
    for r in range(tp):
        with BundleWriter(path, run_name=name, part=f"tp{r}", labels={"tp": str(tp)}) as w:
            w.add("ctx", full["ctx"].to(dtype), step=0, tp_rank=r, tp_size=tp, shard=ShardSpec.replicated(r, tp))
            idx = r // reps
            k = full["k"][:, idx * per : (idx + 1) * per]
            w.add(
                "k",
                k.to(dtype),
                step=0,
                layer=0,
                tp_rank=r,
                tp_size=tp,
                shard=ShardSpec.split(1, idx, kv_heads // per, replica=r % reps, replicas=reps),
            )
    return path


def write_stack_bundle(
    root: Path,
    name: str,
    *,
    layers: int = 93,
    tokens: int = 16,
    hidden: int = 32,
    fault_layer: int | None = None,
    fault: float = 1e-3,
    seed: int = 0,
) -> Path:
    """A residual stack ``h <- h + tanh(h @ W_l)`` run forward on one request, its every layer's output
    captured in the forward order (``hidden``, ``step=0``, ``layer=l``). With ``fault_layer``, that layer's
    output gets a relative error of ``fault`` added before the next layer reads it: every later layer
    inherits it, and the stack's gain makes the later errors larger than the injected one."""
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(tokens, hidden, generator=g, dtype=torch.float64)
    weights = [torch.randn(hidden, hidden, generator=g, dtype=torch.float64) * (1.5 / hidden**0.5) for _ in range(layers)]
    noise = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(seed + 1), dtype=torch.float64)
    path = root / name
    with BundleWriter(path, run_name=name, part="tp0") as w:
        for i, wl in enumerate(weights):
            h = h + torch.tanh(h @ wl)
            if i == fault_layer:
                h = h + fault * noise * (h.norm() / noise.norm())
            w.add("hidden", h.to(torch.float32), step=0, request="r0", layer=i)
    return path
