"""Moving captured data off the device and into the bundle without stalling the serving stream.

For a CUDA capture the copy is queued on a per-device *side stream*: the side stream first waits for the
work already queued on the serving (current) stream, then copies into pinned host buffers, then records
an event. ``record_stream`` tells the caching allocator that the source is in use on the side stream, so
its memory is not reused before the copy ends. Nothing here synchronises the serving stream with the host.

Captures of one step are *staged* and copied together (:meth:`Transfer.submit`): a device's summaries are
rows of one float64 buffer (one copy for all of them; rows of deferred summaries are computed together just
before, see :meth:`Transfer.defer_summary`), its full-capture snapshots are copied one after the
other behind a single wait and a single event. The session submits when the step changes, when a batch
holds ``batch_rows`` summaries or ``batch_bytes`` of snapshots, and at ``after_replay``, ``end_step``,
``flush`` and ``close``.

Pinned host buffers come from a small pool (:class:`PinnedPool`) and go back to it once the bundle writer
has copied them, so a steady stream of same-sized captures allocates no pinned memory after the first
steps; the pool keeps at most ``keep_bytes`` of free buffers.

Completed copies are found by :meth:`Transfer.poll` (non-blocking event queries, called on the serving
thread at each capture) or waited for by :meth:`Transfer.flush`. Their bundle writes (a host copy, a
sha256, safetensors files) then run either on a background writer thread (``drain="thread"``) or inline;
with the thread, small completed copies (``INLINE_BYTES``) are still written inline while the thread is idle.
The writer thread makes no CUDA call at all, not even freeing a pinned buffer: a CUDA call from another
thread during CUDA graph capture (global capture mode) breaks the capture. Buffers it is done with go back
to the serving thread, which returns them to the pool at its next poll. The bundle writer must copy what
it is given (``BundleWriter.add`` does), since the buffer is reused afterwards.
"""

from __future__ import annotations

import queue
import threading
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["PinnedPool", "Transfer", "Write"]

# Completed copies of at most this many bytes (a step's summary rows, a decode step's small tensors) are written
# on the serving thread when the writer's thread is idle: their Python costs less there than handing the GIL
# back and forth with the thread (on an H200 host, 56 summary rows a step: ~33 us per row inline, ~80 us through
# the thread; benchmarks/capture_host.py). Larger ones, whose sha256 and copies release the GIL, go to the thread.
INLINE_BYTES = 256 << 10

SUMMARY_WIDTH = 5  # float64 values per summary row (probes.core.summary.SUMMARY_FIELDS)


@dataclass
class Write:
    """One bundle entry: ``writer.add(name, tensor, shard=shard, **coords)``."""

    name: str
    tensor: torch.Tensor
    shard: Any = None
    coords: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Pending:
    event: Any  # torch.cuda.Event | None (None: already on the host)
    hosts: list[torch.Tensor]
    on_ready: Callable[[list[torch.Tensor]], list[Write]]
    nbytes: int
    bufs: list[torch.Tensor] = field(default_factory=list)  # pinned pool buffers behind ``hosts``


@dataclass
class _Deferred:
    """A tensor whose summary goes into row ``row`` when the batch is submitted."""

    tensor: torch.Tensor
    version: int  # its version counter when captured: a change means it was written in place since
    stream: Any  # the stream current when it was captured (None: only watched)
    row: int  # its row in the batch; -1: only watched (already summarised)
    name: str


@dataclass
class _Batch:
    """One device's staged captures: summary rows of one buffer, and full-capture snapshots."""

    rows: torch.Tensor | None = None  # [batch_rows, 5] float64
    used: int = 0
    row_writes: list[Callable[[torch.Tensor], Write] | None] = field(default_factory=list)
    deferred: list[_Deferred] = field(default_factory=list)  # summaries not computed yet, and watched tensors
    deferred_bytes: int = 0
    held: list[torch.Tensor] = field(default_factory=list)  # pinned buffers read by queued copies
    full: list[torch.Tensor] = field(default_factory=list)
    full_writes: list[Callable[[torch.Tensor], Write]] = field(default_factory=list)
    nbytes: int = 0


def _bucket(nbytes: int) -> int:
    """Pool size class: ``nbytes`` rounded up to 4 classes per power of two (at least 512 bytes)."""
    if nbytes <= 512:
        return 512
    step = 1 << max(nbytes.bit_length() - 3, 0)
    return -(-nbytes // step) * step


class PinnedPool:
    """Pinned host buffers (uint8) by size class, reused; at most ``keep_bytes`` of free ones are kept
    (the least recently used size classes are dropped first). Used from the serving thread only."""

    def __init__(self, keep_bytes: int = 256 << 20) -> None:
        self.keep_bytes = keep_bytes
        self.free: OrderedDict[int, list[torch.Tensor]] = OrderedDict()
        self.free_bytes = 0
        self.allocated = 0  # buffers made (not reused)

    def get(self, nbytes: int) -> torch.Tensor:
        size = _bucket(nbytes)
        bufs = self.free.get(size)
        if bufs:
            self.free.move_to_end(size)
            self.free_bytes -= size
            buf = bufs.pop()
            if not bufs:
                del self.free[size]
            return buf
        self.allocated += 1
        return torch.empty(size, dtype=torch.uint8, pin_memory=True)

    def put(self, buf: torch.Tensor) -> None:
        size = buf.numel()
        if size > self.keep_bytes:
            return
        self.free.setdefault(size, []).append(buf)
        self.free.move_to_end(size)
        self.free_bytes += size
        while self.free_bytes > self.keep_bytes:
            old, bufs = next(iter(self.free.items()))
            bufs.pop()
            self.free_bytes -= old
            if not bufs:
                del self.free[old]


def host_view(
    buf: torch.Tensor, shape: torch.Size | tuple[int, ...], dtype: torch.dtype, offset: int = 0
) -> torch.Tensor:
    """``buf[offset:]`` (a uint8 host buffer) seen as a tensor of ``shape`` and ``dtype``."""
    n = dtype.itemsize
    for d in shape:
        n *= d
    return buf[offset : offset + n].view(dtype).view(shape)


_STOP = object()


class Transfer:
    """Device-to-host copies (side stream, pinned buffers) and the drain into a bundle writer."""

    def __init__(
        self,
        writer: Any,
        *,
        drain: str = "thread",
        batch_rows: int = 256,
        batch_bytes: int = 64 << 20,
        keep_bytes: int = 256 << 20,
        summary_chunk: int = 1 << 24,
    ) -> None:
        self.writer = writer
        self.drain = drain
        self.batch_rows = batch_rows
        self.batch_bytes = batch_bytes
        self.summary_chunk = summary_chunk
        self.pool = PinnedPool(keep_bytes)
        self._batches: dict[torch.device, _Batch] = {}
        self._pending: deque[_Pending] = deque()
        self._done: deque[list[torch.Tensor]] = deque()  # pool buffers the writer thread is done with
        self._side: dict[torch.device, Any] = {}
        self._lock = threading.Lock()
        self.inflight_bytes = 0
        self.max_inflight_bytes = 0
        self.written = 0
        self.write_errors = 0
        self.first_error: str | None = None
        self.modified = 0  # deferred summaries not written: the tensor changed in place before they ran
        self.modified_names: set[str] = set()  # names whose tensors were written in place before the step ended
        self.steady_names: set[str] = set()  # names watched through a step without being written in place
        self._queue: queue.Queue[Any] | None = None
        self._queued = 0  # items put on the queue and not yet written by the thread
        self._thread: threading.Thread | None = None
        if drain == "thread":
            self._queue = queue.Queue()
            self._thread = threading.Thread(target=self._run, name="probe-bundle-writer", daemon=True)
            self._thread.start()

    # -- submitting -----------------------------------------------------------------------------
    def side_stream(self, device: torch.device) -> Any:
        s = self._side.get(device)
        if s is None:
            s = self._side[device] = torch.cuda.Stream(device=device)  # type: ignore[no-untyped-call]
        return s

    def to_host(
        self, srcs: list[torch.Tensor], on_ready: Callable[[list[torch.Tensor]], list[Write]],
        held: list[torch.Tensor] | None = None,
    ) -> None:  # fmt: skip
        """Queue async copies of ``srcs`` (all on one CUDA device) to pinned host buffers.

        ``srcs`` are read on the side stream after the work queued so far on the current stream; the
        caller must make sure nothing overwrites them later (pass a snapshot) or accept the race.
        ``on_ready(hosts)`` runs on this thread once the copies are complete and returns the writes.
        ``held``: pool buffers read by work queued before (on the current stream), back to the pool with these.
        """
        dev = srcs[0].device
        cur = torch.cuda.current_stream(dev)
        side = self.side_stream(dev)
        bufs = [self.pool.get(s.numel() * s.element_size()) for s in srcs]
        hosts = [host_view(b, s.shape, s.dtype) for b, s in zip(bufs, srcs, strict=True)]
        side.wait_stream(cur)
        with torch.cuda.stream(side):
            for h, s in zip(hosts, srcs, strict=True):
                h.copy_(s, non_blocking=True)
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            event.record(side)
        for s in srcs:
            s.record_stream(side)
        nbytes = sum(h.numel() * h.element_size() for h in hosts)
        self._pending.append(_Pending(event, hosts, on_ready, nbytes, bufs + (held or [])))
        self.inflight_bytes += nbytes
        self.max_inflight_bytes = max(self.max_inflight_bytes, self.inflight_bytes)

    # -- staging: one copy per device per step ----------------------------------------------------
    def summary_slot(self, device: torch.device) -> torch.Tensor:
        """The next free summary row (float64 [5]) of ``device``'s batch: write a summary into it, then
        call :meth:`stage_summary`."""
        b = self._batch(device)
        assert b.rows is not None
        return b.rows[b.used]

    def stage_summary(self, device: torch.device, make: Callable[[torch.Tensor], Write]) -> None:
        """The row from :meth:`summary_slot` is written; ``make(host_row)`` gives its write."""
        b = self._batches[device]
        b.used += 1
        b.row_writes.append(make)
        if b.used >= self.batch_rows:
            self._submit(device, b)

    def defer_summary(self, t: torch.Tensor, name: str, make: Callable[[torch.Tensor], Write], held: int) -> None:
        """Reserve a row for the summary of ``t`` (a CUDA tensor, not an inference tensor), computed with the
        batch's other deferred summaries at the next :meth:`submit`: a few kernel launches for all of them.
        ``t`` is kept alive until then. If it is written in place before, its row is not written: counted in
        :attr:`modified`, and its name moves to :attr:`modified_names`. ``held``: the bytes of ``t``'s storage
        (a view keeps its whole base alive)."""
        device = t.device
        b = self._batch(device)
        b.deferred.append(_Deferred(t, t._version, torch.cuda.current_stream(device), b.used, name))
        b.deferred_bytes += held
        b.used += 1
        b.row_writes.append(make)
        if b.used >= self.batch_rows or b.deferred_bytes >= self.batch_bytes:
            self._submit(device, b)

    def watch(self, t: torch.Tensor, name: str) -> None:
        """Keep ``t`` (already summarised) until the next :meth:`submit` to see whether it is written in
        place before its step ends: if no tensor of ``name`` is, ``name`` joins :attr:`steady_names` (its
        later summaries may be deferred), else :attr:`modified_names`."""
        b = self._batch(t.device)
        b.deferred.append(_Deferred(t, t._version, None, -1, name))
        b.deferred_bytes += t.untyped_storage().nbytes()
        if b.deferred_bytes >= self.batch_bytes:
            self._submit(t.device, b)

    def _batch(self, device: torch.device) -> _Batch:
        b = self._batches.get(device)
        if b is None:
            b = self._batches[device] = _Batch()
        if b.rows is None:
            b.rows = torch.empty(self.batch_rows, SUMMARY_WIDTH, dtype=torch.float64, device=device)
        return b

    def _summarize_deferred(self, b: _Batch) -> None:
        """Run the batch's deferred summaries (on the current stream, after the streams they came from) and
        sort the watched names into steady and modified."""
        assert b.rows is not None
        device = b.rows.device
        cur = torch.cuda.current_stream(device)
        tensors, rows = [], []
        watched, changed = set(), set()
        for d in b.deferred:
            if d.tensor._version != d.version:
                changed.add(d.name)
                if d.row >= 0:  # too late: its summary is lost
                    b.row_writes[d.row] = None
                    self.modified += 1
            elif d.row < 0:
                watched.add(d.name)
            else:
                if d.stream != cur:
                    cur.wait_stream(d.stream)
                d.tensor.record_stream(cur)  # its memory is not reused before the kernels below have read it
                tensors.append(d.tensor)
                rows.append(d.row)
        self.modified_names |= changed
        self.steady_names -= changed
        self.steady_names |= watched - self.modified_names
        if tensors:
            from .summary import summarize_many  # Triton is imported once, and only when summaries are deferred

            def host_buffer(nbytes: int) -> torch.Tensor:  # back to the pool with the rows' copy
                buf = self.pool.get(nbytes)
                b.held.append(buf)
                return buf

            try:
                summarize_many(tensors, out=b.rows, rows=rows, chunk=self.summary_chunk, host_buffer=host_buffer)
            except Exception as exc:  # out of memory, say: these rows are lost, counted; the serving code goes on
                for row in rows:
                    b.row_writes[row] = None
                with self._lock:
                    self.write_errors += len(rows)
                    if self.first_error is None:
                        self.first_error = f"deferred summaries: {type(exc).__name__}: {exc}"
        b.deferred, b.deferred_bytes = [], 0

    def stage(self, src: torch.Tensor, make: Callable[[torch.Tensor], Write]) -> None:
        """A device tensor nothing else will write (a snapshot), copied at the next :meth:`submit`."""
        b = self._batches.get(src.device)
        if b is None:
            b = self._batches[src.device] = _Batch()
        b.full.append(src)
        b.full_writes.append(make)
        b.nbytes += src.numel() * src.element_size()
        if b.nbytes >= self.batch_bytes:
            self._submit(src.device, b)

    @property
    def staged(self) -> bool:
        return any(b.used or b.full or b.deferred for b in self._batches.values())

    def submit(self) -> None:
        """Queue the copies of everything staged (non-blocking)."""
        for dev, b in list(self._batches.items()):
            if b.used or b.full or b.deferred:
                self._submit(dev, b)

    def _submit(self, device: torch.device, b: _Batch) -> None:
        if b.deferred:
            self._summarize_deferred(b)
        if not (b.used or b.full):
            return
        srcs = list(b.full)
        if b.used:
            assert b.rows is not None
            srcs.append(b.rows[: b.used])
        full_writes, row_writes = b.full_writes, b.row_writes

        def on_ready(hosts: list[torch.Tensor]) -> list[Write]:
            writes = [make(h) for make, h in zip(full_writes, hosts, strict=False)]
            if row_writes:
                rows = hosts[-1]
                writes += [make(rows[i]) for i, make in enumerate(row_writes) if make is not None]
            return writes

        self._batches[device] = _Batch()  # a fresh rows buffer: the old one is read by the side stream
        self.to_host(srcs, on_ready, b.held)

    def host(self, writes: list[Write]) -> None:
        """Writes whose tensors are already private host copies (CPU captures), in submission order."""
        if self.staged:
            self.submit()
        if self._pending:  # keep bundle order = capture order
            self._pending.append(_Pending(None, [], lambda _h: writes, 0))
        else:
            self._emit(writes)

    # -- draining -------------------------------------------------------------------------------
    def poll(self) -> None:
        """Hand every completed copy to the writer; never blocks. Not during CUDA graph capture."""
        self._recycle()
        pending = self._pending
        while pending:
            p = pending[0]
            if p.event is not None and not p.event.query():
                break
            pending.popleft()
            self._complete(p)

    def flush(self) -> None:
        """Wait for every queued copy and write: afterwards the writer holds everything captured so far."""
        self.submit()
        while self._pending:
            p = self._pending.popleft()
            if p.event is not None:
                p.event.synchronize()
            self._complete(p)
        if self._queue is not None:
            self._queue.join()
        self._recycle()
        self.writer.flush()

    def close(self) -> None:
        self.flush()
        if self._thread is not None and self._queue is not None:
            self._queue.put(_STOP)
            self._thread.join()
            self._thread = None

    @property
    def pending(self) -> int:
        return len(self._pending)

    def _complete(self, p: _Pending) -> None:
        self.inflight_bytes -= p.nbytes
        self._emit(p.on_ready(p.hosts), p.bufs, p.nbytes)

    def _emit(self, writes: list[Write], bufs: list[torch.Tensor] | None = None, nbytes: int | None = None) -> None:
        """Hand ``writes`` to the writer: on its thread, or here when there is no thread, or when they hold at
        most ``INLINE_BYTES``, the thread is idle (so the bundle keeps the capture order and the writer is never
        used by two threads at once) and the writer will not write a file for them (``room_for``: files are
        written on the thread). ``nbytes``: their bytes, if known."""
        room_for = getattr(self.writer, "room_for", None)
        if self._queue is not None and (
            nbytes is None or nbytes > INLINE_BYTES or self._queued or (room_for is not None and not room_for(nbytes))
        ):
            with self._lock:
                self._queued += 1
            self._queue.put((writes, bufs or []))
            return
        for w in writes:
            self._write(w)
        for b in bufs or []:
            self.pool.put(b)

    def _recycle(self) -> None:
        while self._done:
            for b in self._done.popleft():
                self.pool.put(b)

    def _write(self, w: Write) -> None:
        try:
            self.writer.add(w.name, w.tensor, shard=w.shard, **w.coords)
        except Exception as exc:
            with self._lock:
                self.write_errors += 1
                if self.first_error is None:
                    self.first_error = f"{w.name}: {type(exc).__name__}: {exc}"
        else:
            with self._lock:
                self.written += 1

    def _run(self) -> None:
        assert self._queue is not None
        while True:
            item = self._queue.get()
            if item is _STOP:
                self._queue.task_done()
                return
            try:
                writes, bufs = item
                item = None
                for w in writes:
                    self._write(w)
                w = writes = None
                self._done.append(bufs)  # back to the pool on the serving thread: no CUDA call here
                bufs = None
            finally:
                with self._lock:
                    self._queued -= 1
                self._queue.task_done()
