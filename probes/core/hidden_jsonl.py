"""The hidden JSONL file the recorders (:mod:`probes.rl.logprobs`, :mod:`probes.core.acceptance`) write through.

Lines go to ``.tmp-<stem>-*.jsonl`` in the part folder; :meth:`HiddenJsonl.publish` flushes, fsyncs and renames it
to its real name, so a partial file is never visible under that name. :meth:`keep` closes it where it is (what was
written stays, under the hidden name only); :meth:`discard` closes and removes it. Locking and "already closed"
are the recorders' own. :class:`PublishOnExit` is the recorders' ``with``: a clean exit publishes (``close()``),
an exception keeps the hidden file (``_keep()``). Standard library only.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Self

__all__ = ["HiddenJsonl", "PublishOnExit"]


class HiddenJsonl:
    """A hidden temporary ``.jsonl`` file in ``folder``, open for writing text (UTF-8) as :attr:`file`."""

    def __init__(self, folder: Path, stem: str) -> None:
        fd, tmp = tempfile.mkstemp(prefix=f".tmp-{stem}-", suffix=".jsonl", dir=folder)
        self.tmp = Path(tmp)
        self.file = os.fdopen(fd, "w", encoding="utf-8")

    def publish(self, dest: Path) -> None:
        """Flush, fsync, close and rename to ``dest``."""
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()
        os.replace(self.tmp, dest)

    def keep(self) -> None:
        """Flush and close; the file stays under its hidden name."""
        self.file.flush()
        self.file.close()

    def discard(self) -> None:
        """Close and remove the file."""
        self.file.close()
        self.tmp.unlink(missing_ok=True)


class PublishOnExit:
    """``with recorder:`` publishes on a clean exit (:meth:`close`) and keeps the hidden file on an exception
    (:meth:`_keep`); the subclass defines both."""

    def close(self) -> None:
        raise NotImplementedError

    def _keep(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self._keep()
