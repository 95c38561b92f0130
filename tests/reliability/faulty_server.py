"""`validator serve` with one injected stall, so a test can SIGKILL it at a known point.

VALIDATOR_TEST_FAULT=KIND:MARKER. When the server reaches the point KIND names, it creates the file
MARKER and then blocks (the test kills it there):

- ``compare``: a comparison has started computing (its record is 'running').
- ``commit``: finalize has stored every blob and is inside the database transaction making the run visible.
- ``blobs``: finalize has stored some of the tensors' blobs and not yet touched the database.
- ``reference``: an upload (or finalize) has stored its blob and is about to open the transaction that
  records it; instead of blocking for good, it goes on once the file ``MARKER.go`` exists (the test runs
  something concurrent in between).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any


def _stall(marker: Path) -> None:
    marker.write_text(str(os.getpid()))
    time.sleep(600)


def _pause(marker: Path) -> None:
    marker.write_text(str(os.getpid()))
    go = marker.with_name(marker.name + ".go")
    deadline = time.monotonic() + 300
    while not go.exists() and time.monotonic() < deadline:
        time.sleep(0.02)


def install(kind: str, marker: Path) -> None:
    from validator import service
    from validator.store import crud as store

    if kind == "compare":
        orig_compare = service.Service.compare

        def compare(self: Any, *a: Any, **kw: Any) -> Any:
            _stall(marker)
            return orig_compare(self, *a, **kw)

        service.Service.compare = compare  # type: ignore[method-assign]
    elif kind == "commit":
        orig_complete = store.complete_run

        def complete_run(*a: Any, **kw: Any) -> Any:
            out = orig_complete(*a, **kw)
            _stall(marker)
            return out

        store.complete_run = complete_run
    elif kind == "blobs":
        orig_store = service.Service._store_tensor
        count = [0]

        def store_tensor(self: Any, *a: Any, **kw: Any) -> Any:
            out = orig_store(self, *a, **kw)
            count[0] += 1
            if count[0] == 2:
                _stall(marker)
            return out

        service.Service._store_tensor = store_tensor  # type: ignore[method-assign]
    elif kind == "reference":
        orig_lock = store.blob_gc_lock
        paused = [False]

        def blob_gc_lock(session: Any, *, exclusive: bool) -> None:
            if not exclusive and not paused[0]:  # the first transaction that commits references, before its lock
                paused[0] = True
                _pause(marker)
            orig_lock(session, exclusive=exclusive)

        store.blob_gc_lock = blob_gc_lock
    else:
        raise SystemExit(f"unknown fault {kind!r}")


def main() -> int:
    kind, _, marker = os.environ["VALIDATOR_TEST_FAULT"].partition(":")
    install(kind, Path(marker))
    from validator.app.cli import main as cli_main

    return cli_main(["serve", *sys.argv[1:]])


if __name__ == "__main__":
    sys.exit(main())
