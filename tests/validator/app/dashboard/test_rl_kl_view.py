"""The RL KL page's pure view: chart geometry from a verdict document, and the template renders it escaped."""

from __future__ import annotations

import json

import numpy as np

from validator.app.dashboard.rl_kl_view import kl_chart, kl_page
from validator.judging.rl_kl import KLSettings, kl_by_step


def _doc(levels: list[float], samples: int = 6) -> dict[str, object]:
    rng = np.random.default_rng(1)
    st, sm, r = [], [], []
    for i, lv in enumerate(levels):
        n = samples * 20
        st.append(np.full(n, i))
        sm.append(np.repeat(np.arange(samples), 20))
        r.append(rng.normal(-lv, np.sqrt(2 * lv), n))
    lp = np.full(sum(x.size for x in st), -1.0)
    return kl_by_step(np.concatenate(st), np.concatenate(sm), lp, lp + np.concatenate(r), settings=KLSettings(floor_steps=3)).to_dict()


def test_chart_geometry() -> None:
    doc = _doc([2e-3] * 6 + [8e-3] * 2)
    c = kl_chart(doc)
    assert len(c["points"]) == 8 and len(c["bars"]) == 8
    xs = [p["x"] for p in c["points"]]
    assert xs == sorted(xs) and xs[0] == c["left"] and xs[-1] == c["right"]
    for p in c["points"]:
        assert c["top"] <= p["y"] <= c["bottom"]
    assert c["bottom"] > c["band_y"] > c["top"] and c["band_y"] < c["floor_y"]  # band above the floor (y grows down)
    high = [p for p in c["points"] if p["step"] >= 6]
    assert all(p["y"] < c["band_y"] for p in high)
    assert c["window_x"] is not None and xs[2] < c["window_x"] < xs[3]


def test_single_step_and_nan_intervals() -> None:
    doc = _doc([2e-3], samples=1)
    c = kl_chart(doc)
    assert len(c["points"]) == 1 and c["bars"] == []  # one sample: no interval
    json.dumps(kl_page("r", doc), allow_nan=False)


def test_template_renders_escaped() -> None:
    from validator.app.api.routes.dashboard import _env

    doc = _doc([2e-3] * 10)
    html = _env().get_template("rl_kl.html").render(**kl_page("<run>", doc), base="", asset_v="x", json_url="?format=json",
                                                     url_with=lambda **_: "")
    assert "&lt;run&gt;" in html and "<run>" not in html
    assert html.count("<circle") == 10 and "k3 per step" in html
