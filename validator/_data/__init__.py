"""Files the package reads at run time: the dashboard's templates and static files, and the Alembic migrations.

They live at the top of the repository, in ``dashboards/`` and ``migrations/``. The build maps those folders
into this package as ``validator._data.dashboards`` and ``validator._data.migrations`` (``setup.py``), so a
wheel carries them and an editable install finds them where they are. Code finds them here, through
:mod:`importlib.resources`, never relative to a checkout.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from importlib.resources import as_file, files
from pathlib import Path

__all__ = ["dashboards_dir", "migrations_dir"]

_held = contextlib.ExitStack()  # a dashboard extracted from a zipped install stays for the life of the process


@functools.cache
def dashboards_dir() -> Path:
    """The dashboard's folder on disk: ``templates/`` and ``static/``."""
    return _held.enter_context(as_file(files(f"{__name__}.dashboards")))


@contextlib.contextmanager
def migrations_dir() -> Iterator[Path]:
    """The Alembic script folder on disk (``env.py``, ``versions/``), for as long as the block runs."""
    with as_file(files(f"{__name__}.migrations")) as path:
        yield path
