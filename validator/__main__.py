"""``python -m validator``: the same as the ``validator`` command."""

from validator.app.cli import entry

entry()
