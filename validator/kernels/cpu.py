"""The CPU path: the native one-pass kernel run on chunks by every core.

Each pair is split into chunks of :data:`CHUNK` elements (views of contiguous inputs, never copies;
non-contiguous inputs are copied a bounded block at a time). A pool of threads, one per core, pulls
chunks from a shared queue; each thread adds into its own float64/int64 accumulator and its own
exact ULP histograms, and the per-thread totals are combined at the end. ctypes releases the GIL for
the duration of each kernel call, so the threads run in parallel.

Large same-dtype pairs (ULP metrics, at least :data:`WINDOW_FROM` elements, contiguous) find their
exact p99 with the speculative window of ``_finish.p99_window`` instead of full histograms:

- a sample pass reads runs of :data:`SAMPLE_RUN` elements, one in every :data:`SAMPLE_GAP` (1 element
  in ``SAMPLE_STRIDE``, spread evenly over the whole pair; pairs of more than 2**24 elements sample
  about :data:`SAMPLE_MAX` elements, one run in a longer gap, :func:`sample_gap`) and histograms their
  distances;
- ``p99_window`` turns that into a window of distances (float32 windows wider than 65536 bins, or
  too wide for the rule, become windows of 65536-wide buckets);
- the one full pass adds the sums as before and, for the ULP metrics, the max distance, the exact
  count below the window and an exact histogram of the window (for a bucket window also the list of
  its exact distances), all but the rare in-window elements in vector code;
- ``p99_in_window`` gives the exact p99. When the p99 is outside the window, a second pass with the
  full histograms gives it, so the result is exact in every case.

Both passes of the window run on the C library's own pool of threads (``pool_run`` in
``_cpu_kernel.c``): one ctypes call per pass, each thread taking its jobs from a counter in C, so Python
costs nothing per thread or per job (waking Python workers cost more than a small pass on a many-core
virtual machine; docs/performance.md, "CPU kernel").

``stats`` counts which route each pair took (for tests and benchmarks).
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import torch

from .. import metrics as _ref
from ._finish import (
    FINE_BINS,
    SAMPLE_STRIDE,
    ULP_DTYPES,
    first_reaching,
    metrics_from_totals,
    nearest_rank,
    p99_in_window,
    p99_window,
)
from ._native import Acc, Sampler, Win, library

__all__ = [
    "compare_cpu",
    "CHUNK",
    "WINDOW_FROM",
    "SAMPLE_RUN",
    "SAMPLE_GAP",
    "SAMPLE_MAX",
    "sample_gap",
    "sample_mask",
    "set_threads",
    "stats",
    "threads",
]

CHUNK = 1 << 20  # elements per kernel call: large enough that the call overhead vanishes
_SERIAL_BELOW = 1 << 18  # pairs smaller than this run in the calling thread

WINDOW_FROM = 1 << 20  # pairs with ULP metrics from this many elements take the speculative p99 window
SAMPLE_RUN = 256  # sampled elements are runs of this many, one run in every SAMPLE_GAP elements
SAMPLE_GAP = SAMPLE_RUN * SAMPLE_STRIDE  # (the run's offset in its gap varies pseudo-randomly)
# Larger pairs sample about this many elements, not 1 in SAMPLE_STRIDE: a run costs a memory latency
# more than its bytes, so on a server a sample of 1 in 64 took a third of a 2**26-element call.
SAMPLE_MAX = 1 << 18
_SAMPLE_JOB = 8 * CHUNK  # elements per sample-pass job, at most (fewer: every thread gets several)
_SAMPLE_PER_THREAD = 1 << 15  # sampled elements per sampling thread, at least
_MAIN_JOB = 1 << 18  # elements per job of the windowed pass (taken in C: no Python per job)
_KEEP_WINDOW = 1 << 16  # window histograms up to this many bins stay with their thread between pairs
_WIDE_WINDOW = 1 << 16  # float32 windows wider than this become windows of 65536-wide buckets
_LIST_MIN = 1 << 21  # float32 bucket windows list their in-window distances: at most max(this, n/32)

# Which route the pairs took, since the process started (read by tests and benchmarks):
# "full": the full histograms (no window tried or found); "window": the p99 came from the window;
# "coarse": of those, a float32 window of 65536-wide buckets; "refine": of those, the list was
# incomplete and a second pass over the data refined the bucket; "fallback": the p99 was outside the
# window and a second pass with the full histograms found it.
stats: dict[str, int] = {"full": 0, "window": 0, "coarse": 0, "refine": 0, "fallback": 0}
last_window: tuple[int, int, int] | None = None  # (lo, hi, shift) of the latest window (diagnostics)
_stats_lock = threading.Lock()


def _zeros(n: int) -> torch.Tensor:
    """int64 zeros, filled in this thread: ``torch.zeros`` of this size wakes torch's intra-op threads,
    which then compete for the cores with the kernel's pool."""
    t = torch.empty(n, dtype=torch.int64)
    ctypes.memset(t.data_ptr(), 0, 8 * n)
    return t


def _count(*keys: str) -> None:
    with _stats_lock:
        for k in keys:
            stats[k] += 1


_DT: dict[torch.dtype, int] = {
    torch.float64: 0,
    torch.float32: 1,
    torch.float16: 2,
    torch.bfloat16: 3,
    torch.float8_e4m3fn: 4,
    torch.float8_e5m2: 5,
}

_pool_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_threads: int | None = None


def threads() -> int:
    """Worker threads used for one pair: ``set_threads``, else ``$VALIDATOR_THREADS``, else the cores."""
    if _threads is not None:
        return _threads
    env = os.environ.get("VALIDATOR_THREADS")
    if env:
        return max(1, int(env))
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def set_threads(n: int | None) -> None:
    """Set (or with ``None`` reset) the number of worker threads."""
    global _threads, _pool
    with _pool_lock:
        _threads = None if n is None else max(1, int(n))
        old, _pool = _pool, None
    if old is not None:
        old.shutdown(wait=False)


def _executor() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=threads(), thread_name_prefix="validator-kernel")
        return _pool


def _pieces(a: torch.Tensor, b: torch.Tensor, chunk_elems: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """1-D pieces of a and b in row-major order (each made contiguous by the worker that takes it)."""
    if a.is_contiguous() and b.is_contiguous():
        fa, fb = a.reshape(-1), b.reshape(-1)
        for start in range(0, fa.numel(), CHUNK):
            yield fa[start : start + CHUNK], fb[start : start + CHUNK]
    else:  # the reference's row-block walk bounds every copy by chunk_elems
        yield from _ref._chunk_pairs(a, b, max(1, min(chunk_elems, CHUNK)))


class _Worker:
    """One thread's accumulator and histograms. Kept between calls: fresh 512 KiB buffers would be
    page-faulted in on every call, which costs more than a small pair's whole comparison."""

    def __init__(self) -> None:
        self.acc = Acc()
        self.fine: torch.Tensor | None = None
        self.coarse: torch.Tensor | None = None
        self.low: torch.Tensor | None = None
        self.win = Win()
        self.window: torch.Tensor | None = None  # the p99 window's histogram (grown as needed, kept)
        self.list: torch.Tensor | None = None  # in-window distances of a float32 bucket window (one pair)
        self.used = [FINE_BINS + 1, FINE_BINS + 1]  # leading bins of fine, coarse that may be nonzero

    def reset(self, ulp: bool, coarse: bool) -> None:
        """Zero everything for a new pair (run in the worker's own thread, so in parallel)."""
        ctypes.memset(ctypes.byref(self.acc), 0, ctypes.sizeof(self.acc))
        for name, wanted in (("fine", ulp), ("coarse", coarse)):
            buf = getattr(self, name)
            if not wanted:
                continue
            if buf is None:
                setattr(self, name, torch.zeros(FINE_BINS + 1, dtype=torch.int64))
            else:  # not buf.zero_(): torch's intra-op threads cost milliseconds on a busy machine
                ctypes.memset(buf.data_ptr(), 0, buf.numel() * buf.element_size())
        self.used = [FINE_BINS + 1, FINE_BINS + 1]  # a full pass may fill any bin

    def sample_buffers(self, coarse: bool) -> tuple[int, int]:
        """The histograms for the sample pass, made if missing, and how many leading bins of each the
        kernel must zero: only those the last use may have filled (a sample's distances are few;
        clearing 2 x 512 KiB per thread would cost more than sampling them)."""
        clear = [0, 0]
        for i, (name, wanted) in enumerate((("fine", True), ("coarse", coarse))):
            if not wanted:
                continue
            if getattr(self, name) is None:
                setattr(self, name, torch.zeros(FINE_BINS + 1, dtype=torch.int64))
                self.used[i] = 0
            clear[i] = min(self.used[i], FINE_BINS if i == 0 else FINE_BINS + 1)  # fine's overflow bin: always
            self.used[i] = FINE_BINS + 1  # until the sample pass says how far it went
        return clear[0], clear[1]

    def mark_sampled(self, maxd: int, coarse: bool) -> None:
        """After the sample pass: its largest distance bounds the bins it filled (the coarse histogram's
        only when the sample used it)."""
        self.used[0] = min(maxd, FINE_BINS - 1) + 1
        if coarse:
            self.used[1] = (maxd >> 16) + 1


_idle_lock = threading.Lock()
_idle: list[_Worker] = []


def _take_workers(n: int) -> list[_Worker]:
    with _idle_lock:
        got = [_idle.pop() for _ in range(min(n, len(_idle)))]
    return got + [_Worker() for _ in range(n - len(got))]


def _give_back(workers: list[_Worker]) -> None:
    with _idle_lock:
        if len(_idle) < 4 * threads():
            _idle.extend(workers)


def _run(
    lib: ctypes.CDLL,
    jobs: Iterator[tuple[torch.Tensor, torch.Tensor]],
    lock: threading.Lock,
    w: _Worker,
    atol: float,
    rtol: float,
    force_masked: bool,
    ulp: bool,
    coarse_hist: bool,
) -> None:
    w.reset(ulp, coarse_hist)
    fine = w.fine.data_ptr() if ulp and w.fine is not None else None
    coarse = w.coarse.data_ptr() if coarse_hist and w.coarse is not None else None
    while True:
        with lock:
            job = next(jobs, None)
        if job is None:
            return
        ca, cb = job[0].contiguous(), job[1].contiguous()
        rc = lib.vk_compare(
            ca.data_ptr(), _DT[ca.dtype], cb.data_ptr(), _DT[cb.dtype], ca.numel(),
            atol, rtol, ctypes.byref(w.acc), fine, coarse, int(force_masked),
        )  # fmt: skip
        if rc != 0:
            raise RuntimeError(f"native kernel refused dtypes {ca.dtype}, {cb.dtype}")


def _parallel(fn, jobs: Iterator, workers: list[_Worker]) -> None:  # type: ignore[no-untyped-def,type-arg]
    lock = threading.Lock()
    if len(workers) == 1:
        fn(jobs, lock, workers[0])
        return
    futures = [_executor().submit(fn, jobs, lock, w) for w in workers]
    for f in futures:
        f.result()


def supports(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.device.type == "cpu"
        and b.device.type == "cpu"
        and a.dtype in _DT
        and b.dtype in _DT
        and not (a.is_neg() or b.is_neg())
    )


def compare_cpu(
    a: torch.Tensor, b: torch.Tensor, *, atol: float, rtol: float, chunk_elems: int, force_masked: bool = False
) -> _ref.TensorMetrics | None:
    """Metrics of CPU tensors ``a``, ``b`` (inputs already checked), or ``None`` when unsupported."""
    if not supports(a, b):
        return None
    lib = library()
    if lib is None:
        return None
    a, b = a.detach(), b.detach()
    n = a.numel()
    ulp = a.dtype == b.dtype and a.dtype in ULP_DTYPES
    coarse = ulp and a.dtype == torch.float32
    nworkers = 1 if n < _SERIAL_BELOW else max(1, min(threads(), -(-n // CHUNK)))
    workers = _take_workers(nworkers)
    try:
        return _compare(lib, a, b, workers, atol, rtol, chunk_elems, force_masked, ulp, coarse)
    finally:
        _give_back(workers)


def _compare(
    lib: ctypes.CDLL,
    a: torch.Tensor,
    b: torch.Tensor,
    workers: list[_Worker],
    atol: float,
    rtol: float,
    chunk_elems: int,
    force_masked: bool,
    ulp: bool,
    coarse: bool,
) -> _ref.TensorMetrics:
    plan = None
    if ulp and a.numel() >= WINDOW_FROM and a.is_contiguous() and b.is_contiguous():
        plan = _sample_window(lib, a, b, workers, coarse)
    if plan is not None:
        p99 = _compare_windowed(lib, a, b, workers, atol, rtol, force_masked, plan)
        sums, max_ad, counts, max_ulp = _totals(workers)
        if p99 is None:  # the sample misled us: the full histograms, in a second pass
            _count("fallback")
            _full_pass(lib, a, b, workers, atol, rtol, chunk_elems, force_masked, coarse)
            p99 = _p99(lib, a, b, workers, counts[0], chunk_elems)
        return metrics_from_totals(a, b, atol, rtol, sums, max_ad, counts, (max_ulp, p99))

    _full_pass(lib, a, b, workers, atol, rtol, chunk_elems, force_masked, coarse if ulp else False, ulp)
    sums, max_ad, counts, max_ulp = _totals(workers)
    ulp_result = None
    if ulp:
        _count("full")
        ulp_result = (max_ulp, _p99(lib, a, b, workers, counts[0], chunk_elems))
    return metrics_from_totals(a, b, atol, rtol, sums, max_ad, counts, ulp_result)


def _full_pass(
    lib: ctypes.CDLL,
    a: torch.Tensor,
    b: torch.Tensor,
    workers: list[_Worker],
    atol: float,
    rtol: float,
    chunk_elems: int,
    force_masked: bool,
    coarse: bool,
    ulp: bool = True,
) -> None:
    """The one pass of the full-histogram method: the totals and, with ``ulp``, the exact histograms."""

    def body(jobs: Iterator, lock: threading.Lock, w: _Worker) -> None:  # type: ignore[type-arg]
        _run(lib, jobs, lock, w, float(atol), float(rtol), force_masked, ulp, coarse)

    _parallel(body, _pieces(a, b, chunk_elems), workers)


def _totals(workers: list[_Worker]) -> tuple[list[float], float, list[int], int]:
    """The workers' totals combined in a fixed order: sums, max |d|, counts, max ULP."""
    accs = [w.acc for w in workers]
    sums = [sum(getattr(x, f) for x in accs) for f in ("s_aa", "s_bb", "s_ab", "s_dd", "s_ad")]
    counts = [
        sum(x.n_both for x in accs),
        sum(x.n_pass for x in accs),
        sum(x.nf_a for x in accs),
        sum(x.nf_b for x in accs),
        sum(x.mismatch for x in accs),
    ]
    return sums, max(x.max_ad for x in accs), counts, max(x.max_ulp for x in accs)


# ---------------------------------------------------------------- the speculative p99 window


def sample_gap(n: int) -> int:
    """The gap between the starts of sampled runs for an ``n``-element pair: :data:`SAMPLE_GAP`, or
    that times the smallest power of two that keeps the sample at about :data:`SAMPLE_MAX` elements."""
    gap = SAMPLE_GAP
    while n // gap * SAMPLE_RUN > SAMPLE_MAX:
        gap *= 2
    return gap


def sample_mask(n: int) -> torch.Tensor:
    """Which elements of an ``n``-element pair the sample pass reads (bool; for tests and diagnostics)."""
    mask = torch.zeros(n, dtype=torch.bool)
    lib = library()
    if lib is None or n == 0:
        return mask
    gap = sample_gap(n)
    starts = torch.empty(-(-n // gap), dtype=torch.int64)
    lib.vk_sample_starts(n, SAMPLE_RUN, gap, starts.data_ptr())
    for s in starts.tolist():
        mask[s : s + SAMPLE_RUN] = True
    return mask


def _sample_window(
    lib: ctypes.CDLL, a: torch.Tensor, b: torch.Tensor, workers: list[_Worker], coarse: bool
) -> tuple[int, int, int, int] | None:
    """The sample pass. Returns the window ``(lo, hi, shift, list_cap)``: keys ``distance >> shift``
    in ``[lo, hi)``; ``list_cap`` > 0 (bucket windows only): list up to that many in-window distances
    per thread. ``None``: no window (the full histograms then)."""
    n, dt = a.numel(), _DT[a.dtype]
    gap = sample_gap(n)
    # a thread for every _SAMPLE_PER_THREAD sampled elements: the runs' memory latencies overlap, the
    # histograms to clear and add up stay few
    sampling = workers[: max(1, min(len(workers), n // gap * SAMPLE_RUN // _SAMPLE_PER_THREAD))]
    job = max(gap, min(_SAMPLE_JOB, n // (4 * len(sampling)) // gap * gap))
    team = (Sampler * len(sampling))()
    for slot, w in zip(team, sampling):
        slot.clear_fine, slot.clear_coarse = w.sample_buffers(coarse)
        assert w.fine is not None
        slot.fine = w.fine.data_ptr()
        slot.coarse = w.coarse.data_ptr() if coarse and w.coarse is not None else None
    # one call: the threads are started and the histograms added up in C (no Python per thread)
    n_sample = lib.vk_sample_par(a.data_ptr(), b.data_ptr(), dt, n, job, SAMPLE_RUN, gap, team, len(sampling))
    if n_sample < 0:
        raise RuntimeError(f"native kernel refused to sample {a.dtype}")
    for slot, w in zip(team, sampling):  # the bins each thread's histograms may hold (the first: the sum)
        w.mark_sampled(slot.maxd, coarse)
    fine, hist_coarse = sampling[0].fine, sampling[0].coarse if coarse else None
    assert fine is not None
    top = team[0].maxd  # below the fine range's end: the bins past it are zero, the overflow bin too
    win = p99_window(fine, hist_coarse, n_sample, top + 1 if top < FINE_BINS else None)
    if win is not None and (hist_coarse is None or win[1] - win[0] <= _WIDE_WINDOW):
        return win[0], win[1], 0, 0
    if hist_coarse is None:
        return None
    # float32 with a wide spread: a window of 65536-wide buckets (keys ``distance >> 16``), either the
    # one that covers the wide window, or the same rule applied to the sample's ``distance >> 16`` (whose
    # p99 is the p99's bucket). The exact distance inside the p99's bucket then comes from a list of the
    # in-window distances (or, when that would be too long, a refining pass over the data).
    if win is not None:
        lo, hi = win[0] >> 16, ((win[1] - 1) >> 16) + 1
    else:
        win = p99_window(hist_coarse, None, n_sample)
        if win is None:
            return None
        lo, hi = win
    expected = int(hist_coarse[lo:hi].sum()) * n // max(1, n_sample)
    budget = max(_LIST_MIN, n >> 5)
    cap = 2 * budget // len(workers) if 2 * expected <= budget else 0
    return lo, hi, 16, cap


def _compare_windowed(
    lib: ctypes.CDLL,
    a: torch.Tensor,
    b: torch.Tensor,
    workers: list[_Worker],
    atol: float,
    rtol: float,
    force_masked: bool,
    plan: tuple[int, int, int, int],
) -> int | None:
    """The main pass with the window; returns the exact p99, or ``None`` when it is outside the window."""
    global last_window
    lo, hi, shift, cap = plan
    last_window = lo, hi, shift
    width = hi - lo
    dt = _DT[a.dtype]
    atol, rtol = float(atol), float(rtol)

    n = a.numel()
    accs, wins = (Acc * len(workers))(), (Win * len(workers))()  # zeroed
    for w, acc, win in zip(workers, accs, wins):
        if w.window is None or w.window.numel() < width:  # (its first width bins are zeroed by its thread)
            w.window = torch.empty(max(width, 1 << 12), dtype=torch.int64)
        w.list = torch.empty(cap, dtype=torch.int32) if cap else None  # pages fault in only when written
        win.lo, win.width, win.shift = lo, width, shift
        win.window = w.window.data_ptr()
        win.list = w.list.data_ptr() if w.list is not None else None
        win.cap = cap
        w.acc, w.win = acc, win

    try:
        # one call: the pool's threads, no Python per thread (vk_compare_win_par in _cpu_kernel.c)
        rc = lib.vk_compare_win_par(
            a.data_ptr(), b.data_ptr(), dt, n, _MAIN_JOB, atol, rtol, accs, wins, len(workers), int(force_masked)
        )
        if rc != 0:
            raise RuntimeError(f"native kernel refused the window for {a.dtype}")
        n_both = sum(w.acc.n_both for w in workers)
        below = sum(w.win.below for w in workers)
        window = _zeros(width)
        for w in workers:
            assert w.window is not None
            lib.vk_add_i64(window.data_ptr(), w.window.data_ptr(), width)
        found = p99_in_window(n_both, below, window, lo)
        if found is None or shift == 0:
            if found is not None:
                _count("window")
            return found
        # a bucket window: the p99's bucket is `found`; its exact distance from the bucket's low 16 bits
        bucket = found
        rank_in_bucket = nearest_rank(n_both) - below - int(window[: bucket - lo].sum())
        low = _zeros(FINE_BINS)
        if cap and all(w.win.nlist <= cap for w in workers):
            for w in workers:
                assert w.list is not None
                lib.vk_list_low(w.list.data_ptr(), w.win.nlist, bucket, low.data_ptr())
            _count("window", "coarse")
        else:
            _refine(lib, a, b, workers, bucket, CHUNK, low)
            _count("window", "coarse", "refine")
        return (bucket << 16) + first_reaching(low, rank_in_bucket)
    finally:
        for w in workers:
            w.list = None
            w.win.list = None
            if w.window is not None and w.window.numel() > _KEEP_WINDOW:
                w.window = None  # a wide window's histogram is not kept: up to 8 MiB per thread
            w.win.window = None


def _p99(
    lib: ctypes.CDLL, a: torch.Tensor, b: torch.Tensor, workers: list[_Worker], n_both: int, chunk_elems: int
) -> int:
    """The exact p99 from the full histograms of a full pass."""
    if n_both == 0:
        return 0
    rank = nearest_rank(n_both)
    fine = _summed(lib, [w.fine for w in workers], workers)
    idx = first_reaching(fine, rank)
    if idx < FINE_BINS:
        return idx
    # float32 only: the coarse histogram names the 65536-wide bucket; a second pass bins inside it
    coarse = _summed(lib, [w.coarse for w in workers], workers)
    bucket = first_reaching(coarse, rank)
    rank_in_bucket = rank - int(coarse[:bucket].sum())
    low = torch.zeros(FINE_BINS, dtype=torch.int64)
    _refine(lib, a, b, workers, bucket, chunk_elems, low)
    return (bucket << 16) + first_reaching(low, rank_in_bucket)


def _refine(
    lib: ctypes.CDLL,
    a: torch.Tensor,
    b: torch.Tensor,
    workers: list[_Worker],
    bucket: int,
    chunk_elems: int,
    total: torch.Tensor,
) -> None:
    """float32's second pass: adds into ``total`` the histogram of the low 16 bits of the distances
    (finite in both) in ``bucket`` (their ``>> 16``)."""
    for w in workers:
        if w.low is None:
            w.low = torch.zeros(FINE_BINS, dtype=torch.int64)
        else:
            ctypes.memset(w.low.data_ptr(), 0, w.low.numel() * 8)

    def body(jobs: Iterator, lock: threading.Lock, w: _Worker) -> None:  # type: ignore[type-arg]
        low = w.low
        assert low is not None
        while True:
            with lock:
                job = next(jobs, None)
            if job is None:
                return
            ca, cb = job[0].contiguous(), job[1].contiguous()
            lib.vk_refine_f32(ca.data_ptr(), cb.data_ptr(), ca.numel(), bucket, low.data_ptr())

    _parallel(body, _pieces(a, b, chunk_elems), workers)
    for w in workers:
        assert w.low is not None
        lib.vk_add_i64(total.data_ptr(), w.low.data_ptr(), FINE_BINS)


def _summed(lib: ctypes.CDLL, hists: list[torch.Tensor | None], workers: list[_Worker] | None = None) -> torch.Tensor:
    """Sum of the workers' histograms, added in place into the first (no allocation, no torch thread
    pool). With ``workers`` (several), the bins are cut into ranges that those threads add in parallel."""
    present = [h for h in hists if h is not None]
    total = present[0]
    if len(present) == 1:
        return total
    n = total.numel()
    if workers is None or len(present) < 4:  # a few are added faster than threads are woken
        for h in present[1:]:
            lib.vk_add_i64(total.data_ptr(), h.data_ptr(), n)
        return total
    step = -(-n // (2 * len(workers)))

    def body(jobs: Iterator, lock: threading.Lock, w: _Worker) -> None:  # type: ignore[type-arg]
        while True:
            with lock:
                start = next(jobs, None)
            if start is None:
                return
            m = min(step, n - start)
            for h in present[1:]:
                lib.vk_add_i64(total.data_ptr() + 8 * start, h.data_ptr() + 8 * start, m)

    _parallel(body, iter(range(0, n, step)), workers)
    return total
