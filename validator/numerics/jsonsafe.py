"""Numbers a JSON document can hold. JSON has no NaN or infinity, so every document the validator writes (a
comparison, a KL report, a manifest diff, the dashboard's JSON pages) holds a non-finite float as the string
``"nan"``, ``"inf"`` or ``"-inf"``; a reader turns them back with ``float()``. A document of counts (a
workload's ``metrics.json``) holds ``null`` instead, where a count has no finite value.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["json_safe"]


def json_safe(value: Any, *, nonfinite_as_null: bool = False, str_keys: bool = False) -> Any:
    """``value`` with every non-finite float (NumPy's float64 included) as ``"nan"``, ``"inf"`` or ``"-inf"``,
    or as ``None`` with ``nonfinite_as_null``; dicts, lists and tuples are walked (a tuple becomes a list), keys
    kept as they are or made strings with ``str_keys``. Anything else is returned unchanged."""
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        if nonfinite_as_null:
            return None
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {
            (str(k) if str_keys else k): json_safe(v, nonfinite_as_null=nonfinite_as_null, str_keys=str_keys)
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [json_safe(v, nonfinite_as_null=nonfinite_as_null, str_keys=str_keys) for v in value]
    return value
