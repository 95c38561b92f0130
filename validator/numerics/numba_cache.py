"""numba's on-disk cache, guarded across processes.

numba numbers a new entry of a kernel's on-disk cache from the index it has just read, so two processes that
compile two signatures of one kernel at the same moment (two dtypes, say) can both write the same file, and
leave one signature's index entry pointing at the other's code. :func:`first_call` holds an exclusive lock on
one file in the temporary directory around the first call of a kernel for a set of argument types in this
process (the call that loads it from the cache, or compiles and saves it); later calls take no lock.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Hashable, Iterator

try:
    import fcntl
except ImportError:  # not POSIX: no lock
    fcntl = None  # type: ignore[assignment]

_DONE: set[Hashable] = set()
_PATH = os.path.join(tempfile.gettempdir(), "validator-numba-cache.lock")


@contextlib.contextmanager
def first_call(key: Hashable) -> Iterator[None]:
    """Around a call of a kernel; ``key``: the kernel and its argument types. The first time in this
    process, the call runs under the lock."""
    if key in _DONE or fcntl is None:
        yield
        return
    fd = os.open(_PATH, os.O_RDONLY | os.O_CREAT, 0o666)  # read-only: any user can lock a file another made
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
        _DONE.add(key)
    finally:
        os.close(fd)  # releases the lock
