"""Python's cycle collector paused while one large run (tens of thousands of records) is read, stored or
compared: a process-wide pause shared by every thread."""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

__all__ = ["cycle_collector_paused"]

_lock = threading.Lock()
_pauses = 0
_was_enabled = False


@contextlib.contextmanager
def cycle_collector_paused() -> Iterator[None]:
    """Python's cycle collector paused while a large run is read and stored: with ~100k records alive it
    walks them again and again, a quarter of a 100k-record finalize. Reference counting frees everything as
    usual; only garbage cycles made meanwhile wait, until the last pause (of any thread) ends."""
    global _pauses, _was_enabled
    with _lock:
        if _pauses == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _pauses += 1
    try:
        yield
    finally:
        with _lock:
            _pauses -= 1
            if _pauses == 0 and _was_enabled:
                gc.enable()
