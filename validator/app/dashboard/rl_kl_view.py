"""The RL KL page's data: the verdict document of a stored run's logprob records, and a server-drawn SVG chart
(k3 per step with its 95% intervals, the floor and its band; no script). Pure: a document in, plain data out."""

from __future__ import annotations

import math
from typing import Any

__all__ = ["kl_chart", "kl_page"]

WIDTH, HEIGHT = 760, 280
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 12, 36


def _f(v: Any) -> float:
    return float(v) if isinstance(v, (int, float)) else math.nan


def kl_chart(doc: dict[str, Any]) -> dict[str, Any]:
    """SVG geometry for the k3 series of a ``validator rl kl --json`` document: points, interval bars, the floor
    line and band rectangle, axis ticks. Non-finite values are left out."""
    steps = doc["steps"]
    xs = [int(s["step"]) for s in steps]
    k3 = [_f(s["k3"]) for s in steps]
    lo = [_f(s["k3_ci"][0]) for s in steps]
    hi = [_f(s["k3_ci"][1]) for s in steps]
    floor, band = _f(doc["floor"]["value"]), _f(doc["floor"]["band"])
    top = max([v for v in (*k3, *hi, band) if math.isfinite(v)] + [1e-12]) * 1.08
    x0, x1 = (min(xs), max(xs)) if xs else (0, 1)
    span = max(x1 - x0, 1)

    def x(step: float) -> float:
        return LEFT + (step - x0) / span * (WIDTH - LEFT - RIGHT) if x1 > x0 else (LEFT + WIDTH - RIGHT) / 2

    def y(v: float) -> float:
        return TOP + (1 - max(v, 0.0) / top) * (HEIGHT - TOP - BOTTOM)

    points = [
        {"x": round(x(s), 1), "y": round(y(v), 1), "step": s, "k3": v, "status": st["status"]}
        for s, v, st in zip(xs, k3, steps)
        if math.isfinite(v)
    ]
    bars = [
        {"x": round(x(s), 1), "y1": round(y(a), 1), "y2": round(y(b), 1)}
        for s, a, b in zip(xs, lo, hi)
        if math.isfinite(a) and math.isfinite(b)
    ]
    ticks = [{"y": round(y(top * i / 4), 1), "label": f"{top * i / 4:.3g}"} for i in range(5)]
    n_xt = min(len(xs), 8)
    xticks = sorted({xs[round(i * (len(xs) - 1) / max(n_xt - 1, 1))] for i in range(n_xt)}) if xs else []
    window = [s["step"] for s in steps if s["role"] == "floor window"]
    return {
        "width": WIDTH,
        "height": HEIGHT,
        "left": LEFT,
        "right": WIDTH - RIGHT,
        "bottom": HEIGHT - BOTTOM,
        "top": TOP,
        "polyline": " ".join(f"{p['x']},{p['y']}" for p in points),
        "points": points,
        "bars": bars,
        "floor_y": round(y(floor), 1) if math.isfinite(floor) else None,
        "band_y": round(y(band), 1) if math.isfinite(band) else None,
        "window_x": round(x(max(window)) + 0.5 * (WIDTH - LEFT - RIGHT) / max(len(xs), 1), 1) if window else None,
        "yticks": ticks,
        "xticks": [{"x": round(x(s), 1), "label": str(s)} for s in xticks],
    }


def kl_page(run: str, doc: dict[str, Any]) -> dict[str, Any]:
    """Everything the page shows: the run, the verdict document, the chart."""
    return {"run": run, "kl": doc, "chart": kl_chart(doc)}
