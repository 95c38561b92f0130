"""Moving captured data off the device and into the bundle without stalling the serving stream.

For a CUDA capture the copy is queued on a per-device *side stream*: the side stream first waits for the
work already queued on the serving (current) stream, then copies into pinned host buffers, then records
an event. ``record_stream`` tells the caching allocator that the source is in use on the side stream, so
its memory is not reused before the copy ends. Nothing here synchronises the serving stream with the host.

Completed copies are found by :meth:`Transfer.poll` (non-blocking event queries, called on the serving
thread at each capture) or waited for by :meth:`Transfer.flush`. Their bundle writes (a host copy, a
sha256, safetensors files) then run either on a background writer thread (``drain="thread"``) or inline.
The writer thread makes no CUDA call at all, not even freeing a pinned buffer: a CUDA call from another
thread during CUDA graph capture (global capture mode) breaks the capture. Buffers it is done with go back
to the serving thread, which drops them at its next poll.
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["Transfer", "Write"]


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


_STOP = object()


class Transfer:
    """Device-to-host copies (side stream, pinned buffers) and the drain into a bundle writer."""

    def __init__(self, writer: Any, *, drain: str = "thread") -> None:
        self.writer = writer
        self.drain = drain
        self._pending: deque[_Pending] = deque()
        self._done: deque[Any] = deque()  # items the writer thread finished with (freed here)
        self._side: dict[torch.device, Any] = {}
        self._lock = threading.Lock()
        self.inflight_bytes = 0
        self.max_inflight_bytes = 0
        self.written = 0
        self.write_errors = 0
        self.first_error: str | None = None
        self._queue: queue.Queue[Any] | None = None
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

    def to_host(self, srcs: list[torch.Tensor], on_ready: Callable[[list[torch.Tensor]], list[Write]]) -> None:
        """Queue async copies of ``srcs`` (all on one CUDA device) to pinned host buffers.

        ``srcs`` are read on the side stream after the work queued so far on the current stream; the
        caller must make sure nothing overwrites them later (pass a snapshot) or accept the race.
        ``on_ready(hosts)`` runs on this thread once the copies are complete and returns the writes.
        """
        dev = srcs[0].device
        cur = torch.cuda.current_stream(dev)
        side = self.side_stream(dev)
        hosts = [torch.empty(s.shape, dtype=s.dtype, pin_memory=True) for s in srcs]
        side.wait_stream(cur)
        with torch.cuda.stream(side):
            for h, s in zip(hosts, srcs, strict=True):
                h.copy_(s, non_blocking=True)
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            event.record(side)
        for s in srcs:
            s.record_stream(side)
        nbytes = sum(h.numel() * h.element_size() for h in hosts)
        self._pending.append(_Pending(event, hosts, on_ready, nbytes))
        self.inflight_bytes += nbytes
        self.max_inflight_bytes = max(self.max_inflight_bytes, self.inflight_bytes)

    def host(self, writes: list[Write]) -> None:
        """Writes whose tensors are already private host copies (CPU captures), in submission order."""
        if self._pending:  # keep bundle order = capture order
            self._pending.append(_Pending(None, [], lambda _h: writes, 0))
        else:
            self._emit(writes)

    # -- draining -------------------------------------------------------------------------------
    def poll(self) -> None:
        """Hand every completed copy to the writer; never blocks. Not during CUDA graph capture."""
        while self._done:
            self._done.popleft()
        pending = self._pending
        while pending:
            p = pending[0]
            if p.event is not None and not p.event.query():
                break
            pending.popleft()
            self._complete(p)

    def flush(self) -> None:
        """Wait for every queued copy and write: afterwards the writer holds everything captured so far."""
        while self._pending:
            p = self._pending.popleft()
            if p.event is not None:
                p.event.synchronize()
            self._complete(p)
        if self._queue is not None:
            self._queue.join()
        while self._done:
            self._done.popleft()
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
        self._emit(p.on_ready(p.hosts))

    def _emit(self, writes: list[Write]) -> None:
        for w in writes:
            if self._queue is not None:
                self._queue.put(w)
            else:
                self._write(w)

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
            try:
                if item is _STOP:
                    return
                self._write(item)
                self._done.append(item)  # the serving thread drops it (a pinned free is a CUDA call)
                del item
            finally:
                self._queue.task_done()
