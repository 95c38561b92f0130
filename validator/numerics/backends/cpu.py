"""CPU backend: the pass as torch operations on float32 pieces.

Pairs of 8-, 16- and 32-bit floats are read in pieces of :data:`PIECE` elements, converted to float32
and combined with a few vectorised torch operations per piece; the piece totals are added in float64.
Exactness where the reference's float64 matters:

- sums: float32 within rows of :data:`ROW` elements, float64 across rows;
- ``max_abs``: float32 rounding is monotonic, so the piece holding the largest float32 ``|d|`` also
  holds the largest exact one; its candidates are recomputed in float64;
- the tolerance test: counted twice in float32, against tolerances moved 2**-18 down and up; if the
  two counts differ the piece is counted again in float64;
- a piece with a non-finite value, or squares outside float32's comfortable range, goes through the
  float64 reference (:class:`~validator.numerics.backends.reference.Accumulator`) instead.

Other pairs (float64 or integer inputs) take the reference itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch

from validator.numerics.backends.common import (
    EPS,
    SAFE_HI,
    SAFE_LO,
    TINY,
    ULP_DTYPES,
    Totals,
    ulp_distance,
    ulp_key,
    ulp_spec,
)
from validator.numerics.backends.reference import CPU_PIECE, Accumulator, chunk_pairs, compare_reference

# Elements per piece: whole rows just below torch's grain size (32768), so every operation runs on the
# calling thread. torch's threads gained about 15% on two idle cores and stalled every operation while
# another process held a core; pairs run side by side instead (validator.compare).
PIECE = 31 << 10
ROW = 1024  # sums are taken per row of a piece


def threads() -> int:
    """How many pairs are worth comparing at once: torch's thread count (one pair runs on one thread)."""
    return torch.get_num_threads()


def compare_cpu(a: torch.Tensor, b: torch.Tensor, *, atol: float, rtol: float) -> Totals:
    if a.dtype not in ULP_DTYPES or b.dtype not in ULP_DTYPES or not 0 <= rtol <= 2.0**20 or atol > SAFE_HI:
        return compare_reference(a, b, atol, rtol, CPU_PIECE)
    run = _Pass(atol, rtol, ulp_spec(a, b), min(PIECE, max(1, a.numel())))
    for ca, cb in chunk_pairs(a, b, PIECE):
        run.add(ca, cb)
    return run.totals(a.numel(), lambda: chunk_pairs(a, b, CPU_PIECE))


class _Pass:
    def __init__(self, atol: float, rtol: float, spec: tuple[torch.dtype, int] | None, piece: int) -> None:
        self.atol, self.rtol, self.spec = atol, rtol, spec
        self.ref = Accumulator(torch.device("cpu"), atol, rtol, spec)  # pieces that need float64
        piece = -(-piece // ROW) * ROW
        self.x = torch.empty(3, piece)  # rows a, b, d
        self.t, self.u = torch.empty(piece), torch.empty(piece)
        self.rows = torch.empty(5, piece // ROW)  # float32 sums per row of a², b², d², a·d, |d|
        self.mask = torch.empty(piece, dtype=torch.bool)
        self.sums = [0.0] * 5
        self.n_both = self.n_pass = self.max_ulp = 0
        self.max32, self.max_abs = -1.0, 0.0
        self.keys = torch.zeros_like(self.ref.keys)
        self.low = [0, 0, 0]  # counts of distances 0, 1, 2 from pieces whose distances are all <= 2
        # tolerances moved down (lo) and up (hi): a float32 count against each brackets the exact one
        self.lo = (atol * (1 - EPS) - TINY, rtol * (1 - EPS))
        self.hi = (atol * (1 + EPS) + TINY, rtol * (1 + EPS))

    def add(self, ca: torch.Tensor, cb: torch.Tensor) -> None:
        n = ca.numel()
        m = -(-n // ROW) * ROW  # whole rows; the padding is zero and adds nothing to the sums
        x = self.x[:, :m]  # rows a, b, d = b - a
        xa, xb, d = x[0], x[1], x[2]
        xa[:n].copy_(ca)
        xb[:n].copy_(cb)
        x[:2, n:].zero_()
        torch.sub(xb, xa, out=d)
        rows, u = self.rows[:, : m // ROW], self.u[:m]
        for j, (p, q) in enumerate(((xa, xa), (xb, xb), (d, d), (xa, d))):
            torch.sum(torch.mul(p, q, out=u).view(-1, ROW), 1, out=rows[j])
        d.abs_()
        torch.sum(d.view(-1, ROW), 1, out=rows[4])
        sums, top = rows.double().sum(1), d.amax().double()
        s_a2, s_b2, s_d2, s_ad, s_abs, top = torch.cat([sums, top.view(1)]).tolist()
        fine = all(SAFE_LO <= s <= SAFE_HI for s in (s_a2, s_b2)) and (SAFE_LO <= s_d2 <= SAFE_HI or top == 0)
        if not fine:  # non-finite values (their squares are not finite) or squares near float32's limits
            self.ref.add(ca, cb)
            return
        for i, s in enumerate((s_a2, s_b2, s_d2, s_abs, s_ad)):
            self.sums[i] += s
        self.n_both += n
        self.n_pass += self._passed(ca, cb, xa[:n], d[:n])
        if top >= self.max32:  # the exact largest |d| is among this piece's largest float32 |d|
            at = torch.eq(d[:n], top, out=self.mask[:n])
            exact = float((cb.masked_select(at).double() - ca.masked_select(at).double()).abs().max())
            self.max32, self.max_abs = top, max(self.max_abs, exact)
        if self.spec is not None:
            dist = ulp_distance(ca, cb, self.spec)
            top_ulp = int(dist.max())
            self.max_ulp = max(self.max_ulp, top_ulp)
            if top_ulp <= 2:  # distances 0, 1, 2 only: their counts follow from two moments
                m1, m2 = int(dist.sum()), int((dist * dist).sum())
                self.low[2] += (m2 - m1) // 2
                self.low[1] += m1 - (m2 - m1)
                self.low[0] += n - (m1 - (m2 - m1)) - (m2 - m1) // 2
            else:
                self.keys += torch.bincount(ulp_key(dist), minlength=self.keys.numel())

    def _passed(self, ca: torch.Tensor, cb: torch.Tensor, xa: torch.Tensor, absd: torch.Tensor) -> int:
        """How many of the piece pass ``|d| <= atol + rtol |a|``, exactly as in float64."""
        n = xa.numel()
        t, u, mask = self.t[:n], self.u[:n], self.mask[:n]
        torch.abs(xa, out=t)
        counts = []
        for atol, rtol in (self.lo, self.hi):
            torch.mul(t, rtol, out=u).add_(atol)
            counts.append(int(torch.count_nonzero(torch.le(absd, u, out=mask))))
        if counts[0] == counts[1]:
            return counts[0]
        a64 = ca.double()
        return int(torch.count_nonzero((cb.double() - a64).abs() <= self.atol + self.rtol * a64.abs()))

    def totals(self, numel: int, pieces: Callable[[], Iterator[tuple[torch.Tensor, torch.Tensor]]]) -> Totals:
        ref = self.ref
        ref.sums += torch.tensor(self.sums, dtype=torch.float64)
        ref.counts[0] += self.n_both
        ref.counts[1] += self.n_pass
        ref.max_abs = torch.clamp(ref.max_abs, min=self.max_abs)
        ref.max_ulp = torch.clamp(ref.max_ulp, min=self.max_ulp)
        ref.keys += self.keys
        for dist, count in enumerate(self.low):
            ref.keys[int(ulp_key(torch.tensor([dist])))] += count
        return ref.totals(numel, pieces)
