"""Capture points inside CUDA graphs.

Serving engines replay decode steps as CUDA graphs: the kernels recorded at capture time run again, but
the Python code that launched them does not. A capture point reached while a graph is being captured
therefore cannot copy anything out at that moment (nothing has run yet) and will not run again at replay.

With graph slots enabled, such a capture point instead records kernels into the graph that write into a
*static slot* preallocated for it: a copy of the tensor (full mode; one copy kernel into a buffer
allocated from the graph's memory pool) or its 5-value summary (the fused summary's two kernels writing a
row of this device's summary arena). Each slot also has a *generation counter* in this device's counter
arena, incremented inside the graph (by the summary's finishing kernel; in full mode by one more tiny
kernel), so every replay bumps it. ``ProbeSession.after_replay(step=...)``, called on the replay stream
after each replay, gathers the graph's slots and counters with one ``torch.cat`` kernel per device, copies
that to the host asynchronously and records it with that step. When the counters arrive on the host each
one is compared with the last value seen:

- advanced by 1: fresh data, written to the bundle;
- advanced by k > 1: k - 1 replays were never read out (``after_replay`` was not called, or was called
  for steps that sampling or the step/request filters left out, which are not reported): reported;
- unchanged: the graph did not replay since the last read; the data is stale and is not written: reported;
- at ``close()`` the counters are read once more: replays after the last read are reported as unread.

The arenas are zeroed when they are created, which must happen outside graph capture:
``ProbeSession.prepare_graphs(device)`` before capturing (any eager capture on that device also does it).
Without graph slots, a capture point inside graph capture raises :class:`GraphCaptureError`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from . import summary as _summary

__all__ = ["DEFAULT_GRAPH", "GraphCaptureError", "GraphSlot", "GraphSlots"]

DEFAULT_GRAPH = "default"


class GraphCaptureError(RuntimeError):
    """A capture point inside CUDA graph capture that cannot be served (slots disabled, unprepared, full)."""


def _norm_device(device: torch.device | str | int | None) -> torch.device:
    if device is None:
        return torch.device("cuda", torch.cuda.current_device())
    dev = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    if dev.type != "cuda":
        raise GraphCaptureError(f"graph slots live on CUDA devices, not {dev}")
    return torch.device("cuda", torch.cuda.current_device()) if dev.index is None else dev


@dataclass(eq=False)
class GraphSlot:
    """The static slot of one capture point in one captured graph."""

    graph: str
    name: str  # the name stored in the bundle (``<name>.summary`` in summary mode)
    coords: dict[str, Any]
    shard: Any
    mode: str
    device: torch.device
    index: int  # row in this device's arenas
    buf: torch.Tensor | None = None  # full mode: the copy target inside the graph (uint8, padded to 16 bytes)
    shape: tuple[int, ...] = ()  # full mode: the captured tensor's shape and dtype
    dtype: torch.dtype = torch.uint8
    seen: int = 0  # generation counter value at the last read
    reads: int = field(default=0)
    skipped: int = 0  # after_replay calls left out (filters, sampling) since the last read was queued

    @property
    def nbytes(self) -> int:
        if self.buf is None:
            return _summary.SUMMARY_NBYTES
        n = self.dtype.itemsize
        for d in self.shape:
            n *= d
        return n


class _Arena:
    def __init__(self, device: torch.device, size: int) -> None:
        self.gen = torch.zeros(size, dtype=torch.int64, device=device)
        self.summary = torch.zeros(size, len(_summary.SUMMARY_FIELDS), dtype=torch.float64, device=device)
        self.used = 0


class GraphSlots:
    """Slot bookkeeping for one probe session: arenas per device, slots per graph key."""

    def __init__(self, max_slots: int) -> None:
        self.max_slots = max_slots
        self.arenas: dict[torch.device, _Arena] = {}
        self.slots: dict[str, list[GraphSlot]] = {}
        self.retired: list[GraphSlot] = []  # slots of graphs captured again under the same key
        self.current = DEFAULT_GRAPH
        self._groups: dict[str, list[tuple[_Arena, int, int, list[GraphSlot]]]] = {}  # cache of groups()

    def prepare(self, device: torch.device | str | int | None = None) -> None:
        dev = _norm_device(device)
        if dev in self.arenas:
            return
        if torch.cuda.is_current_stream_capturing():
            raise GraphCaptureError("prepare_graphs() must be called before CUDA graph capture, not during it")
        self.arenas[dev] = _Arena(dev, self.max_slots)
        _summary.prepare(dev)

    @contextmanager
    def scope(self, key: str) -> Iterator[None]:
        """Slots created inside belong to graph ``key``; earlier slots of that key are retired."""
        prev = self.current
        self.retired.extend(self.slots.pop(key, []))
        self._groups.pop(key, None)
        self.current = key
        try:
            yield
        finally:
            self.current = prev

    def add(
        self, name: str, src: torch.Tensor, *, coords: dict[str, Any], shard: Any, mode: str, chunk: int
    ) -> GraphSlot:
        """Called during graph capture: record the copy/summary and counter kernels for one capture point."""
        dev = _norm_device(src.device)
        arena = self.arenas.get(dev)
        if arena is None:
            raise GraphCaptureError(
                f"capture point {name!r} inside CUDA graph capture on {dev}, but graph slots were not prepared "
                f"there: call session.prepare_graphs({str(dev)!r}) before capturing the graph"
            )
        key = self.current
        slots = self.slots.setdefault(key, [])
        stored = name + ".summary" if mode == "summary" else name
        ident = (stored, sorted(coords.items(), key=lambda kv: kv[0]), str(shard))
        for s in slots:
            if (s.name, sorted(s.coords.items(), key=lambda kv: kv[0]), str(s.shard)) == ident:
                raise GraphCaptureError(
                    f"capture point {name!r} ({coords}) reached twice while capturing graph {key!r}: "
                    "give the two points different names or coordinates"
                )
        if arena.used >= self.max_slots:
            raise GraphCaptureError(
                f"no free graph slot on {dev} for {name!r}: all {self.max_slots} are used "
                "(raise max_graph_slots, or capture fewer points)"
            )
        index = arena.used
        arena.used += 1
        buf = None
        counter = arena.gen[index : index + 1]
        if mode == "summary":  # the summary's last kernel also bumps the counter
            _summary.summarize(src, out=arena.summary[index], chunk=chunk, counter=counter)
        else:
            nbytes = src.numel() * src.element_size()
            buf = torch.empty(-(-nbytes // 16) * 16, dtype=torch.uint8, device=dev)  # 16-byte pieces for one cat
            buf[:nbytes].view(src.dtype).view(src.shape).copy_(src)
            counter.add_(1)
        slot = GraphSlot(key, stored, dict(coords), shard, mode, dev, index, buf, tuple(src.shape), src.dtype)
        slots.append(slot)
        self._groups.pop(key, None)
        return slot

    def groups(self, key: str) -> list[tuple[_Arena, int, int, list[GraphSlot]]]:
        """Slots of graph ``key`` per device, with the arena row range ``[lo, hi)`` that covers them."""
        cached = self._groups.get(key)
        if cached is not None:
            return cached
        by_dev: dict[torch.device, list[GraphSlot]] = {}
        for s in self.slots.get(key, ()):
            by_dev.setdefault(s.device, []).append(s)
        out = []
        for dev, slots in by_dev.items():
            lo = min(s.index for s in slots)
            hi = max(s.index for s in slots) + 1
            out.append((self.arenas[dev], lo, hi, slots))
        self._groups[key] = out
        return out

    @staticmethod
    def observe(slot: GraphSlot, generation: int, skipped: int = 0) -> tuple[bool, int]:
        """Record a counter value read for ``slot``, ``skipped`` after_replay calls having been left out
        (filtered or sampled out) since the previous read: (fresh, missed replays)."""
        delta = generation - slot.seen
        slot.seen = generation
        slot.reads += 1
        if delta <= 0:
            return False, 0
        return True, max(delta - 1 - skipped, 0)

    def unread(self) -> list[tuple[GraphSlot, int]]:
        """Slots whose counters moved past the last read (blocking device read; call after a flush)."""
        out = []
        every = [s for slots in self.slots.values() for s in slots] + self.retired
        gens = {dev: a.gen[: a.used].cpu().tolist() for dev, a in self.arenas.items() if a.used}
        for s in every:
            extra = gens[s.device][s.index] - s.seen - s.skipped
            if extra > 0:
                out.append((s, extra))
        return out

    @property
    def count(self) -> int:
        return sum(len(v) for v in self.slots.values())
