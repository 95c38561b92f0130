"""The float64 reference: the definition every backend is held to (``docs/metrics.md``).

Both tensors are read as matching flat pieces of at most ``chunk_elems`` elements; each piece is
converted to float64 and masked to the positions finite in both, and every sum and count is
accumulated in float64 / int64 on the compute device. Plain torch, one formula per line.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

from validator.numerics.backends.common import Totals, blocks_meeting, ulp_distance, ulp_spec

CPU_CHUNK = 1 << 19  # larger pieces fault in fresh pages on every piece and run 4-5 times slower


def compute_device(a: torch.Tensor, b: torch.Tensor) -> torch.device:
    """The accelerator holding a (else b); CPU when neither is on one. MPS lacks float64."""
    for t in (a, b):
        if t.device.type not in ("cpu", "mps"):
            return t.device
    return torch.device("cpu")


def chunk_pairs(a: torch.Tensor, b: torch.Tensor, chunk: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Matching 1-D pieces of a and b in row-major order, none longer than ``chunk``.

    Contiguous inputs are sliced as views. Otherwise whole leading-dimension blocks of at most
    ``chunk`` elements are reshaped (a copy of at most ``chunk`` elements), recursing into rows
    that are themselves longer than ``chunk``.
    """
    if a.numel() == 0:
        return
    if a.dim() <= 1 or (a.is_contiguous() and b.is_contiguous()):
        fa, fb = a.reshape(-1), b.reshape(-1)
        for start in range(0, fa.numel(), chunk):
            yield fa[start : start + chunk], fb[start : start + chunk]
        return
    row = a.numel() // a.shape[0]
    if row > chunk:
        for i in range(a.shape[0]):
            yield from chunk_pairs(a[i], b[i], chunk)
        return
    step = chunk // row
    for start in range(0, a.shape[0], step):
        yield a[start : start + step].reshape(-1), b[start : start + step].reshape(-1)


class Accumulator:
    """Running float64 sums, int64 counts and the largest ULP distance of one pair, on one device."""

    def __init__(
        self, device: torch.device, atol: float, rtol: float, spec: tuple[torch.dtype, int] | None, blocks: int = 1
    ) -> None:
        self.atol, self.rtol, self.spec, self.device = float(atol), float(rtol), spec, device
        self.blocks = torch.zeros(2, blocks, dtype=torch.float64, device=device)  # d², a² per block
        self.sums = torch.zeros(5, dtype=torch.float64, device=device)  # a², b², d², |d|, a·d
        self.max_abs = torch.zeros((), dtype=torch.float64, device=device)
        self.counts = torch.zeros(5, dtype=torch.int64, device=device)  # both, passed, nf a, nf b, mismatch
        self.nonfinite = torch.zeros(3, dtype=torch.int64, device=device)  # NaN a, NaN b, the same infinity
        self.max_ulp = torch.zeros((), dtype=torch.int64, device=device)

    def add(self, ca: torch.Tensor, cb: torch.Tensor, block: int = 0) -> None:
        ca, cb = ca.to(self.device), cb.to(self.device)
        xa, xb = ca.to(torch.float64), cb.to(torch.float64)
        fin_a, fin_b = torch.isfinite(xa), torch.isfinite(xb)
        both = fin_a & fin_b
        # non-finite in both and of the same kind: NaN/NaN, +Inf/+Inf or -Inf/-Inf
        same_kind = ~(fin_a | fin_b) & ((xa == xb) | (torch.isnan(xa) & torch.isnan(xb)))
        za, zb = torch.where(both, xa, 0.0), torch.where(both, xb, 0.0)
        d = zb - za
        absd = d.abs()
        close = both & (absd <= self.atol + self.rtol * za.abs())
        sums = torch.stack([(za * za).sum(), (zb * zb).sum(), (d * d).sum(), absd.sum(), (za * d).sum()])
        self.sums += sums
        self.blocks[:, block] += sums[[2, 0]]
        self.max_abs = torch.maximum(self.max_abs, absd.max())
        self.counts += torch.stack(
            [both.sum(), close.sum() + same_kind.sum(), (~fin_a).sum(), (~fin_b).sum(), (~both & ~same_kind).sum()]
        )
        self.nonfinite += torch.stack([xa.isnan().sum(), xb.isnan().sum(), (xa.isinf() & (xa == xb)).sum()])
        if self.spec is not None:
            dist = ulp_distance(ca, cb, self.spec).masked_fill(~both, 0)
            self.max_ulp = torch.maximum(self.max_ulp, dist.max())

    def totals(self, numel: int) -> Totals:
        """The totals (one read back)."""
        max_ulp = None if self.spec is None else int(self.max_ulp)
        block_d2, block_a2 = self.blocks.tolist()
        return Totals(numel, tuple(self.sums.tolist()), float(self.max_abs), tuple(self.counts.tolist()), max_ulp,
                      tuple(block_d2), tuple(block_a2), tuple(self.nonfinite.tolist()))  # fmt: skip


def reference_totals(
    a: torch.Tensor, b: torch.Tensor, atol: float, rtol: float, chunk_elems: int, edges: Sequence[int] = ()
) -> Totals:
    """The totals of ``a`` against ``b`` by the float64 reference, on :func:`compute_device`
    (``edges``: see ``common.Totals``)."""
    device = compute_device(a, b)
    edges = edges or (0, a.numel())
    piece = min(chunk_elems, CPU_CHUNK) if device.type == "cpu" else chunk_elems
    piece = max(1, min(piece, a.numel()))
    acc = Accumulator(device, atol, rtol, ulp_spec(a.dtype, b.dtype), len(edges) - 1)
    with torch.no_grad():
        a, b = a.detach(), b.detach()
        offset = 0
        for ca, cb in chunk_pairs(a, b, piece):
            for block, lo, hi in blocks_meeting(edges, offset, offset + ca.numel()):
                acc.add(ca[lo:hi], cb[lo:hi], block)
            offset += ca.numel()
        return acc.totals(a.numel())
