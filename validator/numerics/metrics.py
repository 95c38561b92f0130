"""Element-wise comparison metrics for a pair of tensors (pure math, no I/O).

``a`` is always the reference run and ``b`` the candidate. :func:`compare_tensors` checks its
inputs, has :mod:`validator.numerics.backends` read the pair once (a fused Triton pass on a GPU, a fused
numba pass on the CPU, the float64 reference elsewhere) and turns the totals into a :class:`TensorMetrics` with the
formulas of :func:`metrics_from_totals`, the same for every backend. The exact p99 ULP distance is opt-in
(``p99=True``): it reads the pair again, and no verdict reads it. ``docs/metrics.md`` defines every field.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any, cast

from validator.errors import InputError
from validator.numerics.backends import Totals, as_torch, totals_of, totals_of_many
from validator.numerics.backends.small import dtype_name
from validator.numerics.host import HostArray
from validator.numerics.jsonsafe import json_safe

if TYPE_CHECKING:
    import torch

    from validator.numerics.host import Array

__all__ = ["MetricInputError", "TensorMetrics", "compare_tensors", "measure", "measure_many", "metrics_from_totals"]


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
    p99_ulp: int | None = None  # asked for with p99=True (a second read of the pair)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict: non-finite floats become the strings "inf", "-inf" and "nan"."""
        d = {name: getattr(self, name) for name in _FIELD_NAMES}
        for name in _FLOAT_NAMES:  # the others are ints, strings or None
            if not math.isfinite(d[name]):
                d[name] = json_safe(d[name])
        return d

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TensorMetrics:
        """Inverse of :meth:`to_dict` (accepts plain floats as well as the strings)."""
        kwargs: dict[str, Any] = {}
        for f in fields(cls):
            value = data[f.name]
            kwargs[f.name] = float(value) if isinstance(value, str) and f.type == "float" else value
        return cls(**kwargs)


_FIELD_NAMES = tuple(f.name for f in fields(TensorMetrics))
_FLOAT_NAMES = tuple(f.name for f in fields(TensorMetrics) if f.type == "float")


def compare_tensors(
    a: Array,
    b: Array,
    *,
    atol: float = 1e-5,
    rtol: float = 1e-3,
    chunk_elems: int = 1 << 22,
    p99: bool = False,
) -> TensorMetrics:
    """Compare candidate ``b`` against reference ``a`` (same shape, any real dtypes): torch tensors, or
    ``host.HostArray`` (small float tensors read as NumPy; compared without importing torch).

    ``chunk_elems`` bounds the elements the float64 reference and non-contiguous inputs process at
    once; results do not depend on it beyond float64 summation order. ``p99``: also the exact p99 ULP
    distance (``p99_ulp``; a second read of the pair, the float32 pairs' a third).
    Raises :class:`MetricInputError` for non-tensors, complex/quantized/sparse/meta tensors,
    shape mismatch, negative or non-finite tolerances and ``chunk_elems < 1``.
    """
    return measure(a, b, atol=atol, rtol=rtol, chunk_elems=chunk_elems, p99=p99)[0]


def measure(
    a: Array,
    b: Array,
    *,
    atol: float = 1e-5,
    rtol: float = 1e-3,
    chunk_elems: int = 1 << 22,
    edges: Sequence[int] = (),
    p99: bool = False,
) -> tuple[TensorMetrics, Totals]:
    """:func:`compare_tensors` and the totals of its pass, with d² and a² summed per block of ``edges``
    (element offsets in row-major order, 0 first and ``numel`` last; one block by default)."""
    _check_inputs(a, b, atol, rtol, chunk_elems)
    edges = _checked_edges(tuple(edges), a.numel())
    a, b = _values(a), _values(b)
    totals = totals_of(a, b, atol=float(atol), rtol=float(rtol), chunk_elems=chunk_elems, edges=edges)
    metrics = metrics_from_totals(totals, a.dtype, b.dtype, atol, rtol)
    if p99:  # in torch (a second read of the pair)
        from validator.numerics.backends.common import ulp_spec
        from validator.numerics.backends.reference import chunk_pairs
        from validator.numerics.p99 import p99_ulp

        ta, tb = as_torch(a), as_torch(b)
        spec = ulp_spec(ta.dtype, tb.dtype)
        if spec is not None:
            metrics = replace(metrics, p99_ulp=p99_ulp(lambda: chunk_pairs(ta, tb, chunk_elems), spec))
    return metrics, totals


def measure_many(
    pairs: Sequence[tuple[Array, Array, Sequence[int]]],
    *,
    atol: float = 1e-5,
    rtol: float = 1e-3,
    chunk_elems: int = 1 << 22,
) -> list[tuple[TensorMetrics, Totals] | MetricInputError]:
    """:func:`measure` of each pair ``(a, b, edges)``, in order and with the same bits, the error it would
    raise in place of a pair it rejects. Small pairs on the CPU are measured together (``totals_of_many``)."""
    good: list[tuple[Array, Array, Sequence[int]]] = []
    out: list[tuple[TensorMetrics, Totals] | MetricInputError | None] = []
    for a, b, edges in pairs:
        try:
            _check_inputs(a, b, atol, rtol, chunk_elems)
            good.append((_values(a), _values(b), _checked_edges(tuple(edges), a.numel())))
            out.append(None)
        except MetricInputError as exc:
            out.append(exc)
    totals = iter(totals_of_many(good, atol=float(atol), rtol=float(rtol), chunk_elems=chunk_elems))
    for i, ((a, b, _), got) in enumerate(zip(pairs, out)):
        if got is None:
            t = next(totals)
            out[i] = (metrics_from_totals(t, a.dtype, b.dtype, atol, rtol), t)
    return [r for r in out if r is not None]


def _values(t: Array) -> Array:
    """``t`` without its autograd history, if it has one: the backends read values and build no graph
    (``detach`` and ``torch.no_grad`` cost 2-3 us a call each, a tenth of a small pair's time)."""
    return t if isinstance(t, HostArray) or not t.requires_grad else t.detach()


@functools.lru_cache(maxsize=256)
def _checked_edges(edges: tuple[int, ...], numel: int) -> tuple[int, ...]:
    """``edges``, or ``(0, numel)`` for none; raises MetricInputError unless they rise from 0 to numel."""
    edges = edges or (0, numel)
    if edges[0] != 0 or edges[-1] != numel or any(x > y for x, y in zip(edges, edges[1:])):
        raise MetricInputError(f"edges must rise from 0 to numel {numel}, got {edges[:3]}...{edges[-3:]}")
    return edges


def _check_inputs(a: object, b: object, atol: float, rtol: float, chunk_elems: int) -> None:
    for name, t in (("a", a), ("b", b)):
        if isinstance(t, HostArray):  # a float tensor by construction
            continue
        import torch  # (loaded already wherever a tensor is passed)

        if not isinstance(t, torch.Tensor):
            raise MetricInputError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.is_complex() or t.is_quantized or t.layout != torch.strided or t.is_meta:
            raise MetricInputError(
                f"{name} has unsupported dtype/layout/device: {t.dtype}, {t.layout}, {t.device}"
            )
    shape_a, shape_b = tuple(cast(Any, a).shape), tuple(cast(Any, b).shape)  # (a tensor or a HostArray each)
    if shape_a != shape_b:
        raise MetricInputError(f"shape mismatch: {shape_a} vs {shape_b}")
    for name, tol in (("atol", atol), ("rtol", rtol)):
        if not (isinstance(tol, (int, float)) and math.isfinite(tol) and tol >= 0):
            raise MetricInputError(f"{name} must be a finite number >= 0, got {tol!r}")
    if isinstance(chunk_elems, bool) or not isinstance(chunk_elems, int) or chunk_elems < 1:
        raise MetricInputError(f"chunk_elems must be an int >= 1, got {chunk_elems!r}")


def metrics_from_totals(
    totals: Totals, dtype_a: torch.dtype | str, dtype_b: torch.dtype | str, atol: float, rtol: float
) -> TensorMetrics:
    """Every metric from the totals of one pass: the formulas of docs/metrics.md, in one place for
    every backend (``Totals.sums``: a², b², d², |d|, a·d over the positions finite in both)."""
    sum_a2, sum_b2, sum_d2, sum_absd, sum_ad = totals.sums
    n_both, n_pass, nonfinite_a, nonfinite_b, mismatch = totals.counts
    numel = totals.numel
    norm_a, norm_b, norm_d = math.sqrt(sum_a2), math.sqrt(sum_b2), math.sqrt(sum_d2)
    rel_l2 = norm_d / norm_a if norm_a > 0 else (0.0 if norm_d == 0 else math.inf)
    if norm_a == 0 and norm_b == 0:
        cosine = 1.0
    elif norm_a == 0 or norm_b == 0:
        cosine = math.nan
    else:
        # 1 - cos = (|d|² - (|a| - |b|)²) / (2|a||b|), from the differences: no cancellation near cos = 1.
        # |a| - |b| = (|a|² - |b|²) / (|a| + |b|) with |b|² - |a|² = 2 a·d + |d|², exact algebra.
        gap = (2.0 * sum_ad + sum_d2) / (norm_a + norm_b)
        cosine = 1.0 - (sum_d2 - gap * gap) / (2.0 * norm_a * norm_b)
        cosine = cosine if math.isnan(cosine) else min(1.0, max(-1.0, cosine))  # NaN: sums past float64
    if rel_l2 == 0:
        sqnr_db = math.inf
    elif math.isinf(rel_l2):
        sqnr_db = -math.inf
    else:
        sqnr_db = -20.0 * math.log10(rel_l2)
    denom = sum_a2 + sum_b2
    return TensorMetrics(
        numel=numel,
        dtype_a=dtype_name(dtype_a),
        dtype_b=dtype_name(dtype_b),
        norm_a=norm_a,
        norm_b=norm_b,
        rel_l2=rel_l2,
        cosine=cosine,
        max_abs=float(totals.max_abs),
        mean_abs=sum_absd / n_both if n_both else 0.0,
        sqnr_db=sqnr_db,
        rel_diff=sum_d2 / denom if denom > 0 else 0.0,  # == 1 - 2<a,b>/(|a|^2+|b|^2)
        pass_ratio=n_pass / numel if numel else 1.0,
        atol=float(atol),
        rtol=float(rtol),
        nonfinite_a=nonfinite_a,
        nonfinite_b=nonfinite_b,
        nonfinite_mismatch=mismatch,
        max_ulp=totals.max_ulp,
    )
