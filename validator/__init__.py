"""validator: numerical-equivalence and acceptance validation for LLM inference.

Importing the package is cheap: the store and the server stack load only when used.
"""

from __future__ import annotations

from typing import Any

from validator.errors import ConflictError, InputError, NotFoundError, ValidatorError
from validator.settings import Settings

__all__ = [
    "Settings",
    "ValidatorError",
    "InputError",
    "NotFoundError",
    "ConflictError",
    "Service",
    "compare_tensors",
    "TensorMetrics",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name == "Service":
        from validator.service import Service

        return Service
    if name in ("compare_tensors", "TensorMetrics"):
        from validator.numerics import metrics

        return getattr(metrics, name)
    raise AttributeError(name)
