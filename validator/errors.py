"""The error types every face (CLI, API, dashboard) turns into a clear message instead of a traceback."""

from __future__ import annotations

__all__ = ["ValidatorError", "InputError", "NotFoundError", "ConflictError", "StorageError"]


class ValidatorError(Exception):
    """Base class: a problem the user can act on. ``str(err)`` is the one-line message."""

    exit_code = 2
    http_status = 400


class InputError(ValidatorError):
    """Bad input: a corrupt file, an impossible shard layout, a bad policy. Names the file and tensor."""


class NotFoundError(ValidatorError):
    http_status = 404


class ConflictError(ValidatorError):
    http_status = 409


class StorageError(ValidatorError):
    """The store could not write (disk full, quota, I/O error): nothing was half-written. HTTP 507."""

    http_status = 507
