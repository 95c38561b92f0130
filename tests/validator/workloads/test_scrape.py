"""Prometheus scraping: SGLang and vLLM text samples served on 127.0.0.1, windows, deltas, the bundle."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from validator.app.cli import main
from validator.errors import InputError
from validator.runs.sources import open_path
from validator.workloads.scrape import acceptance_from_scrapes, parse_prometheus, scrape_window

# vLLM exposition (prometheus_client): counters carry _total and a _created companion; two engines (DP)
VLLM = """# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{{engine="0",model_name="kimi-k3"}} {d0}
vllm:spec_decode_num_drafts_total{{engine="1",model_name="kimi-k3"}} {d1}
# TYPE vllm:spec_decode_num_drafts_created gauge
vllm:spec_decode_num_drafts_created{{engine="0",model_name="kimi-k3"}} 1.7e+09
# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="kimi-k3"}} {t0}
vllm:spec_decode_num_draft_tokens_total{{engine="1",model_name="kimi-k3"}} {t1}
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="kimi-k3"}} {a0}
vllm:spec_decode_num_accepted_tokens_total{{engine="1",model_name="kimi-k3"}} {a1}
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="kimi-k3",position="0"}} {p0}
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="kimi-k3",position="1"}} {p1}
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="kimi-k3",position="2"}} {p2}
# HELP vllm:num_requests_running Number of requests.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="kimi-k3"}} 3.0
"""

SGLANG = """# HELP sglang:spec_accept_length Mean acceptance length of speculative decoding.
# TYPE sglang:spec_accept_length gauge
sglang:spec_accept_length{{model_name="kimi-k3"}} {gauge}
# TYPE sglang:spec_accept_rate gauge
sglang:spec_accept_rate{{model_name="kimi-k3"}} 0.41
# HELP sglang:generation_tokens_total Number of generation tokens processed.
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{{is_streaming="false",model_name="kimi-k3"}} {gen_a}
sglang:generation_tokens_total{{is_streaming="true",model_name="kimi-k3"}} {gen_b}
# TYPE sglang:spec_verify_calls_total counter
sglang:spec_verify_calls_total{{model_name="kimi-k3"}} {verify}
sglang:spec_verify_calls_created{{model_name="kimi-k3"}} 1.7e+09
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{{model_name="kimi-k3",note="a \\"quoted\\" \\\\ value"}} +Inf
# EOF
"""


@pytest.fixture
def server() -> Iterator[tuple[str, list[str]]]:
    """Serves the queued pages in order (the last one again once exhausted)."""
    pages: list[str] = []
    served = [0]

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = pages[min(served[0], len(pages) - 1)].encode()
            served[0] += 1
            self.send_response(200 if self.path == "/metrics" else 404)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", pages
    finally:
        httpd.shutdown()
        httpd.server_close()
        t.join()


def vllm_page(scale: int) -> str:
    return VLLM.format(d0=100 * scale, d1=20 * scale, t0=300 * scale, t1=60 * scale, a0=150 * scale, a1=30 * scale,
                       p0=90 * scale, p1=60 * scale, p2=30 * scale)


def test_parser_handles_labels_escapes_and_special_values() -> None:
    samples, types = parse_prometheus(SGLANG.format(gauge="NaN", gen_a=1, gen_b=2, verify=3))
    assert types["sglang:spec_verify_calls_total"] == "counter"
    by = {(s.name, s.labels): s.value for s in samples}
    assert by[("sglang:generation_tokens_total", (("is_streaming", "true"), ("model_name", "kimi-k3")))] == 2
    odd = next(s for s in samples if s.name == "sglang:num_running_reqs")
    assert odd.label("note") == 'a "quoted" \\ value' and odd.value == float("inf")
    with pytest.raises(InputError, match="line 1"):
        parse_prometheus("not a metric line at all {")


def test_vllm_window_per_position(server: tuple[str, list[str]]) -> None:
    url, pages = server
    pages += [vllm_page(1), vllm_page(3)]
    start, end = scrape_window(url, 0.05)
    doc = acceptance_from_scrapes(start, end)
    acc = doc["acceptance"]
    assert doc["engine"] == "vllm" and doc["url"].endswith("/metrics")
    # deltas: drafts 240, draft tokens 720, accepted 360; per position (engine 0 only) 180, 120, 60
    assert acc["verify_steps"] == 240 and acc["proposed_tokens"] == 720 and acc["accepted_tokens"] == 360
    assert acc["mean_accepted_drafts"] == pytest.approx(1.5) and acc["mean_accept_length"] == pytest.approx(2.5)
    assert acc["draft_acceptance_rate"] == pytest.approx(0.5)
    pos = acc["per_position"]
    assert [p["accepted"] for p in pos] == [180, 120, 60]
    assert [p["reached"] for p in pos] == [240, 180, 120]
    assert [p["unconditional_rate"] for p in pos] == pytest.approx([0.75, 0.5, 0.25])
    assert [p["conditional_rate"] for p in pos] == pytest.approx([0.75, 2 / 3, 0.5])
    names = {c["name"] for c in doc["counters"]}
    assert "vllm:spec_decode_num_drafts_total" in names and "vllm:spec_decode_num_drafts_created" not in names


def test_sglang_window(server: tuple[str, list[str]]) -> None:
    url, pages = server
    pages += [SGLANG.format(gauge=3.1, gen_a=1000, gen_b=0, verify=400),
              SGLANG.format(gauge=2.9, gen_a=1800, gen_b=200, verify=800)]
    doc = acceptance_from_scrapes(*scrape_window(url + "/metrics", 0))
    acc = doc["acceptance"]
    assert doc["engine"] == "sglang"
    assert acc["verify_steps"] == 400 and acc["generated_tokens"] == 1000
    assert acc["mean_accept_length"] == pytest.approx(2.5) and acc["accepted_tokens"] == 600
    assert acc["gauges"]["sglang:spec_accept_length"] == {"start": [3.1], "end": [2.9]}
    assert acc["per_position"] == []


def test_counter_reset_and_missing_metrics(server: tuple[str, list[str]]) -> None:
    url, pages = server
    pages += [vllm_page(3), vllm_page(1)]
    with pytest.raises(InputError, match="went down"):
        acceptance_from_scrapes(*scrape_window(url, 0))
    pages[:] = ["# TYPE up gauge\nup 1\n"]
    with pytest.raises(InputError, match="no speculative-decoding metrics"):
        acceptance_from_scrapes(*scrape_window(url, 0))
    with pytest.raises(InputError, match="HTTP 404"):
        scrape_window(url + "/other", 0)


def test_cli_writes_an_ingestible_bundle(server: tuple[str, list[str]], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url, pages = server
    pages += [vllm_page(1), vllm_page(2)]
    out = tmp_path / "m1"
    home = tmp_path / "home"
    rc = main(["--home", str(home), "probe", "metrics", url, "--window", "0.01", "--name", "vllm-k3", "--out", str(out),
               "--label", "topology=PD", "--ingest"])
    assert rc == 0, capsys.readouterr().err
    text = capsys.readouterr().out
    assert "mean accept length (bonus incl.) 2.5000" in text and "stored as run 'vllm-k3'" in text
    doc = json.loads((out / "parts" / "metrics" / "metrics.json").read_text())
    assert doc["format"] == "validator-metrics" and doc["acceptance"]["verify_steps"] == 120
    view = open_path(out)
    assert view.name == "vllm-k3" and view.tensors == [] and view.labels == {"engine": "vllm", "source": "prometheus", "topology": "PD"}
    assert view.manifest["run"]["acceptance_metrics"]["mean_accept_length"] == pytest.approx(2.5)
    assert main(["--home", str(home), "show", "vllm-k3", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["manifest"]["run"]["acceptance_metrics"]["per_position_unconditional"] == pytest.approx([0.75, 0.5, 0.25])
    assert main(["probe", "metrics", url, "--window", "0", "--name", "x", "--out", str(out)]) == 2
    assert "already holds a metrics part" in capsys.readouterr().err
