"""Package attributes loaded on first use (PEP 562), so that importing a package costs only what is used:
``probes.shards`` must not pull in torch through ``probes/__init__.py``."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any


def lazy_attributes(
    package: str, namespace: dict[str, Any], exports: Mapping[str, str], submodules: Iterable[str], names: Iterable[str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``: ``exports`` maps a name to the submodule defining
    it (imported, then cached in ``namespace``); ``submodules`` are importable as attributes."""
    subs = frozenset(submodules)
    listed = frozenset(names)

    def getattr_(name: str) -> Any:
        if name in exports:
            value = getattr(importlib.import_module(f".{exports[name]}", package), name)
            namespace[name] = value
            return value
        if name in subs:
            return importlib.import_module(f".{name}", package)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def dir_() -> list[str]:
        return sorted(set(namespace) | listed | subs)

    return getattr_, dir_
