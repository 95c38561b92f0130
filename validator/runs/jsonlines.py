"""JSON records one per line, refusing an object that names a key twice (``json`` and ``orjson`` keep the
last value silently, so ``{"train_logprob": -1.0, "train_logprob": -9.0}`` would be judged on -9.0).

:func:`check_unique` costs one character count per line after a fast parse: every key of an object is
followed by exactly one structural ``:``, so a line whose ``:`` count equals the keys its parsed value holds
names no key twice; only a line with more (a duplicate, or ``:`` inside strings) is parsed again with
``object_pairs_hook`` to tell which.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["DuplicateKeyError", "check_unique", "loads_unique"]


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
