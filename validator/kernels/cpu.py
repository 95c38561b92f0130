"""CPU backend: the pass as torch operations on float32 pieces, run on torch's own threads.

Pairs of 8-, 16- and 32-bit floats are read in pieces of :data:`PIECE` elements, converted to float32
and combined with a few vectorised torch operations per piece; the piece totals are added in float64.
Exactness where the reference's float64 matters:

- sums: float32 within rows of :data:`ROW` elements (torch splits a reduction over rows between its
  threads, never one row, so the bits do not depend on the thread count), float64 across rows;
- ``max_abs``: float32 rounding is monotonic, so the piece holding the largest float32 ``|d|`` also
  holds the largest exact one; its candidates are recomputed in float64;
- the tolerance test: counted twice in float32, against tolerances moved 2**-18 down and up; if the
  two counts differ the piece is counted again in float64;
- a piece with a non-finite value, or squares outside float32's comfortable range, goes through the
  float64 reference (:class:`~validator.kernels.reference.Accumulator`) instead.

Other pairs (float64 or integer inputs) take the reference itself.
"""

from __future__ import annotations

import torch

from .common import EPS, SAFE_HI, SAFE_LO, TINY, ULP_DTYPES, Totals, ulp_distance, ulp_key, ulp_spec
from .reference import CPU_PIECE, Accumulator, chunk_pairs, compare_reference

PIECE = 1 << 16  # elements per piece: its float32 buffers stay in the core's L2 cache
ROW = 1024  # sums are taken per row of a piece (one thread per row, so the thread count cannot change them)


def threads() -> int:
    """The threads torch uses for one operation (how many pairs are worth running at once)."""
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
        self.xa, self.xb, self.d, self.t, self.u = (torch.empty(piece) for _ in range(5))
        self.rows = torch.empty(5, piece // ROW)  # per-row float32 sums of a², b², d², a·d, |d|
        self.mask = torch.empty(piece, dtype=torch.bool)
        self.sums = [0.0] * 5
        self.n_both = self.n_pass = self.max_ulp = 0
        self.max32, self.max_abs = -1.0, 0.0
        self.keys = torch.zeros_like(self.ref.keys)
        # tolerances moved down (lo) and up (hi): a float32 count against each brackets the exact one
        self.lo = (atol * (1 - EPS) - TINY, rtol * (1 - EPS))
        self.hi = (atol * (1 + EPS) + TINY, rtol * (1 + EPS))

    def add(self, ca: torch.Tensor, cb: torch.Tensor) -> None:
        n = ca.numel()
        m = -(-n // ROW) * ROW  # whole rows; the padding is zero and adds nothing to the sums
        xa, xb, d, u = self.xa[:m], self.xb[:m], self.d[:m], self.u[:m]
        xa[:n].copy_(ca)
        xb[:n].copy_(cb)
        xa[n:].zero_()
        xb[n:].zero_()
        torch.sub(xb, xa, out=d)
        rows = self.rows[:, : m // ROW]
        for j, (x, y) in enumerate(((xa, xa), (xb, xb), (d, d), (xa, d))):
            torch.sum(torch.mul(x, y, out=u).view(-1, ROW), 1, out=rows[j])
        d.abs_()
        torch.sum(d.view(-1, ROW), 1, out=rows[4])
        s_a2, s_b2, s_d2, s_ad, s_abs = rows.double().sum(1).tolist()
        top = float(d.amax())
        fine = all(SAFE_LO <= s <= SAFE_HI for s in (s_a2, s_b2)) and (SAFE_LO <= s_d2 <= SAFE_HI or top == 0)
        if not fine:  # non-finite values (their squares are not finite) or squares near float32's limits
            self.ref.add(ca, cb)
            return
        for i, s in enumerate((s_a2, s_b2, s_d2, s_abs, s_ad)):
            self.sums[i] += s
        self.n_both += n
        self.n_pass += self._passed(ca, cb, xa[:n], d[:n])
        if top >= self.max32:  # the exact largest |d| is among this piece's largest float32 |d|
            at = (d[:n] == top).nonzero().view(-1)
            exact = float((cb[at].double() - ca[at].double()).abs().max())
            self.max32, self.max_abs = top, max(self.max_abs, exact)
        if self.spec is not None:
            dist = ulp_distance(ca, cb, self.spec)
            self.max_ulp = max(self.max_ulp, int(dist.max()))
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

    def totals(self, numel: int, pieces: object) -> Totals:
        ref = self.ref
        ref.sums += torch.tensor(self.sums, dtype=torch.float64)
        ref.counts[0] += self.n_both
        ref.counts[1] += self.n_pass
        ref.max_abs = torch.clamp(ref.max_abs, min=self.max_abs)
        ref.max_ulp = torch.clamp(ref.max_ulp, min=self.max_ulp)
        ref.keys += self.keys
        return ref.totals(numel, pieces)  # type: ignore[arg-type]
