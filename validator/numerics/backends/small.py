"""The CPU engine's pass over small pairs: NumPy float64, nothing compiled, neither numba nor torch imported.

A pair of at most :data:`NUMPY_MAX` elements (the whole pair's count: a size, never a setting or the state
of a cache) is read here; a larger one by the numba kernels of ``cpu.py``, which compile at their first use.
So comparing small tensors (a demo, two small files, a drill-down page) waits for no compiler and does not
import numba. Both write the same rows of partials (:func:`plan`: at most ``ROW`` elements a row, rows
laid from each edge of the pair's blocks) and add them in one sequential float64 chain (:func:`chain`), so a small pair measured in ranges (``validator.numerics.ranges``) merges into
the bits measured whole.

A side is a CPU torch tensor or a ``host.HostArray`` (a small tensor read from a file as NumPy, bfloat16 and
float8 as their bits): both are read through their storage form (:func:`stored`), so they give the same bits,
and a comparison of HostArrays never imports torch.

Here every element is read in float64, as ``docs/metrics.md`` defines the metrics (:func:`rows_of` is that
definition in code: ``reference.py``, the float64 reference every backend is held to, runs it too): a row's sums
are NumPy's float64 sums of its elements finite in both sides; the largest |d| and every count are exact. Many
pairs are read end to end, each row summed on its own, so a pair's bits do not depend on the pairs beside it.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from validator.numerics.backends.totals import Totals, blocks_meeting
from validator.numerics.host import STORAGE, ULP_NAMES, HostArray

if TYPE_CHECKING:
    import torch

    from validator.numerics.host import Array

NUMPY_MAX = 1 << 13  # elements: pairs no larger are read here (benchmarks/first_compare_bench.md)
ROW = 2048  # elements a row of partials covers (one row of float32 sums and counts in cpu.py)
GROUP = 1 << 16  # elements: many pairs are read this many at a time (their float64 copies stay in cache)
SMALL = 1 << 18  # elements: cpu.py's passes over at most this many run on the calling thread (backends.batchable)
# a row's partials: rows_f (float64) a², b², d², |d|, a·d, the largest |d| (TOP); rows_i (int64) finite in both,
# passed, non-finite in a, in b, mismatched, the largest ULP distance (MAX_ULP), then from NAN_A on NaN in a, in b,
# the same infinity in both (cpu.py's rows have these columns too)
TOP, MAX_ULP, NAN_A = 5, 5, 6
_SIGNED = {2: np.int16, 1: np.int8, 4: np.int32}
_MASK = {n: (1 << (8 * n - 1)) - 1 for n in _SIGNED}  # the bits but the sign's


@functools.lru_cache(maxsize=256)
def plan(edges: tuple[int, ...], start: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(starts, owner): rows of at most ROW elements of range ``start .. start + n``, none across an
    edge (row i: elements starts[i] .. starts[i+1] of the range), and the edge block each row is in."""
    owner, lo, hi = np.array(blocks_meeting(edges, start, start + n), np.int64).reshape(-1, 3).T
    count = -(-(hi - lo) // ROW)  # rows of each block
    before = np.cumsum(count) - count
    starts = np.repeat(lo - ROW * before, count) + ROW * np.arange(count.sum())
    return np.append(starts, n), np.repeat(owner, count)


def _e4m3fn() -> np.ndarray:
    """float64 value of every float8_e4m3fn bit pattern: 4 exponent bits (bias 7), 3 significand bits, no
    infinity, NaN where all seven low bits are set (tests hold it to torch's conversion)."""
    b = np.arange(256)
    e, m = (b >> 3) & 0xF, b & 7
    mag = np.where(e == 0, m * 2.0**-9, (1 + m / 8) * 2.0 ** (e - 7))
    return np.where((b & 0x7F) == 0x7F, np.nan, np.where(b >> 7, -mag, mag))


# float64 value of every bit pattern of the 8-bit float types, exactly (float8_e5m2 is float16's high byte)
_TABLES = {
    "float8_e4m3fn": _e4m3fn(),
    "float8_e5m2": (np.arange(256, dtype=np.uint16) << 8).view(np.float16).astype(np.float64),
}


def stored(t: Array) -> tuple[np.ndarray, str]:
    """``t``'s elements, flat in row-major order, in their storage form (``host.STORAGE``: bfloat16 and
    float8 as their bits; integers and bool as themselves), and its dtype's name; a CPU torch tensor's without a
    copy where it is dense."""
    if isinstance(t, HostArray):
        return t.bits.reshape(-1), t.dtype
    import torch

    flat, name = t.reshape(-1), dtype_name(t.dtype)
    if flat.stride(0) != 1:  # (one element of stride 2 is "contiguous": contiguous() would keep it)
        flat = torch.empty_like(flat, memory_format=torch.contiguous_format).copy_(flat)
    if name not in STORAGE or name in ("float64", "float32", "float16"):  # (integers and bool: the reference's)
        return flat.numpy(), name
    raw = flat.view(torch.int16 if flat.element_size() == 2 else torch.uint8).numpy()
    return raw.view(STORAGE[name]), name


@functools.cache
def dtype_name(dtype: torch.dtype | str) -> str:
    """``torch.bfloat16`` (or a HostArray's ``"bfloat16"``) -> ``"bfloat16"``: the names ``host.STORAGE`` and
    :func:`values` read."""
    return str(dtype).removeprefix("torch.")


def values(bits: np.ndarray, name: str) -> np.ndarray:
    """The elements (flat, in their storage form: :func:`stored`) in float64, exactly."""
    if name == "float64":
        return bits
    table = _TABLES.get(name)
    if table is not None:
        looked_up: np.ndarray = table[bits]
        return looked_up
    with np.errstate(invalid="ignore"):  # a signalling NaN's bits: a NaN all the same
        if name == "bfloat16":  # its bits are the high half of a float32's
            high: np.ndarray = bits.astype(np.uint32) << 16
            return high.view(np.float32).astype(np.float64)
        return bits.astype(np.float64)  # float32, float16, integers, bool


def ordinals(bits: np.ndarray) -> np.ndarray:
    """Each element's bit pattern as a point on a monotonic integer line (``numerics.p99.ulp_distance``): its bits,
    or minus them without the sign bit where that is set; computed in the storage width (it fits), int64."""
    s = bits.view(_SIGNED[bits.itemsize])
    neg = s >> (8 * bits.itemsize - 1)  # -1 where the sign bit is set, else 0
    out: np.ndarray = ((s ^ (neg & _MASK[bits.itemsize])) - neg).astype(np.int64)
    return out


def has_ulp(name_a: str, name_b: str) -> bool:
    """Whether a pair of these dtypes has ULP metrics (``common.ulp_spec``, by name)."""
    return name_a == name_b and name_a in ULP_NAMES


def rows_of(x: np.ndarray, y: np.ndarray, dist: np.ndarray | None, atol: float, rtol: float,
            starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """The rows of partials (``[rows, 6]`` float64, ``[rows, 9]`` int64: see the module's constants) of the
    float64 values ``x`` (reference) and ``y``, row i elements starts[i] .. starts[i+1] (the last start: the
    end); ``dist``: the ULP distances, or None without ULP metrics."""
    at = starts[:-1]
    rows_f, rows_i = np.empty((len(at), 6)), np.zeros((len(at), 9), np.int64)
    with np.errstate(invalid="ignore", over="ignore"):
        fin_a, fin_b = np.isfinite(x), np.isfinite(y)
        both = fin_a & fin_b
        clean = bool(both.all())
        x0, y0 = x, y
        if not clean:
            x, y = np.where(both, x, 0.0), np.where(both, y, 0.0)
        d = y - x
        ad = np.abs(d)
        for i, v in enumerate((x * x, y * y, d * d, ad, x * d)):
            rows_f[:, i] = np.add.reduceat(v, at)
        rows_f[:, TOP] = np.maximum.reduceat(ad, at)
        passed = ad <= atol + rtol * np.abs(x)
        if dist is not None:
            rows_i[:, MAX_ULP] = np.maximum.reduceat(dist if clean else np.where(both, dist, 0), at)
        if clean:
            rows_i[:, 0] = np.diff(starts)
            rows_i[:, 1] = np.add.reduceat(passed, at, dtype=np.int64)
            return rows_f, rows_i
        nan_a, nan_b, equal = np.isnan(x0), np.isnan(y0), x0 == y0
        same = ~both & (equal | (nan_a & nan_b))  # NaN/NaN, +Inf/+Inf or -Inf/-Inf
        cols = (both, (passed & both) | same, ~fin_a, ~fin_b, ~both & ~same, None, nan_a, nan_b, np.isinf(x0) & equal)
        for i, c in enumerate(cols):
            if c is not None:
                rows_i[:, i] = np.add.reduceat(c, at, dtype=np.int64)
    return rows_f, rows_i


def chain(rows: np.ndarray, first: np.ndarray) -> np.ndarray:
    """Each pair's rows (pair p: rows first[p] .. first[p+1]) added one after another in float64, from 0.0
    (``[pairs, columns]``; the NumPy and numba passes and merged ranges add their rows here). ``np.cumsum`` adds in order; its first term
    is the first row, not 0.0 + it, which differs only where that is -0.0: adding 0.0 at the end gives the
    chain's +0.0 there, and changes nothing else."""
    pairs = len(first) - 1
    lengths = np.diff(first)
    longest = int(lengths.max(initial=0))
    out = np.zeros((pairs, rows.shape[1]))
    if pairs <= longest:  # few pairs of many rows: each pair's chain on its own
        for p in range(pairs):
            if lengths[p]:
                out[p] = np.cumsum(rows[first[p] : first[p + 1]], axis=0)[-1] + 0.0
        return out
    for k in range(longest):  # many pairs of few rows: the k-th row of every pair that has one
        has = np.flatnonzero(lengths > k)
        out[has] += rows[first[has] + k]
    return out


def add_up(
    rows_f: np.ndarray, rows_i: np.ndarray, first: np.ndarray, owner: np.ndarray, n_blocks: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per pair (rows first[p] .. first[p+1]): the sums (:func:`chain`), the largest |d| and its int columns
    (:func:`add_ints`); and the d² and a² of each edge block (:func:`block_sums`)."""
    tops = np.maximum.reduceat(rows_f[:, TOP], first[:-1])
    return chain(rows_f[:, :5], first), tops, add_ints(rows_i, first), block_sums(rows_f, owner, n_blocks)


def block_sums(rows_f: np.ndarray, owner: np.ndarray, n_blocks: int) -> np.ndarray:
    """The d² and a² (``[2, n_blocks]``) of each edge block (``owner``: each row's, never decreasing), each a
    :func:`chain` of its rows."""
    blocks = np.zeros((2, n_blocks))
    cut = np.flatnonzero(np.diff(owner)) + 1  # owner never decreases: a block's rows lie together
    seg = np.concatenate(([0], cut, [len(owner)]))
    blocks[:, owner[seg[:-1]]] = chain(rows_f[:, [2, 0]], seg).T
    return blocks


def add_ints(rows_i: np.ndarray, first: np.ndarray) -> np.ndarray:
    """The int columns of each pair's rows (pair p: rows first[p] .. first[p+1]) as one row of them
    (``[pairs, 9]``): the counts added, the largest ULP distance the largest."""
    ints: np.ndarray = np.add.reduceat(rows_i, first[:-1])
    ints[:, MAX_ULP] = np.maximum.reduceat(rows_i[:, MAX_ULP], first[:-1])
    return ints


def pair_totals(
    numels: Sequence[int], ulps: Sequence[bool], sums: np.ndarray, tops: np.ndarray, ints: np.ndarray,
    blocks: np.ndarray, edge_at: np.ndarray,
) -> list[Totals]:  # fmt: skip
    """The ``Totals`` of each pair p of ``numels[p]`` elements from what its pass added up (:func:`add_up`,
    ``cpu._run``): its sums, its largest |d|, its int columns (its largest ULP distance reported where
    ``ulps[p]``) and the d² and a² of its edge blocks edge_at[p] .. edge_at[p+1] of ``blocks``."""
    sums_l, tops_l, ints_l, at = (v.tolist() for v in (sums, tops, ints, edge_at))
    d2, a2 = map(tuple, blocks.tolist())  # tuples: a pair's slices are its Totals' own
    return [
        Totals(
            n, tuple(s), top, tuple(c[:MAX_ULP]), c[MAX_ULP] if ulp else None, d2[lo:hi], a2[lo:hi], tuple(c[NAN_A:])
        )
        for n, ulp, s, top, c, lo, hi in zip(numels, ulps, sums_l, tops_l, ints_l, at, at[1:])
    ]


def lay_out(pairs: Sequence[tuple[int, Sequence[int]]]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Pairs of ``(numel, edges)`` (no edges: one block) laid end to end, each cut into rows by :func:`plan`:
    (each row's first element and the end, each row's edge block counted over all pairs, each pair's first row
    and the end, each pair's first edge block and the end), as the passes over many pairs read them."""
    edges = [tuple(e) or (0, n) for n, e in pairs]
    plans = [plan(e, 0, n) for (n, _), e in zip(pairs, edges)]
    at = np.cumsum([0] + [n for n, _ in pairs])
    rows = np.array([len(o) for _, o in plans], np.int64)
    first = np.concatenate(([0], np.cumsum(rows)))
    edge_at = np.cumsum([0] + [len(e) - 1 for e in edges])
    starts = np.concatenate([s[:-1] for s, _ in plans] + [at[-1:]])
    starts[:-1] += np.repeat(at[:-1], rows)
    owner = np.concatenate([o for _, o in plans]) + np.repeat(edge_at[:-1], rows)
    return starts, owner, first, edge_at


def read(a: Array, b: Array) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Both sides' float64 values and their ULP distances (None without ULP metrics)."""
    (bits_a, name_a), (bits_b, name_b) = stored(a), stored(b)
    dist = None
    if has_ulp(name_a, name_b):
        dist = np.abs(ordinals(bits_a) - ordinals(bits_b))
    return values(bits_a, name_a), values(bits_b, name_b), dist


def small_totals_many(pairs: Sequence[tuple[Array, Array, Sequence[int]]], *, atol: float, rtol: float) -> list[Totals]:
    """The totals of each pair ``(a, b, edges)`` (float dtypes on the CPU; ``edges``: see ``common.Totals``),
    the pairs read end to end, each row on its own: a pair's bits are those it has alone."""
    if not pairs:
        return []
    if any(a.numel() == 0 for a, _, _ in pairs):  # an empty pair has no rows: its totals are zeros
        whole = [(a, b, e) for a, b, e in pairs if a.numel()]
        done = iter(small_totals_many(whole, atol=atol, rtol=rtol))
        return [next(done) if a.numel() else empty_totals(a, b, e) for a, b, e in pairs]
    if len(pairs) > 1 and sum(a.numel() for a, _, _ in pairs) > GROUP:  # read GROUP elements of pairs at a time
        out, size, begin = [], 0, 0
        for i, (a, _, _) in enumerate(pairs):
            if size and size + a.numel() > GROUP:
                out += small_totals_many(pairs[begin:i], atol=atol, rtol=rtol)
                size, begin = 0, i
            size += a.numel()
        return out + small_totals_many(pairs[begin:], atol=atol, rtol=rtol)
    got = [read(a, b) for a, b, _ in pairs]
    starts, owner, first, edge_at = lay_out([(a.numel(), e) for a, _, e in pairs])
    x, y = np.concatenate([r[0] for r in got]), np.concatenate([r[1] for r in got])
    ulps = [r[2] is not None for r in got]  # a pair without ULP metrics: zeros, not reported
    dist = np.concatenate([np.zeros(len(r[0]), np.int64) if r[2] is None else r[2] for r in got]) if any(ulps) else None
    rows_f, rows_i = rows_of(x, y, dist, atol, rtol, starts)
    added = add_up(rows_f, rows_i, first, owner, int(edge_at[-1]))
    return pair_totals([a.numel() for a, _, _ in pairs], ulps, *added, edge_at)


def empty_totals(a: Array, b: Array, edges: Sequence[int]) -> Totals:
    """The totals of a pair of no elements: zeros."""
    zeros = (0.0,) * max(1, len(edges) - 1)
    ulp = has_ulp(dtype_name(a.dtype), dtype_name(b.dtype))
    return Totals(0, (0.0,) * 5, 0.0, (0,) * 5, 0 if ulp else None, zeros, zeros)


def small_totals(a: Array, b: Array, *, atol: float, rtol: float, edges: Sequence[int] = ()) -> Totals:
    """:func:`small_totals_many` of one pair."""
    return small_totals_many([(a, b, edges)], atol=atol, rtol=rtol)[0]
