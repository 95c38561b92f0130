"""A subpackage's public names, imported from their modules on first use (PEP 562).

Each subpackage's ``__init__`` lists what it offers, module by module; nothing is imported until a name is
used, so ``validator.judging.text`` does not pull torch in through ``validator.judging.compare``. The one
helper is :func:`probes.core.lazy.lazy_exports` (probes is the lower layer); this is its ``(__getattr__,
__all__)`` form."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from probes.core.lazy import lazy_exports


def public(package: str, table: Mapping[str, Sequence[str]]) -> tuple[Callable[[str], Any], list[str]]:
    """``(__getattr__, __all__)`` for ``package``: ``table`` maps each submodule to the names it exports."""
    getattr_, _, names = lazy_exports(package, table)
    return getattr_, names
