"""Plain-text formatting that the CLI, the comparison report and the dashboard share: numbers as the CLI
prints them and aligned tables. Imports nothing heavy, so commands that only list or show runs stay fast."""

from __future__ import annotations

import math
from typing import Any

__all__ = ["fmt_num", "format_rows"]


def fmt_num(v: Any, digits: int = 3) -> str:
    if v is None:
        return "-"
    if isinstance(v, str):
        return v
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return f"{v:.{digits + 1}g}"
    return str(v)


def format_rows(header: list[str], rows: list[list[str]]) -> str:
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(header)]
    out = ["  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip(), "  ".join("-" * w for w in widths)]
    out += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join(out)
