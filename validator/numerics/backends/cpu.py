"""CPU backend: one fused numba pass per pair, float32 per element, float64 across rows.

Both tensors are read as their raw bits, typed by their format: bfloat16 as int16, float16 as uint16,
float8 as uint8, float32 as uint32 (:func:`_float` gives the value, :func:`_dist` the ULP distance; float16
and float8 values come from a table of every bit pattern, built once from torch's own conversion; float64
as itself). A pair of two formats is read as it is stored, never converted: each side's values are exact
in float32 (float64 for float64), and the sums are float64; its 16-bit sides are read through their table,
so that the kernels are compiled for fewer pairs of types. numba compiles the pass for a pair of types at
its first use, or loads it from its on-disk cache (which a wheel can carry: ``numerics/numba_cache.py``);
``backends.totals_of`` sends a pair of at most ``small.NUMPY_MAX`` elements to ``small.py``'s NumPy pass instead
(nothing to compile), which writes the same rows of partials and adds them with the same chain.

A pair is read in rows of at most :data:`ROW` elements (none across an edge of ``edges``, whose blocks the
bootstrap resamples); ``prange`` hands units of rows to numba's threads (:func:`_call`): :data:`GROUP` rows of one pair
(:func:`cpu_totals`), or a whole small pair (:func:`cpu_totals_many`). Each row is read once, in spans of
:data:`SPAN` elements, each one loop of constant length (:func:`_lanes_of`; a row cut short by an edge in spans of
:data:`SHORT_SPAN`, the last from a copy with zeros after it):

- sums of a², b², d², |d|, a·d, kept in registers across the vector's lanes (numba's ``fastmath``
  ``reassoc``: the order is the compiled loop's, fixed on one machine), float32 for bfloat16 and float8,
  float64 for float16 and float32 (:func:`_acc`), added in float64 per span or piece;
- the largest float32 |d|, and the tolerance test counted against tolerances moved 2**-20 down and up
  (``common.EPS``, ``TINY``): equal counts are the float64 count;
- the largest ULP distance.

A pair with a float64 side takes the same fused path with float64 per element. A row whose sums come out past
float32's range (NaN/Inf among its elements) is read again at once by the same loop with the positions not finite in
both sides left out and counted (:func:`_spans` with ``masked``, as the GPU pass does): a row of masked logits costs
a second read, not a fall to NumPy. After the pass NumPy reads again (:func:`_redo`), by ``small.rows_of``, the
float64 definition the reference runs too: each row whose sums of squares still leave 2**-100..2**100 (squares past
float32's range, tiny values, no finite position) or whose two tolerance counts differ, and, for its largest |d|
alone, each row that holds a pair's largest float32 |d| unless its ULP distances show its float32 differences exact
(``common.exact_ulp``): float32 rounding is monotonic, so the exact largest |d| is among those positions. A pass
over at most :data:`SMALL` elements runs on the calling thread (:func:`_call`).

Each row of elements writes one row of partials, and a pair's rows are added one after another (``small.add_up``,
the same code for one pair, many pairs and a pair merged from ranges), so the result does not depend on
the thread count, on which thread ran which row, or on how pairs were grouped. Integer and boolean
pairs take the reference (``backends.backend_for``).
"""

# mypy: disallow-untyped-defs=False, disallow-untyped-calls=False, disallow-untyped-decorators=False
from __future__ import annotations

import functools
import itertools
import threading
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, cast

import numpy as np
import torch

from validator.numerics.backends.common import SAFE_HI, SAFE_LO, Totals, exact_ulp, tolerances, ulp_spec
from validator.numerics.backends.reference import chunk_pairs
from validator.numerics.backends.small import (
    MAX_ULP,
    NAN_A,
    NUMPY_MAX,
    ROW,
    SMALL,
    add_ints,
    add_up,
    dtype_name,
    lay_out,
    ordinals,
    pair_totals,
    plan,
    read,
    rows_of,
    stored,
    values,
)
from validator.numerics.host import STORAGE
from validator.numerics.jit import njit, numba, overload, prange, types
from validator.numerics.numba_cache import first_call

GROUP = 32  # rows per unit, a prange iteration (ROW, from small.py: elements a row of partials covers)
SPAN = 512  # elements: a whole row is read in spans of this many, each span's float32 sums added in float64
SHORT_SPAN = 256  # elements: a row cut short by an edge is read in spans of this many
# a row's partials, in two arrays: f (float64) a², b², d², |d|, a·d, the exact largest |d| (MAX_EXACT) and the largest
# float32 |d| (MAX32); c (int64) small.py's int columns: finite in both, passed, non-finite in a, in b, mismatched,
# the largest ULP distance (MAX_ULP), then from NAN_A on NaN in a, in b and the same infinity in both
MAX_EXACT, MAX32 = 5, 6
# ROW, GROUP, SPAN, SHORT_SPAN: chosen on the 2-core dev box (benchmarks/engine_bench.md). ROW, SPAN and SHORT_SPAN
# fix what each float32 sum runs over, with the machine's vector width (AVX2: 8 float32 sums of a span,
# 64 elements each); nothing else in a result depends on them
# how each format's bits are read (the numba type chooses how _float and _dist read them)
_BITS: dict[torch.dtype, type] = {torch.bfloat16: np.int16, torch.float16: np.uint16, torch.float8_e4m3fn: np.uint8}
_BITS |= {torch.float8_e5m2: np.uint8, torch.float32: np.uint32, torch.float64: np.float64}
_LOCK = threading.Lock()
# numba's own thread pool, whose idle threads wait without spinning (numba would pick an OpenMP runtime where one
# is installed, and its threads spin after each pass, taking a core from the next pair's Python on a 2-core box:
# many small pairs compared 10-40% slower; benchmarks/many_pairs_bench.md). Set before the first parallel call.
numba.config.THREADING_LAYER = "workqueue"  # type: ignore[attr-defined]


def threads() -> int:
    """The threads one comparison on this thread runs on (numba's)."""
    return int(numba.get_num_threads())


def set_threads(n: int) -> None:
    """Run this thread's comparisons on ``n`` of numba's threads (at most ``NUMBA_NUM_THREADS``, the cores unless
    set; a Ray task: the CPUs it was given); results depend on none of it."""
    numba.set_num_threads(max(1, min(int(n), numba.config.NUMBA_NUM_THREADS)))  # type: ignore[attr-defined]


def _call(n: int, *args: Any) -> None:
    """:func:`_pass` over ``n`` elements on the calling thread for at most SMALL of them (waking numba's threads
    costs more than such a pass: 0.2 ms against 0.015 for one small pair on the 2-core dev box), else
    :func:`_pass_parallel`, one call at a time (the "workqueue" threading layer must not be entered from two
    threads at once, and a call already keeps every core busy), its units handed out one at a time. Both run the
    same code; results depend on none of it. The first call for a pair of dtypes runs under
    ``numba_cache.first_call``."""
    kernel = cast("Callable[..., None]", _pass if n <= SMALL else _pass_parallel)
    with first_call((kernel, args[0].dtype, args[1].dtype)):
        if n <= SMALL:
            kernel(*args)
            return
        with _LOCK, numba.parallel_chunksize(1):
            kernel(*args)


@functools.cache
def _table(dtype: torch.dtype) -> np.ndarray:
    """float32 bits of every bit pattern of a 16- or 8-bit float type (torch's conversion, exact)."""
    if dtype.itemsize > 2:
        return np.zeros(1, np.uint32)
    bits = np.arange(1 << (8 * dtype.itemsize), dtype=np.uint16).astype(np.int16 if dtype.itemsize == 2 else np.uint8)
    table: np.ndarray = torch.from_numpy(bits).view(dtype).float().numpy().view(np.uint32)
    return table


# ---------------------------------------------------------------- the kernels


def _float(x, table):  # pragma: no cover - numba's implementations follow
    """The value of the bits ``x`` of an element, by their type (see the module's docstring): float32,
    float64 for float64's."""
    raise NotImplementedError


@overload(_float)
def _float_of(x, table):
    if x == types.float64:
        return lambda x, table: x
    if x == types.int16:  # bfloat16: its bits shifted up by 16
        return lambda x, table: np.uint32(np.uint32(np.uint16(x)) << np.uint32(16)).view(np.float32)
    if x == types.uint32:
        return lambda x, table: np.uint32(x).view(np.float32)
    return lambda x, table: np.uint32(table[x]).view(np.float32)  # float16, float8: the table


@njit(cache=True)
def _ordinal(x, sign):
    """Bit pattern -> point on a monotonic integer line: x, or -(x without its sign bit) if that bit is set."""
    neg = x >> sign
    return ((x & ((1 << sign) - 1)) ^ -neg) + neg


def _dist(x, y):  # pragma: no cover - numba's implementations follow
    """The ULP distance of the bits ``x`` and ``y`` of two elements (:func:`_ordinal` of each), by their type:
    int64 for float32's, else int32 (numba would widen it to int64; in int32 the lanes loop vectorizes twice
    as wide: benchmarks/engine_bench.md)."""
    raise NotImplementedError


@overload(_dist)
def _dist_of(x, y):
    if x != y or x == types.float64:  # two formats, or float64: no ULP metrics
        return lambda x, y: np.int64(0)
    if x == types.uint32:
        return lambda x, y: abs(_ordinal(np.int64(x), 31) - _ordinal(np.int64(y), 31))
    sign = x.bitwidth - 1

    def narrow(x, y):  # bfloat16's int16 bits are read unsigned
        d = np.int32(_ordinal(np.int32(np.uint16(x)), sign) - _ordinal(np.int32(np.uint16(y)), sign))
        return np.int32(abs(d))

    return narrow


def _acc(x, y, v):  # pragma: no cover - numba's implementation follows
    """The value ``v`` of an element of a pair whose bits are typed as ``x`` and ``y``, as :func:`_lanes_of`
    sums it: float64 where a side is float16, float32 or float64 (or any format read through the table),
    whose squares have more bits than a float32 sum of many of them keeps (float16: 22; in float32 sums of
    256, a float16 tensor of one repeated value lost 2e-6 of its norm), else ``v`` (bfloat16, float8: 64
    squares of one binade add up exactly in float32)."""
    raise NotImplementedError


@overload(_acc)
def _acc_of(x, y, v):
    if x in (types.uint32, types.uint16, types.float64) or y in (types.uint32, types.uint16, types.float64):
        return lambda x, y, v: np.float64(v)
    return lambda x, y, v: v


def _values(x, table, out):  # pragma: no cover - numba's implementations follow
    """What :func:`_lanes` reads the values of the elements ``x`` from: ``x`` itself, or for float16 and
    float8 their float32 bits looked up in ``table`` into ``out`` (a loop of its own: in the fused loop
    the lookups would keep it from vectorizing)."""
    raise NotImplementedError


@overload(_values)
def _values_of(x, table, out):
    if x.dtype in (types.uint16, types.uint8):

        def looked_up(x, table, out):
            for j in range(x.size):
                out[j] = table[x[j]]
            return out

        return looked_up
    return lambda x, table, out: x


def _lanes_of(n: int, masked: bool) -> Callable[..., None]:
    """A kernel over ``n`` elements of xa, xb (their values read from va, vb: :func:`_values`): adds the
    float32 (:func:`_acc`) sums of a², b², d², |d|, a·d to f[0..4] and raises f[MAX32] to the largest float32 |d|;
    adds to ``cnt`` the counts of the tolerance test against the band's low and high tolerances, and raises
    cnt[2] to the largest ULP distance. ``masked``: positions not finite in both sides are left out of all of it,
    and counted into cnt[3..9] (not finite in a, in b, in either; NaN in a, in b; the same non-finite value in
    both, NaN or one infinity; the same infinity in both), as ``small.rows_of`` counts them. The sums stay in
    registers: numba's ``fastmath`` flag ``reassoc`` lets LLVM vectorize them across its lanes (the order is the
    compiled loop's, the same at every call on one machine), ``contract`` fuses each product into its sum. ``n``
    is a constant of the compiled loop: LLVM then vectorizes all of it, in half the time of a loop of any length."""

    @njit(cache=True, fastmath={"reassoc", "contract"})
    def lanes_of_n(va, vb, xa, xb, tol, f, cnt):
        a_lo, r_lo, a_hi, r_hi = np.float32(tol[2]), np.float32(tol[3]), np.float32(tol[4]), np.float32(tol[5])
        s_a2 = s_b2 = s_d2 = s_abs = s_ad = _acc(xa[0], xb[0], np.float32(0))
        top = n_lo = n_hi = np.int32(0)  # top: the bits of the largest |d| (they order as the values)
        nf_a = nf_b = out = nan_a = nan_b = same = inf_same = np.int32(0)
        top_ulp = zero = _dist(xa[0], xa[0])  # 0, of a type the distances fit
        for k in range(n):
            x, y = _float(va[k], va), _float(vb[k], vb)
            ok = True
            if masked:  # (a constant: the fast loop has none of it)
                # (& and |, not and and or: no branches, so the loop vectorizes)
                fin_x, fin_y, nan_x, nan_y = abs(x) < np.inf, abs(y) < np.inf, x != x, y != y
                ok = fin_x & fin_y
                both_inf = (not fin_x) & (x == y)  # (NaN equals nothing)
                nf_a, nf_b = np.int32(nf_a + np.int32(not fin_x)), np.int32(nf_b + np.int32(not fin_y))
                out, inf_same = np.int32(out + np.int32(not ok)), np.int32(inf_same + np.int32(both_inf))
                nan_a, nan_b = np.int32(nan_a + np.int32(nan_x)), np.int32(nan_b + np.int32(nan_y))
                same = np.int32(same + np.int32(both_inf | (nan_x & nan_y)))
                x = x if ok else np.float32(0)
                y = y if ok else np.float32(0)
            d = y - x
            ad, aa = abs(d), abs(x)
            sx, sy = _acc(xa[k], xb[k], x), _acc(xa[k], xb[k], y)
            sd = sy - sx
            s_a2 += sx * sx
            s_b2 += sy * sy
            s_d2 += sd * sd
            s_abs += abs(sd)
            s_ad += sx * sd
            top = max(top, np.float32(ad).view(np.int32))
            # int32 throughout: numba would widen. A float32 |d| of 0 is an exact 0, which passes whatever atol >= 0
            n_lo = np.int32(n_lo + np.int32(ok & (ad <= max(aa * r_lo + a_lo, np.float32(0)))))
            n_hi = np.int32(n_hi + np.int32(ok & (ad <= aa * r_hi + a_hi)))
            dist = _dist(xa[k], xb[k])
            top_ulp = max(top_ulp, dist if ok else zero)  # (not "else top_ulp": the loop would not vectorize)
        f[0], f[1], f[2], f[3], f[4] = f[0] + s_a2, f[1] + s_b2, f[2] + s_d2, f[3] + s_abs, f[4] + s_ad
        f[MAX32] = max(f[MAX32], np.float64(np.int32(top).view(np.float32)))
        cnt[0], cnt[1] = cnt[0] + n_lo, cnt[1] + n_hi
        cnt[2] = max(cnt[2], top_ulp)
        if masked:
            cnt[3], cnt[4], cnt[5], cnt[6] = cnt[3] + nf_a, cnt[4] + nf_b, cnt[5] + out, cnt[6] + nan_a
            cnt[7], cnt[8], cnt[9] = cnt[7] + nan_b, cnt[8] + same, cnt[9] + inf_same

    return lanes_of_n


_lanes = _lanes_of(SPAN, False)  # a whole row, SPAN elements at a time
_short_lanes = _lanes_of(SHORT_SPAN, False)  # a row cut short by an edge
_short_lanes_masked = _lanes_of(SHORT_SPAN, True)  # any row, NaN/Inf left out and counted


@njit(cache=True)
def _fine(f):
    """Whether a row's float32 sums of squares so far stay within float32's range: NaN/Inf make one NaN or large
    (NaN compares false)."""
    return f[0] <= SAFE_HI and f[1] <= SAFE_HI and f[2] <= SAFE_HI


@njit(cache=True)
def _spans(xa, xb, ta, tb, tol, cnt, scratch, pad_a, pad_b, f, masked):
    """A row in float32 (:func:`_lanes`, with ``masked`` :func:`_short_lanes_masked`): sums and largest |d| into f,
    counts into cnt; returns how many zeros it padded, or, not ``masked``, -1 as soon as a span leaves the sums past
    float32's range (NaN/Inf among its elements: the row is to be read masked). A row cut short by an edge is read
    in spans of SHORT_SPAN, its last part from ``pad_a``, ``pad_b`` with zeros after it (they add nothing but to
    the tolerance counts)."""
    m = xa.size
    f[:] = 0
    cnt[:] = 0
    va, vb = _values(xa, ta, scratch[0]), _values(xb, tb, scratch[1])
    if m == ROW and not masked:  # (a constant trip count: the loop LLVM unrolls)
        for p in range(0, ROW, SPAN):
            _lanes(va[p : p + SPAN], vb[p : p + SPAN], xa[p : p + SPAN], xb[p : p + SPAN], tol, f, cnt)
            if not _fine(f):
                return -1
        return 0
    whole = m - m % SHORT_SPAN  # spans of SHORT_SPAN (a row cut short by an edge: the last with zeros after it)
    for p in range(0, whole + SHORT_SPAN * (whole < m), SHORT_SPAN):
        q = p + SHORT_SPAN
        ya, yb, wa, wb = va[p:q], vb[p:q], xa[p:q], xb[p:q]
        if p == whole:  # element by element: a slice assignment compiles numba's shape-error messages
            for j in range(SHORT_SPAN):
                pad_a[j], pad_b[j] = (xa[whole + j], xb[whole + j]) if whole + j < m else (0, 0)
            ya, yb, wa, wb = _values(pad_a, ta, scratch[0]), _values(pad_b, tb, scratch[1]), pad_a, pad_b
        if masked:
            _short_lanes_masked(ya, yb, wa, wb, tol, f, cnt)
        else:
            _short_lanes(ya, yb, wa, wb, tol, f, cnt)
        if not (masked or _fine(f)):
            return -1
    return whole + SHORT_SPAN - m if whole < m else 0


@njit(cache=True)
def _fast(xa, xb, ta, tb, ulp, tol, cnt, scratch, pad_a, pad_b, f, c):
    """A row in float32 (:func:`_spans`): sums and largest |d| into f, counts into c. A row whose sums come out past
    float32's range (NaN/Inf among its elements) is read again from its start with NaN/Inf left out and counted. A
    row float32 cannot decide is marked, f[MAX32] = -1, for :func:`_redo`."""
    for masked in (False, True):  # (one call site: numba and LLVM compile _spans into _fast once)
        pad = _spans(xa, xb, ta, tb, tol, cnt, scratch, pad_a, pad_b, f, masked)
        if pad >= 0:
            break
    top = f[MAX32]
    # zeros padded in pass when 0 <= the low (high) atol; equal counts are float64's count
    n_lo, n_hi = cnt[0] - pad * int(0 <= np.float32(tol[2])), cnt[1] - pad * int(0 <= np.float32(tol[4]))
    # squares past float32's range, or tiny ones, which lose precision
    safe = SAFE_LO <= f[0] <= SAFE_HI and SAFE_LO <= f[1] <= SAFE_HI and (SAFE_LO <= f[2] <= SAFE_HI or top == 0)
    if not safe or tol[6] == 0 or n_lo != n_hi:
        f[MAX32] = -1.0
        return
    f[MAX_EXACT] = top  # exact, or below the pair's largest |d| unless it is the pair's largest float32 (_redo)
    out, same = cnt[5], cnt[8]  # (0 and 0 unless masked)
    c[0], c[1], c[2], c[3], c[4], c[5] = xa.size - out, n_lo + same, cnt[3], cnt[4], out - same, cnt[2] if ulp else 0
    c[6], c[7], c[8] = cnt[6], cnt[7], cnt[9]


@njit(cache=True, nogil=True)
def _unit(xa, xb, ta, tb, ulp, starts, units, tol, part_f, part_i, u):
    """The partials of every row (row i: elements starts[i] .. starts[i+1]; its f: a², b², d², |d|, a·d,
    exact max |d|, float32 max |d|; its c: both, passed, non-finite a, b, mismatched, max ULP, NaN in a, in b,
    the same infinity in both), for unit u of rows units[u] .. units[u+1]."""
    cnt, scratch = np.empty(10, np.int64), np.empty((2, ROW), np.uint32)
    pad_a, pad_b = np.empty(SHORT_SPAN, xa.dtype), np.empty(SHORT_SPAN, xb.dtype)
    for row in range(units[u], units[u + 1]):
        ya, yb = xa[starts[row] : starts[row + 1]], xb[starts[row] : starts[row + 1]]
        f, c = part_f[row], part_i[row]
        _fast(ya, yb, ta, tb, ulp, tol, cnt, scratch, pad_a, pad_b, f, c)


@njit(cache=True, nogil=True)
def _pass(xa, xb, ta, tb, ulp, starts, units, tol, part_f, part_i):
    """:func:`_unit` of every unit of rows units[0] .. units[-1]."""
    for u in range(len(units) - 1):
        _unit(xa, xb, ta, tb, ulp, starts, units, tol, part_f, part_i, u)


@njit(parallel=True, cache=True, nogil=True)
def _pass_parallel(xa, xb, ta, tb, ulp, starts, units, tol, part_f, part_i):
    """:func:`_pass` on numba's threads, a unit a prange iteration. Its parfor lowering compiles :func:`_unit`
    again (about 1.5 s of the first compile on the 2-core dev box); a pool of Python threads calling :func:`_pass`
    compiles nothing more but ran 16 Mi-element pairs at half the GB/s on 16 cores (``cpu_ab.py`` on the H100
    host: 16-18 GB/s against 35, one piece a thread 30; 4 Mi: 11 against 22)."""
    for u in prange(len(units) - 1):
        _unit(xa, xb, ta, tb, ulp, starts, units, tol, part_f, part_i, u)


# ---------------------------------------------------------------- the passes over pairs


class _Format(NamedTuple):
    """How a pair of dtypes ``a`` and ``b`` is read: with ULP metrics or not; ``mixed``: two formats, whose
    16-bit sides are read through their table (:func:`_bits`)."""

    a: torch.dtype
    b: torch.dtype
    ulp: bool
    mixed: bool


@functools.lru_cache(maxsize=64)
def _format(dtype_a: torch.dtype, dtype_b: torch.dtype) -> _Format:
    """Each side is read as it is stored, never converted. ULP metrics: one format, not float64."""
    return _Format(dtype_a, dtype_b, ulp_spec(dtype_a, dtype_b) is not None, dtype_a != dtype_b)


@functools.lru_cache(maxsize=64)
def _tolerances(atol: float, rtol: float) -> np.ndarray:
    """``common.tolerances``, and whether the band is used, as the kernels read them."""
    values, band = tolerances(atol, rtol)
    return np.array([*values, band])


def _bits(t: torch.Tensor, mixed: bool) -> np.ndarray:
    """The elements of ``t`` (flattened) as the pass reads them: their bits, typed by :data:`_BITS` (in a
    pair of two formats every 16-bit format as float16's uint16, read through its table: the kernels are
    compiled for fewer pairs of types); copied only where they are not one dense run (``small.stored``)."""
    return stored(t)[0].view(np.uint16 if mixed and t.dtype.itemsize == 2 else _BITS[t.dtype])


def _float64(bits: np.ndarray, dtype: torch.dtype) -> np.ndarray:
    """The float64 values of elements read as :func:`_bits` gives them: ``small.values`` of their storage form."""
    name = dtype_name(dtype)
    return values(bits.view(STORAGE[name]), name)


def _redo(xa: np.ndarray, xb: np.ndarray, form: _Format, atol: float, rtol: float, starts: np.ndarray,
          part_f: np.ndarray, part_i: np.ndarray, first: np.ndarray) -> None:  # fmt: skip
    """Rows read again by ``small.rows_of``, the float64 definition, their partials replaced: the rows float32 did
    not decide (f[MAX32] -1: squares past float32's comfortable range, a tolerance count the band does not
    settle), and the rows holding a pair's largest float32 |d| (pair p: rows first[p] .. first[p+1]) whose
    float32 differences may be inexact (``common.exact_ulp``), whose exact largest |d| alone is replaced. Float32
    rounding is monotonic, so a pair's exact largest |d| is in a row whose float32 largest is the pair's, and every
    other row's float32 largest is below it. Rows are read :data:`GROUP` at a time."""
    mine = part_f[:, MAX32]
    top32 = np.maximum.reduceat(mine, first[:-1])[np.repeat(np.arange(len(first) - 1), np.diff(first))]
    inexact = part_i[:, MAX_ULP] > (exact_ulp(form.a) if form.ulp else -1)
    undecided = mine < 0
    redo = np.flatnonzero(undecided | ((mine == top32) & (mine > 0) & inexact))
    for at in range(0, len(redo), GROUP):
        rows = redo[at : at + GROUP]
        n = starts[rows + 1] - starts[rows]
        begin = np.cumsum(n) - n
        idx = np.repeat(starts[rows] - begin, n) + np.arange(n.sum())
        ya, yb = xa[idx], xb[idx]
        dist = np.abs(ordinals(ya) - ordinals(yb)) if form.ulp else None
        got_f, got_i = rows_of(_float64(ya, form.a), _float64(yb, form.b), dist, atol, rtol, np.append(begin, n.sum()))
        part_f[rows, MAX_EXACT] = got_f[:, MAX_EXACT]
        whole = undecided[rows]  # (a row read again for its largest |d| alone keeps its sums: a range's bits)
        part_f[rows[whole], :MAX_EXACT], part_i[rows[whole]] = got_f[whole, :MAX_EXACT], got_i[whole]


class _Run(NamedTuple):
    """What :func:`_run` returns: the rows of partials (``[rows, 7]``, see _unit); per pair its sums, its exact
    largest |d| and the int columns of its rows added (``[pairs, 9]``, as a row's: the largest ULP distance the
    largest of its rows'); the block d² and a² (``small.add_up``)."""

    rows: np.ndarray
    sums: np.ndarray
    tops: np.ndarray
    ints: np.ndarray
    blocks: np.ndarray


def _run(
    xa: np.ndarray, xb: np.ndarray, form: _Format, atol: float, rtol: float,
    starts: np.ndarray, units: np.ndarray, first: np.ndarray, owner: np.ndarray, n_blocks: int,
) -> _Run:  # fmt: skip
    """The pass over pairs laid end to end in ``xa``, ``xb`` (read as ``form``), and its totals: row i is elements
    starts[i] .. starts[i+1] (the last start: the end), unit u rows units[u] ..
    units[u+1], pair p rows first[p] .. first[p+1]; row i's d² and a² go to edge block owner[i] of ``n_blocks``."""
    rows = len(starts) - 1
    part_f, part_i = np.empty((rows, 7)), np.empty((rows, 9), np.int64)
    args = (xa, xb, _table(form.a), _table(form.b), form.ulp, starts, units, _tolerances(atol, rtol))
    _call(int(starts[-1]), *args, part_f, part_i)
    _redo(xa, xb, form, atol, rtol, starts, part_f, part_i, first)
    return _Run(part_f, *add_up(part_f, part_i, first, owner, n_blocks))


def _one(xa: np.ndarray, xb: np.ndarray, form: _Format, atol: float, rtol: float,
         edges: tuple[int, ...], start: int) -> _Run:  # fmt: skip
    """:func:`_run` over elements ``start ..`` of one pair (``edges``: the whole pair's), GROUP rows a unit."""
    starts, owner = plan(edges, start, xa.size)
    rows = len(owner)
    units = np.append(np.arange(0, rows, GROUP), rows)
    return _run(xa, xb, form, atol, rtol, starts, units, np.array([0, rows]), owner, len(edges) - 1)


def cpu_totals(
    a: torch.Tensor, b: torch.Tensor, *, atol: float, rtol: float, chunk_elems: int = 1 << 22, edges: Sequence[int] = ()
) -> Totals:
    """The totals of ``a`` against ``b``, both float dtypes on the CPU (``edges``: see ``common.Totals``).
    A contiguous pair is read whole; one that is not in contiguous copies of pieces of ``chunk_elems``
    (``reference.chunk_pairs``), each with rows of its own, whose sums are added in float64."""
    edges = tuple(edges) or (0, a.numel())
    form = _format(a.dtype, b.dtype)
    sums, blocks = np.zeros((1, 5)), np.zeros((2, len(edges) - 1))
    pieces, max_abs, start = [np.zeros((1, 9), np.int64)], 0.0, 0  # (a zero row: an empty pair's int columns)
    whole = a.is_contiguous() and b.is_contiguous()
    for ca, cb in chunk_pairs(a, b, max(1, a.numel()) if whole else chunk_elems):
        got = _one(_bits(ca, form.mixed), _bits(cb, form.mixed), form, atol, rtol, edges, start)
        start += ca.numel()
        sums += got.sums
        blocks += got.blocks
        pieces.append(got.ints)
        max_abs = max(max_abs, got.tops[0])
    ints = add_ints(np.concatenate(pieces), np.array([0, len(pieces)]))
    one = pair_totals([a.numel()], [form.ulp], sums, np.array([max_abs]), ints, blocks, np.array([0, blocks.shape[1]]))
    return one[0]


def cpu_totals_many(
    pairs: Sequence[tuple[torch.Tensor, torch.Tensor, Sequence[int]]], *, atol: float, rtol: float
) -> list[Totals]:
    """:func:`cpu_totals` of each pair ``(a, b, edges)``, bit for bit, in one run of the kernels over all of
    them, a pair a unit: for many small pairs, where the calls, not the elements, cost. Every pair has the
    dtypes of the first and is ``backends.batchable``; the bytes are copied side by side."""
    if not pairs:
        return []
    form = _format(pairs[0][0].dtype, pairs[0][1].dtype)
    starts, owner, first, edge_at = lay_out([(a.numel(), e) for a, _, e in pairs])
    xa = _bits(_end_to_end([a for a, _, _ in pairs]), form.mixed)
    xb = _bits(_end_to_end([b for _, b, _ in pairs]), form.mixed)
    got = _run(xa, xb, form, atol, rtol, starts, first, first, owner, int(edge_at[-1]))
    numels = [a.numel() for a, _, _ in pairs]
    return pair_totals(numels, [form.ulp] * len(pairs), got.sums, got.tops, got.ints, got.blocks, edge_at)


def _end_to_end(ts: list[torch.Tensor]) -> torch.Tensor:
    """The elements of the (contiguous) tensors one after another, flat: a view of the memory they lie in when
    they already lie so inside the first one's storage (a batch of stored tensors read side by side:
    ``runs.reassembly.materialize_many``), else a copy."""
    first, storage = ts[0], ts[0].untyped_storage()
    at = list(itertools.accumulate((t.nbytes for t in ts), initial=first.data_ptr()))  # where each would begin
    adjacent = all(t.data_ptr() == p and t.dtype == first.dtype for t, p in zip(ts, at))
    if adjacent and at[-1] <= storage.data_ptr() + storage.nbytes():
        return first.as_strided((sum(t.numel() for t in ts),), (1,))
    return torch.cat([t.reshape(-1) for t in ts])


# ---------------------------------------------------------------- ranges of a pair (validator.numerics.ranges)


def cpu_range_rows(
    a: torch.Tensor, b: torch.Tensor, *, atol: float, rtol: float, edges: Sequence[int], start: int
) -> tuple[np.ndarray, np.ndarray, float, int | None, tuple[int, int, int]]:
    """The pass of :func:`cpu_totals` over elements ``start .. start + n`` of a pair (``a``, ``b``: those
    ``n > 0`` elements, row-major; ``edges``: the whole pair's), before anything is added across rows: (the
    rows of partials a², b², d², |d|, a·d, ``[rows, 5]``; the five counts; the exact largest |d|; the largest
    ULP distance, None without ULP metrics; NaN in a, in b, the same infinity in both). ``start`` must be the
    first element of one of the whole pair's rows (a block edge, or an edge plus a multiple of :data:`ROW`): the
    rows are then the whole pair's, bit for bit. A whole pair of at most ``small.NUMPY_MAX`` elements has the rows of
    ``small.py``, as it has measured whole."""
    if edges[-1] <= NUMPY_MAX:  # small.py's rows (they start where the whole pair's do)
        x, y, dist = read(a, b)
        rows, rows_i = rows_of(x, y, dist, atol, rtol, plan(tuple(edges), start, a.numel())[0])
        ints, max_abs, ulp = add_ints(rows_i, np.array([0, len(rows_i)]))[0], rows[:, MAX_EXACT].max(), dist is not None
    else:
        form = _format(a.dtype, b.dtype)
        got = _one(_bits(a, form.mixed), _bits(b, form.mixed), form, atol, rtol, tuple(edges), start)
        rows, ints, max_abs, ulp = got.rows, got.ints[0], got.tops[0], form.ulp
    nan_a, nan_b, inf_same = ints[NAN_A:].tolist()
    max_ulp = int(ints[MAX_ULP]) if ulp else None
    return np.ascontiguousarray(rows[:, :5]), ints[:MAX_ULP], float(max_abs), max_ulp, (nan_a, nan_b, inf_same)


def row_plan(edges: Sequence[int], numel: int) -> tuple[np.ndarray, np.ndarray]:
    """(starts, owner) of the rows :func:`cpu_totals` lays over a contiguous pair of ``numel`` elements."""
    return plan(tuple(edges), 0, numel)
