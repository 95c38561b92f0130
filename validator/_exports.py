"""A subpackage's public names, imported from their modules on first use (PEP 562).

Each subpackage's ``__init__`` lists what it offers, module by module; nothing is imported until a name is
used, so ``validator.judging.text`` does not pull torch in through ``validator.judging.compare``."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def public(package: str, table: Mapping[str, Sequence[str]]) -> tuple[Callable[[str], Any], list[str]]:
    """``(__getattr__, __all__)`` for ``package``: ``table`` maps each submodule to the names it exports."""
    where = {name: module for module, names in table.items() for name in names}

    def getattr_(name: str) -> Any:
        if name in where:
            return getattr(importlib.import_module(f"{package}.{where[name]}"), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return getattr_, sorted(where)
