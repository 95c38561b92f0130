"""The float64 reference: the definition every backend is held to (``docs/metrics.md``).

Both tensors are read as matching flat pieces (:func:`chunk_pairs`, at most ``chunk_elems`` elements), each copied
to host memory and measured by ``small.py``'s NumPy pass, where every element is read in float64 and NaN/Inf are
left out of the sums and counted (the one place this definition is written, ``small.rows_of``); the rows of
partials of all pieces are then added in order. Integer and boolean tensors are read as their float64 values.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import torch

from validator.numerics.backends.common import Totals
from validator.numerics.backends.small import add_up, empty_totals, pair_totals, plan, read, rows_of

CPU_CHUNK = 1 << 19  # elements a piece at most: its float64 copies (some ten arrays) stay near 40 MB


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


def reference_totals(
    a: torch.Tensor, b: torch.Tensor, atol: float, rtol: float, chunk_elems: int, edges: Sequence[int] = ()
) -> Totals:
    """The totals of ``a`` against ``b`` by the float64 reference (``edges``: see ``common.Totals``)."""
    edges = tuple(edges) or (0, a.numel())
    parts, ulp, start = [], False, 0  # each piece's rows of partials (float64, int64) and their edge blocks
    with torch.no_grad():
        for ca, cb in chunk_pairs(a.detach(), b.detach(), max(1, min(chunk_elems, CPU_CHUNK))):
            x, y, dist = read(ca.cpu(), cb.cpu())
            starts, owner = plan(edges, start, ca.numel())
            parts.append((*rows_of(x, y, dist, atol, rtol, starts), owner))
            ulp, start = dist is not None, start + ca.numel()
    if not parts:
        return empty_totals(a, b, edges)
    rows_f, rows_i, owner = (np.concatenate(column) for column in zip(*parts))
    added = add_up(rows_f, rows_i, np.array([0, len(owner)]), owner, len(edges) - 1)
    return pair_totals([a.numel()], [ulp], *added, np.array([0, len(edges) - 1]))[0]
