"""The CPU path: the native one-pass kernel run on chunks by every core.

Each pair is split into chunks of :data:`CHUNK` elements (views of contiguous inputs, never copies;
non-contiguous inputs are copied a bounded block at a time). A pool of threads, one per core, pulls
chunks from a shared queue; each thread adds into its own float64/int64 accumulator and its own
exact ULP histograms, and the per-thread totals are combined at the end. ctypes releases the GIL for
the duration of each kernel call, so the threads run in parallel.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import torch

from .. import metrics as _ref
from ._finish import FINE_BINS, ULP_DTYPES, first_reaching, metrics_from_totals, nearest_rank
from ._native import Acc, library

__all__ = ["compare_cpu", "CHUNK", "set_threads", "threads"]

CHUNK = 1 << 20  # elements per kernel call: large enough that the call overhead vanishes
_SERIAL_BELOW = 1 << 18  # pairs smaller than this run in the calling thread

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
    def body(jobs: Iterator, lock: threading.Lock, w: _Worker) -> None:  # type: ignore[type-arg]
        _run(lib, jobs, lock, w, float(atol), float(rtol), force_masked, ulp, coarse)

    _parallel(body, _pieces(a, b, chunk_elems), workers)
    accs = [w.acc for w in workers]
    sums = [sum(getattr(x, f) for x in accs) for f in ("s_aa", "s_bb", "s_ab", "s_dd", "s_ad")]
    counts = [
        sum(x.n_both for x in accs),
        sum(x.n_pass for x in accs),
        sum(x.nf_a for x in accs),
        sum(x.nf_b for x in accs),
        sum(x.mismatch for x in accs),
    ]
    ulp_result = None
    if ulp:
        ulp_result = (max(x.max_ulp for x in accs), _p99(lib, a, b, workers, counts[0], chunk_elems))
    return metrics_from_totals(a, b, atol, rtol, sums, max(x.max_ad for x in accs), counts, ulp_result)


def _p99(
    lib: ctypes.CDLL, a: torch.Tensor, b: torch.Tensor, workers: list[_Worker], n_both: int, chunk_elems: int
) -> int:
    if n_both == 0:
        return 0
    rank = nearest_rank(n_both)
    fine = _summed(lib, [w.fine for w in workers])
    idx = first_reaching(fine, rank)
    if idx < FINE_BINS:
        return idx
    # float32 only: the coarse histogram names the 65536-wide bucket; a second pass bins inside it
    coarse = _summed(lib, [w.coarse for w in workers])
    bucket = first_reaching(coarse, rank)
    rank_in_bucket = rank - int(coarse[:bucket].sum())
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
    return (bucket << 16) + first_reaching(_summed(lib, [w.low for w in workers]), rank_in_bucket)


def _summed(lib: ctypes.CDLL, hists: list[torch.Tensor | None]) -> torch.Tensor:
    """Sum of the workers' histograms, added in place into the first (no allocation, no thread pool)."""
    present = [h for h in hists if h is not None]
    total = present[0]
    for h in present[1:]:
        lib.vk_add_i64(total.data_ptr(), h.data_ptr(), total.numel())
    return total
