"""Where inside one tensor two runs differ: the numbers behind the dashboard's pair drill-down.

Pure math: two tensors in, a frozen :class:`ErrorProfile` out. Every value is converted to float64
before any arithmetic, the tensors are walked in row chunks (memory stays bounded whatever their
size), and every output is bounded too: at most ``max_points`` points per profile (neighbouring rows
are merged into buckets beyond that), a fixed set of histogram bins, and ``top_k`` worst elements.

Axis convention (probes capture activations token-major): dim 0 is the token position when the
tensor has two or more dims; dim 1 is the head when it has three or more (``[tokens, heads, head_dim]``).
Elements where either side is NaN or Inf are left out of the norms, the histogram and the worst list,
and counted in ``nonfinite``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = ["ErrorProfile", "AxisProfile", "WorstElement", "error_profile", "HIST_EDGES"]

CHUNK_ELEMS = 1 << 19  # larger pieces run several times slower on the CPU (see validator.numerics.metrics)
BINS_PER_DECADE = 4
HIST_LOW, HIST_HIGH = -16, 4  # decades of |b - a| covered by the histogram; outside values go to the ends
HIST_EDGES: tuple[float, ...] = tuple(
    10.0 ** (HIST_LOW + i / BINS_PER_DECADE) for i in range((HIST_HIGH - HIST_LOW) * BINS_PER_DECADE + 1)
)


@dataclass(frozen=True)
class AxisProfile:
    """Relative L2 of the difference along one axis: point ``i`` covers indices ``start[i]`` ..
    ``start[i] + bucket - 1`` (``bucket`` is 1 unless the axis is longer than ``max_points``)."""

    axis: int
    length: int
    bucket: int
    start: tuple[int, ...]
    rel_l2: tuple[float, ...]  # ||d|| / ||a|| over the bucket (inf where a is all zero but d is not)
    abs_l2: tuple[float, ...]  # ||d|| over the bucket


@dataclass(frozen=True)
class WorstElement:
    index: tuple[int, ...]
    a: float
    b: float
    abs_err: float
    rel_err: float | None  # |b - a| / |a|; None where a == 0


@dataclass(frozen=True)
class ErrorProfile:
    shape: tuple[int, ...]
    numel: int
    compared: int  # elements finite in both
    nonfinite: int
    equal: int  # compared elements with b == a exactly
    rel_l2: float
    max_abs: float
    rms_a: float
    tokens: AxisProfile | None
    heads: AxisProfile | None
    hist_edges: tuple[float, ...]  # len(hist_counts) + 1 edges of |b - a| (zeros counted in ``equal``)
    hist_counts: tuple[int, ...]
    worst: tuple[WorstElement, ...]

    def __bool__(self) -> bool:
        return self.equal == self.compared and self.nonfinite == 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _ratio(num2: float, den2: float) -> float:
    if den2 > 0:
        return math.sqrt(num2) / math.sqrt(den2)
    return 0.0 if num2 == 0 else math.inf


def _axis(d2: torch.Tensor, a2: torch.Tensor, axis: int, max_points: int) -> AxisProfile:
    import torch  # here, not at the top: the dashboard's other pages never load torch

    n = int(d2.numel())
    bucket = max(1, -(-n // max_points))
    pad = (-n) % bucket
    if pad:
        d2 = torch.cat([d2, d2.new_zeros(pad)])
        a2 = torch.cat([a2, a2.new_zeros(pad)])
    bd, ba = d2.view(-1, bucket).sum(1).tolist(), a2.view(-1, bucket).sum(1).tolist()
    return AxisProfile(
        axis=axis,
        length=n,
        bucket=bucket,
        start=tuple(range(0, n, bucket)),
        rel_l2=tuple(_ratio(x, y) for x, y in zip(bd, ba)),
        abs_l2=tuple(math.sqrt(x) for x in bd),
    )


def error_profile(
    a: torch.Tensor, b: torch.Tensor, *, top_k: int = 20, max_points: int = 2048, chunk_elems: int = CHUNK_ELEMS
) -> ErrorProfile:
    """Profile ``b - a`` (``a`` is the reference). Shapes must match; dtypes may differ."""
    import torch

    if tuple(a.shape) != tuple(b.shape):
        raise ValueError(f"shape mismatch: {list(a.shape)} vs {list(b.shape)}")
    if top_k < 0 or max_points < 1 or chunk_elems < 1:
        raise ValueError("top_k must be >= 0, max_points and chunk_elems >= 1")
    shape = tuple(int(s) for s in a.shape)
    a, b = a.detach().to("cpu"), b.detach().to("cpu")
    numel = a.numel()
    rows = shape[0] if len(shape) >= 2 else max(numel, 1)  # 0/1-d: one element per "row", for chunking only
    heads = shape[1] if len(shape) >= 3 else 1
    rest = numel // max(rows * heads, 1) if numel else 0
    a3, b3 = a.reshape(rows, heads, rest), b.reshape(rows, heads, rest)

    row_d2 = torch.zeros(rows, dtype=torch.float64)
    row_a2 = torch.zeros(rows, dtype=torch.float64)
    head_d2 = torch.zeros(heads, dtype=torch.float64)
    head_a2 = torch.zeros(heads, dtype=torch.float64)
    edges = torch.tensor(HIST_EDGES, dtype=torch.float64)
    hist = torch.zeros(len(HIST_EDGES) - 1, dtype=torch.int64)
    compared = equal = 0
    max_abs = 0.0
    top_vals = torch.empty(0, dtype=torch.float64)
    top_idx = torch.empty(0, dtype=torch.int64)
    step = max(1, chunk_elems // max(heads * rest, 1))
    for r0 in range(0, rows, step):
        xa = a3[r0 : r0 + step].to(torch.float64)
        xb = b3[r0 : r0 + step].to(torch.float64)
        ok = torch.isfinite(xa) & torch.isfinite(xb)
        d = torch.where(ok, xb - xa, 0.0)
        xa = torch.where(ok, xa, 0.0)
        d2, a2 = d * d, xa * xa
        row_d2[r0 : r0 + len(d)] = d2.sum((1, 2))
        row_a2[r0 : r0 + len(d)] = a2.sum((1, 2))
        head_d2 += d2.sum((0, 2))
        head_a2 += a2.sum((0, 2))
        err = d.abs().flatten()
        okf = ok.flatten()
        n_ok = int(okf.sum())
        compared += n_ok
        nz = err[okf & (err > 0)]
        equal += n_ok - int(nz.numel())
        if nz.numel():
            max_abs = max(max_abs, float(nz.max()))
            bins = torch.bucketize(nz, edges, right=True).sub_(1).clamp_(0, len(hist) - 1)
            hist += torch.bincount(bins, minlength=len(hist))
        if top_k:
            cand = torch.where(okf, err, -1.0)
            k = min(top_k, int(cand.numel()))
            v, i = torch.topk(cand, k)
            top_vals = torch.cat([top_vals, v])
            top_idx = torch.cat([top_idx, i + r0 * heads * rest])
            if top_vals.numel() > top_k:
                top_vals, keep = torch.topk(top_vals, top_k)
                top_idx = top_idx[keep]
    worst = []
    flat_a, flat_b = a.reshape(-1), b.reshape(-1)
    order = torch.argsort(top_vals, descending=True, stable=True)
    for v, i in zip(top_vals[order].tolist(), top_idx[order].tolist()):
        if v <= 0:  # equal elements (or non-finite positions, marked -1) are not errors
            continue
        va, vb = float(flat_a[i].double()), float(flat_b[i].double())
        idx = tuple(int(x) for x in torch.unravel_index(torch.tensor(i), shape)) if shape else ()
        worst.append(WorstElement(index=idx, a=va, b=vb, abs_err=v, rel_err=v / abs(va) if va != 0 else None))
    d2_total, a2_total = float(row_d2.sum()), float(row_a2.sum())
    return ErrorProfile(
        shape=shape,
        numel=numel,
        compared=compared,
        nonfinite=numel - compared,
        equal=equal,
        rel_l2=_ratio(d2_total, a2_total),
        max_abs=max_abs,
        rms_a=math.sqrt(a2_total / compared) if compared else 0.0,
        tokens=_axis(row_d2, row_a2, 0, max_points) if len(shape) >= 2 else None,
        heads=_axis(head_d2, head_a2, 1, max_points) if len(shape) >= 3 else None,
        hist_edges=HIST_EDGES,
        hist_counts=tuple(int(x) for x in hist),
        worst=tuple(worst),
    )
