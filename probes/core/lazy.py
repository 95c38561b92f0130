"""A package's public names, imported from their modules on first use (PEP 562).

Each package's ``__init__`` lists what it offers, module by module; nothing is imported until a name is used,
so importing ``probes.core.shards`` does not pull torch in through ``probes/__init__.py``, and
``validator.judging.text`` does not pull it in through ``validator.judging.compare`` (``validator._exports``
uses this helper). Standard library only.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, table: Mapping[str, Sequence[str]], submodules: Iterable[str] = ()
) -> tuple[Callable[[str], Any], Callable[[], list[str]], list[str]]:
    """``(__getattr__, __dir__, __all__)`` for ``package``.

    ``table`` maps each submodule (relative to ``package``, dotted for deeper ones) to the names it exports:
    a name is imported from its submodule on first use, then kept in the package's namespace. ``submodules``
    are importable as attributes. ``__all__`` is the exported names, sorted.
    """
    where = {name: module for module, names in table.items() for name in names}
    subs = frozenset(submodules)
    names = sorted(where)

    def getattr_(name: str) -> Any:
        if name in where:
            value = getattr(importlib.import_module(f"{package}.{where[name]}"), name)
            setattr(sys.modules[package], name, value)
            return value
        if name in subs:
            return importlib.import_module(f"{package}.{name}")
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def dir_() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(names) | subs)

    return getattr_, dir_, names
