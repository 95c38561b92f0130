"""Element-wise comparison metrics for a pair of tensors (pure math, no I/O).

``a`` is always the reference run and ``b`` the candidate. Both are flattened and read in
chunks of ``chunk_elems`` elements; each chunk is upcast to float64 and every sum is
accumulated in float64 on the tensors' device, so memory stays O(chunk) whatever the tensor
size, and a CUDA tensor is synchronised once at the end (twice for the rare float32 ULP
refinement described in :func:`_p99_from_hist`). ``docs/metrics.md`` defines every field.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import torch

from .errors import InputError

__all__ = ["MetricInputError", "TensorMetrics", "compare_tensors"]

# dtype -> (same-width signed integer dtype, mask of the non-sign bits)
_ULP_DTYPES: dict[torch.dtype, tuple[torch.dtype, int]] = {
    torch.bfloat16: (torch.int16, 0x7FFF),
    torch.float16: (torch.int16, 0x7FFF),
    torch.float32: (torch.int32, 0x7FFFFFFF),
    torch.float8_e4m3fn: (torch.int8, 0x7F),
    torch.float8_e5m2: (torch.int8, 0x7F),
}
_FINE_BINS = 1 << 16  # exact histogram bins 0..65535; bin 65536 counts everything larger
_P99_NUM, _P99_DEN = 99, 100
# On CPU, pieces above ~2**20 elements run 4-5x slower (fresh allocations fault in new pages
# every piece), so CPU work uses at most this many elements per piece whatever chunk_elems says.
_CPU_PIECE = 1 << 19
# On accelerators each histogram is kept in this many interleaved copies (element i adds to
# copy i % copies), so that a pile of equal distances does not serialise on one atomic counter.
_ACCEL_COPIES = 64


class MetricInputError(InputError, ValueError):
    """The inputs cannot be compared; the message names the problem."""


@dataclass(frozen=True)
class TensorMetrics:
    """Result of :func:`compare_tensors`; ``a`` is the reference, ``b`` the candidate."""

    numel: int
    dtype_a: str
    dtype_b: str
    norm_a: float
    norm_b: float
    rel_l2: float
    cosine: float
    max_abs: float
    mean_abs: float
    sqnr_db: float
    rel_diff: float
    pass_ratio: float
    atol: float
    rtol: float
    nonfinite_a: int
    nonfinite_b: int
    nonfinite_mismatch: int
    max_ulp: int | None
    p99_ulp: int | None

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict: non-finite floats become the strings "inf", "-inf" and "nan"."""
        return {f.name: _json_safe(getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TensorMetrics:
        """Inverse of :meth:`to_dict` (accepts plain floats as well as the strings)."""
        kwargs: dict[str, Any] = {}
        for f in fields(cls):
            value = data[f.name]
            kwargs[f.name] = float(value) if isinstance(value, str) and f.type == "float" else value
        return cls(**kwargs)


def _json_safe(value: object) -> object:
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def compare_tensors(
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    atol: float = 1e-5,
    rtol: float = 1e-3,
    chunk_elems: int = 1 << 22,
) -> TensorMetrics:
    """Compare candidate ``b`` against reference ``a`` (same shape, any real dtypes).

    ``chunk_elems`` bounds the elements processed at once (working set about 100 bytes per
    element of it); on CPU the pieces are further capped at 2**19 elements for speed.
    Raises :class:`MetricInputError` for non-tensors, complex/quantized/sparse/meta tensors,
    shape mismatch, negative or non-finite tolerances and ``chunk_elems < 1``.
    """
    if isinstance(a, torch.Tensor) and a.is_cuda:  # a pair like one the CUDA C engine ran before:
        pending = _start_lane(a, b, atol, rtol)  # launched at once, checked while the GPU works
        if pending is not None:
            try:
                _check_inputs(a, b, atol, rtol, chunk_elems)
            except BaseException:
                pending.cancel()
                raise
            got: TensorMetrics = pending.finish(chunk_elems)
            return got
    _check_inputs(a, b, atol, rtol, chunk_elems)
    fast = _compare_fast(a, b, atol, rtol, chunk_elems)
    if fast is not None:
        return fast
    device = _compute_device(a, b)
    ulp = _ULP_DTYPES.get(a.dtype) if a.dtype == b.dtype else None
    piece = min(chunk_elems, _CPU_PIECE) if device.type == "cpu" else chunk_elems
    piece = max(1, min(piece, a.numel()))
    acc = _Accumulator(device, atol, rtol, piece, ulp is not None, a.dtype == torch.float32)
    with torch.no_grad():
        for ca, cb in _chunk_pairs(a.detach(), b.detach(), piece):
            acc.add(ca.to(device), cb.to(device), ulp)
        return acc.finish(a, b, ulp)


_LANE_START: Any = None


def _start_lane(a: torch.Tensor, b: object, atol: object, rtol: object) -> Any:
    """validator.kernels.start_lane (docs/performance.md, "CUDA kernels", lanes), imported at first use."""
    global _LANE_START
    if _LANE_START is None:
        from .kernels import start_lane

        _LANE_START = start_lane
    return _LANE_START(a, b, atol, rtol)


def _compare_fast(a: torch.Tensor, b: torch.Tensor, atol: float, rtol: float, chunk_elems: int) -> TensorMetrics | None:
    """The same metrics from validator.kernels' one-pass kernels (multi-core CPU, fused CUDA), or
    None where none applies; ``VALIDATOR_KERNELS=0`` keeps to the code below (docs/performance.md)."""
    from .kernels import compare_fast

    return compare_fast(a, b, atol=atol, rtol=rtol, chunk_elems=chunk_elems)


def _check_inputs(a: object, b: object, atol: float, rtol: float, chunk_elems: int) -> None:
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor):
            raise MetricInputError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.is_complex() or t.is_quantized or t.layout != torch.strided or t.is_meta:
            raise MetricInputError(
                f"{name} has unsupported dtype/layout/device: {t.dtype}, {t.layout}, {t.device}"
            )
    assert isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
    if a.shape != b.shape:
        raise MetricInputError(f"shape mismatch: {tuple(a.shape)} vs {tuple(b.shape)}")
    for name, tol in (("atol", atol), ("rtol", rtol)):
        if not (isinstance(tol, (int, float)) and math.isfinite(tol) and tol >= 0):
            raise MetricInputError(f"{name} must be a finite number >= 0, got {tol!r}")
    if isinstance(chunk_elems, bool) or not isinstance(chunk_elems, int) or chunk_elems < 1:
        raise MetricInputError(f"chunk_elems must be an int >= 1, got {chunk_elems!r}")


def _compute_device(a: torch.Tensor, b: torch.Tensor) -> torch.device:
    """The accelerator holding a (else b); CPU when neither is on one. MPS lacks float64."""
    for t in (a, b):
        if t.device.type not in ("cpu", "mps"):
            return t.device
    return torch.device("cpu")


def _chunk_pairs(a: torch.Tensor, b: torch.Tensor, chunk: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
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
            yield from _chunk_pairs(a[i], b[i], chunk)
        return
    step = chunk // row
    for start in range(0, a.shape[0], step):
        yield a[start : start + step].reshape(-1), b[start : start + step].reshape(-1)


def _ulp_distance(ca: torch.Tensor, cb: torch.Tensor, spec: tuple[torch.dtype, int]) -> torch.Tensor:
    """|ord(a) - ord(b)| as int64, ord mapping the bit patterns onto a monotonic integer line."""
    int_dtype, mask = spec

    def ordinal(x: torch.Tensor) -> torch.Tensor:
        bits = x.view(int_dtype).to(torch.int64)
        return torch.where(bits < 0, -(bits & mask), bits)  # -0.0 -> 0, like +0.0

    return (ordinal(ca) - ordinal(cb)).abs()


def _histogram_copies(device: torch.device) -> int:
    return 1 if device.type == "cpu" else _ACCEL_COPIES


class _Histogram:
    """Exact int64 counts of integers in [0, _FINE_BINS], added without a host sync."""

    def __init__(self, device: torch.device, piece: int) -> None:
        self.bins = _FINE_BINS + 1
        copies = _histogram_copies(device)
        self.counts = torch.zeros(copies * self.bins, dtype=torch.int64, device=device)
        self.offset = None if copies == 1 else (torch.arange(piece, device=device) % copies) * self.bins

    def add(self, index: torch.Tensor, weight: torch.Tensor) -> None:
        if self.offset is not None:
            index = index + self.offset[: index.numel()]
        self.counts.scatter_add_(0, index, weight)

    def total(self) -> torch.Tensor:
        """The counts on CPU, copies summed."""
        return self.counts.view(-1, self.bins).sum(0).cpu()


class _Accumulator:
    """Running float64 sums, int64 counts and ULP histograms, all on one device."""

    def __init__(
        self, device: torch.device, atol: float, rtol: float, piece: int, ulp: bool, coarse: bool
    ) -> None:
        self.atol, self.rtol = float(atol), float(rtol)
        # sum a^2, sum b^2, sum a*b, sum d^2, sum |d|   (over elements finite in both; d = b - a)
        self.sums = torch.zeros(5, dtype=torch.float64, device=device)
        self.max_abs = torch.zeros((), dtype=torch.float64, device=device)
        # finite in both, passed, non-finite in a, non-finite in b, non-finite mismatch
        self.counts = torch.zeros(5, dtype=torch.int64, device=device)
        self.max_ulp = torch.zeros((), dtype=torch.int64, device=device)
        self.device, self.piece = device, piece
        self.fine = _Histogram(device, piece) if ulp else None
        # float32 only: histogram of distance >> 16 (distances of finite float32 are < 2**32)
        self.coarse = _Histogram(device, piece) if ulp and coarse else None

    def add(self, ca: torch.Tensor, cb: torch.Tensor, ulp: tuple[torch.dtype, int] | None) -> None:
        xa, xb = ca.to(torch.float64), cb.to(torch.float64)
        fin_a, fin_b = torch.isfinite(xa), torch.isfinite(xb)
        both = fin_a & fin_b
        neither = ~(fin_a | fin_b)
        # Non-finite in both and of the same kind: NaN/NaN, +Inf/+Inf or -Inf/-Inf.
        same_kind = neither & ((xa == xb) | (torch.isnan(xa) & torch.isnan(xb)))
        za = torch.where(both, xa, 0.0)
        zb = torch.where(both, xb, 0.0)
        d = zb - za
        absd = d.abs()
        close = both & (absd <= self.atol + self.rtol * za.abs())
        self.sums += torch.stack(
            [(za * za).sum(), (zb * zb).sum(), (za * zb).sum(), (d * d).sum(), absd.sum()]
        )
        self.max_abs = torch.maximum(self.max_abs, absd.max())
        self.counts += torch.stack(
            [
                both.sum(),
                close.sum() + same_kind.sum(),
                (~fin_a).sum(),
                (~fin_b).sum(),
                (~both & ~same_kind).sum(),
            ]
        )
        if ulp is not None and self.fine is not None:
            dist = _ulp_distance(ca, cb, ulp).masked_fill(~both, 0)
            weight = both.to(torch.int64)
            self.max_ulp = torch.maximum(self.max_ulp, dist.max())
            self.fine.add(dist.clamp(max=_FINE_BINS), weight)
            if self.coarse is not None:
                self.coarse.add(dist >> 16, weight)

    def finish(self, a: torch.Tensor, b: torch.Tensor, ulp: tuple[torch.dtype, int] | None) -> TensorMetrics:
        sums = self.sums.cpu().tolist()  # the one sync
        max_abs = float(self.max_abs.cpu())
        counts = self.counts.cpu().tolist()
        ulp_vals = None
        if ulp is not None:
            ulp_vals = (int(self.max_ulp.cpu()), _p99_from_hist(self, a, b, ulp, counts[0]))
        return metrics_from_totals(
            a.numel(), a.dtype, b.dtype, self.atol, self.rtol, sums, max_abs, counts, ulp_vals
        )


def metrics_from_totals(
    numel: int,
    dtype_a: torch.dtype,
    dtype_b: torch.dtype,
    atol: float,
    rtol: float,
    sums: Sequence[float],
    max_abs: float,
    counts: Sequence[int],
    ulp: tuple[int, int] | None,
) -> TensorMetrics:
    """Every metric from the float64 totals of one pass: the formulas of docs/metrics.md, in one place
    for the reference and the kernels. ``sums``: a², b², ab, d², |d|; ``counts``: finite in both,
    passed, non-finite in a, in b, mismatches; ``ulp``: (max_ulp, p99_ulp) or ``None``."""
    sum_a2, sum_b2, sum_ab, sum_d2, sum_absd = map(float, sums)
    n_both, n_pass, nonfinite_a, nonfinite_b, mismatch = map(int, counts)
    norm_a, norm_b, norm_d = math.sqrt(sum_a2), math.sqrt(sum_b2), math.sqrt(sum_d2)
    rel_l2 = norm_d / norm_a if norm_a > 0 else (0.0 if norm_d == 0 else math.inf)
    if norm_a == 0 and norm_b == 0:
        cosine = 1.0
    elif norm_a == 0 or norm_b == 0:
        cosine = math.nan
    else:
        cosine = min(1.0, max(-1.0, sum_ab / norm_a / norm_b))
    if rel_l2 == 0:
        sqnr_db = math.inf
    elif math.isinf(rel_l2):
        sqnr_db = -math.inf
    else:
        sqnr_db = -20.0 * math.log10(rel_l2)
    denom = sum_a2 + sum_b2
    return TensorMetrics(
        numel=numel,
        dtype_a=_dtype_name(dtype_a),
        dtype_b=_dtype_name(dtype_b),
        norm_a=norm_a,
        norm_b=norm_b,
        rel_l2=rel_l2,
        cosine=cosine,
        max_abs=float(max_abs),
        mean_abs=sum_absd / n_both if n_both else 0.0,
        sqnr_db=sqnr_db,
        rel_diff=sum_d2 / denom if denom > 0 else 0.0,  # == 1 - 2<a,b>/(|a|^2+|b|^2)
        pass_ratio=n_pass / numel if numel else 1.0,
        atol=float(atol),
        rtol=float(rtol),
        nonfinite_a=nonfinite_a,
        nonfinite_b=nonfinite_b,
        nonfinite_mismatch=mismatch,
        max_ulp=None if ulp is None else int(ulp[0]),
        p99_ulp=None if ulp is None else int(ulp[1]),
    )


def _nearest_rank(n: int) -> int:
    """1-based rank of the 99th percentile: ceil(0.99 n), in exact integer arithmetic."""
    return (_P99_NUM * n + _P99_DEN - 1) // _P99_DEN


def _first_reaching(hist: torch.Tensor, rank: int) -> int:
    """Smallest bin index whose cumulative count reaches ``rank``."""
    cum = hist.cumsum(0)
    return int(torch.searchsorted(cum, torch.tensor([rank], dtype=cum.dtype)).item())


def _p99_from_hist(
    acc: _Accumulator, a: torch.Tensor, b: torch.Tensor, ulp: tuple[torch.dtype, int], n: int
) -> int:
    """Exact nearest-rank p99 of the ULP distances of the elements finite in both.

    Distances below 2**16 (every distance for 8- and 16-bit types) are binned exactly. When the
    p99 lands in the overflow bin (float32 only), the coarse histogram of ``distance >> 16``
    names the 65536-wide bucket holding it, and a second streaming pass bins the low 16 bits of
    the distances inside that bucket.
    """
    if n == 0:
        return 0
    assert acc.fine is not None
    rank = _nearest_rank(n)
    idx = _first_reaching(acc.fine.total(), rank)
    if idx < _FINE_BINS:
        return idx
    assert acc.coarse is not None
    coarse = acc.coarse.total()
    bucket = _first_reaching(coarse, rank)
    rank_in_bucket = rank - int(coarse[:bucket].sum())
    low = _Histogram(acc.device, acc.piece)
    with torch.no_grad():
        for ca, cb in _chunk_pairs(a.detach(), b.detach(), acc.piece):
            ca, cb = ca.to(acc.device), cb.to(acc.device)
            dist = _ulp_distance(ca, cb, ulp)
            sel = torch.isfinite(ca) & torch.isfinite(cb) & ((dist >> 16) == bucket)
            low.add(dist & (_FINE_BINS - 1), sel.to(torch.int64))
    return (bucket << 16) + _first_reaching(low.total(), rank_in_bucket)


_DTYPE_NAMES: dict[torch.dtype, str] = {}


def _dtype_name(dtype: torch.dtype) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype).removeprefix("torch.")
    return name
