"""Engine counters scraped from two deployments, stored as runs, compared position by position."""

from __future__ import annotations

import json
import time
from pathlib import Path

from validator.app.cli import main
from validator.judging.engine_metrics import compare_engine_metrics
from validator.workloads.scrape import Scrape, acceptance_from_scrapes, parse_prometheus, write_metrics_bundle

PAGE = """# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{{model_name="k3"}} {drafts}
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{{model_name="k3"}} {tokens}
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{{model_name="k3"}} {acc}
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{{model_name="k3",position="0"}} {p0}
vllm:spec_decode_num_accepted_tokens_per_pos_total{{model_name="k3",position="1"}} {p1}
"""


def _doc(drafts: int, p0: int, p1: int) -> dict:
    def scrape(scale: int, t: float) -> Scrape:
        text = PAGE.format(drafts=drafts * scale, tokens=2 * drafts * scale, acc=(p0 + p1) * scale, p0=p0 * scale, p1=p1 * scale)
        samples, types = parse_prometheus(text)
        return Scrape(url="http://127.0.0.1:1/metrics", time=t, samples=tuple(samples), types=types)

    now = time.time()
    return acceptance_from_scrapes(scrape(0, now), scrape(1, now + 60))


def test_pure_comparison_against_hand_computed_rates() -> None:
    a, b = _doc(100000, 80000, 56000), _doc(100000, 80100, 52000)
    out = compare_engine_metrics(a, b)
    p0, p1 = out["positions"]
    assert p0["rate_a"] == 0.8 and p0["rate_b"] == 0.801 and p0["verdict"] == "equivalent"
    assert abs(p1["diff"] - (-0.04)) < 1e-12 and p1["verdict"] == "different"
    assert out["verdict"] == "fail"
    small = compare_engine_metrics(_doc(500, 400, 280), _doc(500, 400, 280))
    assert small["verdict"] == "inconclusive"  # 500 steps cannot show equivalence within 0.02


def test_stored_metrics_runs_compare(tmp_path: Path, capsys) -> None:
    home = ["--home", str(tmp_path / "h")]
    write_metrics_bundle(_doc(100000, 80000, 56000), tmp_path / "donly", name="donly")
    write_metrics_bundle(_doc(100000, 80000, 52000), tmp_path / "pd", name="pd")
    assert main(home + ["ingest", str(tmp_path / "donly")]) == 0
    assert main(home + ["ingest", str(tmp_path / "pd")]) == 0
    capsys.readouterr()
    code = main(home + ["compare", "donly", "pd", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 1 and doc["engine_metrics"]["verdict"] == "fail"
    assert [p["verdict"] for p in doc["engine_metrics"]["positions"]] == ["equivalent", "different"]
