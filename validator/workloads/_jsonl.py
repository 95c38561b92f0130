"""Reading JSONL input line by line: the loop :mod:`validator.workloads.hf_pd` and :mod:`validator.workloads.gsm8k`
share (line numbers from 1, blank lines skipped, a line that is not JSON an :class:`InputError` naming file and line).

Reading the file is the caller's (each names its own read error); what a parsed line must hold is the caller's too.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from typing import Any

from validator.errors import InputError

__all__ = ["json_lines"]


def json_lines(where: str | os.PathLike[str], lines: Iterable[str], limit: int | None = None) -> Iterator[tuple[int, Any]]:
    """``(line number, parsed JSON)`` for each non-blank line of ``lines``; ``where`` names the file in errors.

    With ``limit``, stops before reading (or parsing) a line once ``limit`` objects were yielded: the callers take
    each object or raise, so this is "the first ``limit`` rows", and a bad line after them is never looked at.
    """
    taken = 0
    for n, line in enumerate(lines, 1):
        if limit is not None and taken >= limit:
            return
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise InputError(f"{where} line {n}: not JSON ({exc})") from None
        taken += 1
        yield n, obj
