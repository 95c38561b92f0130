"""JSON records one per line, refusing an object that names a key twice (``json`` and ``orjson`` keep the
last value silently, so ``{"train_logprob": -1.0, "train_logprob": -9.0}`` would be judged on -9.0).

:func:`check_unique` costs one character count per line after a fast parse: every key of an object is
followed by exactly one structural ``:``, so a line whose ``:`` count equals the keys its parsed value holds
names no key twice; only a line with more (a duplicate, or ``:`` inside strings) is parsed again with
``object_pairs_hook`` to tell which.

:func:`json_lines` is the one JSONL line loop: line numbers from 1, blank lines skipped, every problem one
message naming file, line and problem (``f.jsonl line 3: not valid JSON (...)``, ``f.jsonl line 4: key 'a' appears
twice in one object``). Opening the file is the caller's (each names its own read error); what a parsed line must
hold is the caller's too.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from validator.errors import InputError

__all__ = ["DuplicateKeyError", "check_unique", "json_lines", "loads_unique"]


class DuplicateKeyError(ValueError):
    """An object of the line names a key twice."""


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for k, _ in pairs:
            if k in seen:
                raise DuplicateKeyError(f"key {k[:100]!r} appears twice in one object")
            seen.add(k)
    return out


def loads_unique(text: str | bytes) -> Any:
    """``json.loads``, refusing an object with a repeated key (:class:`DuplicateKeyError`)."""
    return json.loads(text, object_pairs_hook=_unique)


def _keys(value: Any) -> int:
    if isinstance(value, dict):
        return len(value) + sum(_keys(v) for v in value.values() if isinstance(v, (dict, list)))
    if isinstance(value, list):
        return sum(_keys(v) for v in value if isinstance(v, (dict, list)))
    return 0


def check_unique(line: str, value: Any) -> None:
    """Raise :class:`DuplicateKeyError` when ``line`` (which parsed to ``value``) names a key twice in an object."""
    colons = line.count(":")
    # a flat object (a record) settles it at once: its keys are at least len(value)
    if colons and not (type(value) is dict and colons <= len(value)) and colons > _keys(value):
        loads_unique(line)


def json_lines(
    where: str | os.PathLike[str],
    lines: Iterable[str],
    limit: int | None = None,
    *,
    error: type[InputError] = InputError,
) -> Iterator[tuple[int, Any]]:
    """``(line number, parsed JSON)`` for each non-blank line of ``lines``; ``where`` names the file in errors.

    A line that is not JSON (or nests too deep to parse), an object that names a key twice, or text that is not
    UTF-8 raises ``error`` (an :class:`InputError` subclass: the reader's own) with ``"{where} line {n}: {problem}"``.
    orjson parses when it is installed (5x json's speed on a million lines); what it refuses (NaN, ``1e999``,
    integers past 64 bits) json reads, and json's message names what neither reads.

    With ``limit``, stops before reading (or parsing) a line once ``limit`` objects were yielded: the callers take
    each object or raise, so this is "the first ``limit`` rows", and a bad line after them is never looked at.
    """
    fast_loads: Callable[[str], Any]
    try:
        from orjson import loads as fast_loads
    except ImportError:  # the workloads' machines may have no orjson
        fast_loads = json.loads
    taken = 0
    try:
        for n, line in enumerate(lines, 1):
            if limit is not None and taken >= limit:
                return
            if not line.strip():
                continue
            try:
                try:
                    obj = fast_loads(line)
                except ValueError:
                    obj = json.loads(line)
                check_unique(line, obj)
            except DuplicateKeyError as exc:
                raise error(f"{where} line {n}: {exc}") from None
            except (ValueError, RecursionError) as exc:
                raise error(f"{where} line {n}: not valid JSON ({exc})") from None
            taken += 1
            yield n, obj
    except UnicodeDecodeError:  # from a text file's decoder, chunks ahead of the line it names
        raise error(f"{where}: not UTF-8 text") from None
