"""probes.core.transfer: who writes completed copies to the bundle, and in what order (CPU; the copies themselves need
CUDA and are tested in test_cudagraph_cuda.py)."""

from __future__ import annotations

import threading
from typing import Any

import torch

from probes.core.transfer import INLINE_BYTES, Transfer, Write


class Recorder:
    """A bundle writer that records each name and the thread that added it; ``gate`` holds the first add
    made on another thread until it is set."""

    def __init__(self) -> None:
        self.added: list[tuple[str, str]] = []
        self.gate = threading.Event()

    def add(self, name: str, tensor: torch.Tensor, **_: Any) -> None:
        if threading.current_thread() is not threading.main_thread():
            self.gate.wait(timeout=30)
        self.added.append((name, threading.current_thread().name))

    def flush(self) -> None:
        pass


def _writes(*names: str) -> list[Write]:
    return [Write(n, torch.zeros(2)) for n in names]


def test_small_writes_inline_while_the_thread_is_idle_and_order_kept() -> None:
    rec = Recorder()
    t = Transfer(rec, drain="thread")
    main = threading.main_thread().name
    t._emit(_writes("a", "b"), None, 64)  # small, thread idle: written here at once
    assert rec.added == [("a", main), ("b", main)]
    t._emit(_writes("big"), None, INLINE_BYTES + 1)  # large: the thread (held at the gate)
    t._emit(_writes("c"), None, 64)  # small, but the thread has work: queued behind it, order kept
    assert rec.added == [("a", main), ("b", main)]
    rec.gate.set()
    t.flush()
    t._emit(_writes("d"), None, None)  # size unknown (CPU captures): always the thread
    t.close()
    assert [n for n, _ in rec.added] == ["a", "b", "big", "c", "d"]
    assert {th for _, th in rec.added[2:]} == {"probe-bundle-writer"}


def test_a_small_write_that_would_fill_a_file_goes_to_the_thread(tmp_path: Any) -> None:
    from probes.core.bundle import BundleWriter

    writer = BundleWriter(tmp_path / "b", max_file_bytes=100)
    t = Transfer(writer, drain="thread")
    t._emit(_writes("a"), None, 8)  # 8 of 100 bytes: written here, no file yet
    assert writer.room_for(8) and not list((tmp_path / "b" / "parts" / "part0").glob("*.safetensors"))
    assert not writer.room_for(100)
    seen: list[str] = []
    real_flush = writer.flush

    def flush() -> None:  # the real flush, noting the thread that ran it
        seen.append(threading.current_thread().name)
        real_flush()

    writer.flush = flush  # type: ignore[method-assign]
    t._emit([Write("big", torch.zeros(25))], None, 100)  # 100 bytes more reach the limit: the file, on the thread
    t.close()
    assert seen[0] == "probe-bundle-writer"
    assert len(list((tmp_path / "b" / "parts" / "part0").glob("*.safetensors"))) == 1


def test_inline_drain_writes_everything_here() -> None:
    rec = Recorder()
    t = Transfer(rec, drain="inline")
    t._emit(_writes("big"), None, INLINE_BYTES * 4)
    t._emit(_writes("x"), None, None)
    assert [th for _, th in rec.added] == [threading.main_thread().name] * 2
