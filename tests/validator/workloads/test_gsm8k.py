from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.paths import DATA as TEST_DATA
from tests.servers import free_port, start_process
from validator.errors import InputError
from validator.judging.gsm8k_scoring import (
    INVALID,
    flexible_answer,
    score_output,
    sglang_answer,
    strict_answer,
    summarize_rows,
)
from validator.workloads.gsm8k import (
    add_arguments,
    build_prompt,
    compare_gsm8k,
    load_gsm8k_rows,
    load_questions,
    run_from_args,
    run_gsm8k,
    select_shots,
)
from validator.workloads.gsm8k_client import ClientConfig, MalformedResponse, parse_response

DATA = TEST_DATA / "gsm8k" / "test.jsonl"
TRAIN = TEST_DATA / "gsm8k" / "train.jsonl"
needs_data = pytest.mark.skipif(not DATA.is_file(), reason="GSM8K test data not present")


# -- answer extraction and scoring --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "sglang", "strict", "flexible"),
    [
        ("She makes 9 * 2 = $18.\n#### 18", 18, "18", "18"),
        ("The total is 1,234 dollars.", 1234, None, "1,234"),
        ("#### -5", 5, "-5", "-5"),
        ("It costs $3.50, so 7 in all", 7, None, "7"),
        ("no number here", INVALID, None, None),
        ("#### 12 and later 13", 13, "12", "13"),
    ],
)
def test_extraction_rules(text: str, sglang: int, strict: str | None, flexible: str | None) -> None:
    assert sglang_answer(text) == sglang
    assert strict_answer(text) == strict
    assert flexible_answer(text) == flexible


def test_scoring_normalises_like_lm_eval() -> None:
    ref = "Some working.\n#### 1,234"
    _, c = score_output("so $1,234.\n#### $1,234.", ref)
    assert c == {"sglang": True, "strict": False, "flexible": True}  # strict regex does not take '$'
    _, c = score_output("#### 1234.", ref)
    assert c == {"sglang": True, "strict": True, "flexible": True}
    answers, c = score_output(None, ref)
    assert answers["sglang"] is None and not any(c.values())


def _row(i: int, ok: bool = True, correct: bool = True, **kw) -> dict:
    row = {"index": i, "question": f"q{i}", "question_hash": f"h{i}", "reference": "1", "in_shots": i < 1,
           "ok": ok, "output": "#### 1" if ok else None, "finish_reason": "stop" if ok else None,
           "completion_tokens": 10 if ok else None, "latency_s": 0.5, "spec": {}, "error": None,
           "error_kind": None if ok else "timeout", "answers": {"sglang": 1, "strict": "1", "flexible": "1"},
           "correct": {r: correct and ok for r in ("sglang", "strict", "flexible")}}
    row.update(kw)
    return row


def test_summary_conventions() -> None:
    rows = [
        _row(0, spec={"spec_verify_ct": 4, "spec_num_correct_drafts": 5, "spec_num_proposed_drafts": 16,
                      "spec_accept_histogram": [1, 2, 1]}),
        _row(1, correct=False, finish_reason="length", completion_tokens=30,
             spec={"spec_verify_ct": 11, "spec_num_correct_drafts": 18, "spec_num_proposed_drafts": 44,
                   "spec_correct_drafts_histogram": [2, 3, 4, 2]}),
        _row(2, ok=False),
        _row(3, completion_tokens=5),  # no spec fields: not in the acceptance aggregates
    ]
    s = summarize_rows(rows, total_time_s=2.0, concurrency=8)
    assert s["accuracy"] == 0.5 and s["completion_rate"] == 0.75 and s["errors"] == {"timeout": 1}
    assert s["truncated"] == 1 and s["completion_tokens"] == 45 and s["output_tokens_per_s"] == 22.5
    assert s["mean_accept_length"] == pytest.approx(40 / 15)  # sum tokens / sum verify steps
    assert s["mean_accepted_drafts"] == pytest.approx(23 / 15)
    assert s["accept_rate"] == pytest.approx(23 / 60)
    assert s["accept_histogram"] == [3, 5, 5, 2]
    assert s["accuracy_excluding_shots"] == pytest.approx(1 / 3)


def test_compare_matches_by_question_and_lists_flips() -> None:
    a = [_row(i) for i in range(6)]
    b = [_row(i, correct=i not in (2, 4)) for i in reversed(range(6))] + [_row(9)]
    b[0]["output"] = "#### 7"
    a[1]["correct"] = {r: False for r in ("sglang", "strict", "flexible")}  # question 1 gained in B
    c = compare_gsm8k(a, b, names=("ref", "cand"))
    assert c["matched"] == 6 and c["only_in_b"] == 1 and c["only_in_a"] == 0
    assert c["accuracy_a"] == pytest.approx(5 / 6) and c["accuracy_b"] == pytest.approx(4 / 6)
    assert c["delta"] == pytest.approx(-1 / 6)
    assert (c["lost"], c["gained"]) == (2, 1)
    assert {f["question_hash"] for f in c["flips"]} == {"h1", "h2", "h4"}
    assert "lost" in c["table"] and "cand" in c["table"] and 0 < c["mcnemar_p"] <= 1
    same = compare_gsm8k(a, a)
    assert same["delta"] == 0 and same["flips"] == [] and same["mcnemar_p"] == 1.0


def test_parse_response_rejects_malformed_bodies() -> None:
    ok = parse_response("sglang", json.dumps({"text": "x", "meta_info": {
        "completion_tokens": 3, "finish_reason": {"type": "length"}, "spec_verify_ct": 2}}).encode())
    assert ok["finish_reason"] == "length" and ok["spec"] == {"spec_verify_ct": 2}
    oa = parse_response("openai", json.dumps({"choices": [{"text": "y", "finish_reason": "stop"}],
                                              "usage": {"completion_tokens": 1}}).encode())
    assert oa["output"] == "y" and oa["completion_tokens"] == 1 and oa["spec"] == {}
    for body in (b"<html>", b"[1]", b'{"meta_info": {}}', b'{"text": "x", "meta_info": {"completion_tokens": -1}}'):
        with pytest.raises(MalformedResponse):
            parse_response("sglang", body)
    with pytest.raises(MalformedResponse):
        parse_response("openai", b'{"choices": []}')


# -- data and prompts ---------------------------------------------------------------------------------


def test_prompt_format_and_shots(tmp_path: Path) -> None:
    shots = [{"question": "A?", "answer": "a\n#### 1"}, {"question": "B?", "answer": "b\n#### 2"}]
    assert build_prompt("C?", shots) == "Question: A?\nAnswer: a\n#### 1\n\nQuestion: B?\nAnswer: b\n#### 2\n\nQuestion: C?\nAnswer:"
    assert build_prompt("C?", []) == "Question: C?\nAnswer:"
    train = [{"question": f"t{i}", "answer": f"#### {i}"} for i in range(20)]
    s1 = select_shots("lm-eval", shots, train, 5, seed=3)
    assert s1 == select_shots("lm-eval", shots, train, 5, seed=3) and len({s["question"] for s in s1}) == 5
    assert select_shots("sglang", train, None, 3) == train[:3]
    with pytest.raises(InputError):
        select_shots("lm-eval", shots, None, 5)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q", "answer": "no marker"}\n')
    with pytest.raises(InputError, match="line 1"):
        load_questions(bad)


def _args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args(argv)


def test_without_data_or_datasets_the_error_is_clear(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets -> ImportError
    with pytest.raises(InputError, match="--data FILE"):
        run_from_args(_args(["--url", "http://127.0.0.1:9"]))


# -- end to end against the harness server ----------------------------------------------------------


def _start_server(tmp: Path, *args: str) -> Iterator[str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "validator.workloads.harness.generate_server", "--port", str(port), *args]
    with start_process(cmd, url + "/health", log_path=tmp / f"server-{port}.log"):
        yield url


@pytest.fixture(scope="module")
def oracle(tmp_path_factory) -> Path:
    """The first 8 test answers, two of them made wrong (questions 5 and 6: the answer + 1)."""
    rows = load_questions(DATA, 8)
    for i in (5, 6):
        text, num = rows[i]["answer"].rsplit("#### ", 1)
        rows[i]["answer"] = f"{text}#### {int(num.replace(',', '')) + 1}"
    path = tmp_path_factory.mktemp("oracle") / "oracle.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def server(tmp_path_factory, oracle: Path) -> Iterator[str]:
    yield from _start_server(tmp_path_factory.mktemp("srv"), "--oracle", str(oracle), "--mode", "pd")


@pytest.fixture(scope="module")
def faulty_server(tmp_path_factory, oracle: Path) -> Iterator[str]:
    yield from _start_server(tmp_path_factory.mktemp("srv"), "--oracle", str(oracle), "--malformed-every", "3",
                             "--slow-every", "5", "--slow-seconds", "6")


@needs_data
def test_probe_against_a_live_server(server: str, tmp_path: Path, capsys) -> None:
    before = httpx.get(server + "/stats").json()
    ingested: list[Path] = []
    code = run_from_args(_args(["--url", server, "--data", str(DATA), "--limit", "8", "--concurrency", "1,2",
                                "--out", str(tmp_path / "out"), "--json", "--label", "deployment=harness-pd"]),
                         ingest=ingested.append)
    runs = json.loads(capsys.readouterr().out)["runs"]
    after = httpx.get(server + "/stats").json()
    assert code == 0 and [r["concurrency"] for r in runs] == [1, 2]
    assert ingested == [tmp_path / "out" / "c1", tmp_path / "out" / "c2"]
    for r in runs:
        assert r["accuracy"] == 0.75 and r["accuracy_flexible"] == 0.75
        assert r["accuracy_strict"] == 0.625  # question 7's answer is over 512 bytes: cut before '####'
        assert r["completion_rate"] == 1.0 and r["truncated"] == 1 and r["failed"] == 0
        assert r["shot_overlap"] == 5 and r["shot_overlap_indices"] == [0, 1, 2, 3, 4]
        assert r["accuracy_excluding_shots"] == pytest.approx(1 / 3)
        assert r["output_tokens_per_s"] > 0
    # the server is deterministic: both runs did the same work, and together all that the server did
    assert runs[0]["accept_histogram"] == runs[1]["accept_histogram"]
    done = {k: after[k] - before[k] for k in ("completion_tokens", "spec_verify_ct", "spec_num_correct_drafts")}
    assert 2 * runs[0]["completion_tokens"] == done["completion_tokens"]
    assert 2 * runs[0]["spec_verify_ct"] == done["spec_verify_ct"]
    assert runs[0]["mean_accept_length"] == pytest.approx(done["completion_tokens"] / done["spec_verify_ct"])
    assert runs[0]["mean_accepted_drafts"] == pytest.approx(done["spec_num_correct_drafts"] / done["spec_verify_ct"])
    assert [2 * x for x in runs[0]["accept_histogram"]] == [
        a - b for a, b in zip(after["spec_accept_histogram"], before["spec_accept_histogram"])]
    assert 1.5 < runs[0]["mean_accept_length"] < 3.5
    # the bundle
    bundle = tmp_path / "out" / "c2"
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["format"] == "validator-bundle" and manifest["version"] == 1
    assert manifest["run"]["labels"]["workload"] == "gsm8k-8" and manifest["run"]["labels"]["concurrency"] == "2"
    assert manifest["run"]["labels"]["deployment"] == "harness-pd"
    part = json.loads((bundle / "parts" / "gsm8k" / "part.json").read_text())
    assert part["part"] == "gsm8k" and part["tensors"] == []
    assert part["extra"]["gsm8k_summary"]["accuracy"] == 0.75
    rows = load_gsm8k_rows(bundle)
    assert len(rows) == 8 and [r["index"] for r in rows] == list(range(8))
    assert sum(r["spec"]["spec_verify_ct"] for r in rows) == runs[1]["spec_verify_ct"]
    assert not rows[5]["correct"]["sglang"] and rows[5]["answers"]["sglang"] == 65
    c = compare_gsm8k(load_gsm8k_rows(tmp_path / "out" / "c1"), rows)
    assert c["matched"] == 8 and c["delta"] == 0 and c["flips"] == []


@needs_data
def test_openai_api_and_truncation(server: str) -> None:
    questions = load_questions(DATA, 4)
    cfg = ClientConfig(url=server, api="openai", max_new_tokens=48, stop=("Question",))
    run = run_gsm8k(questions, questions[:2], cfg, 2)
    s = run.summary
    assert s["completion_rate"] == 1.0 and s["truncated"] == 4 and s["completion_tokens"] == 4 * 48
    assert s["mean_accept_length"] is None and s["accept_histogram"] is None  # no spec_* on /v1/completions
    assert s["shot_overlap"] == 2 and s["api"] == "openai"


@needs_data
def test_malformed_and_slow_responses_are_recorded_not_fatal(faulty_server: str, tmp_path: Path, capsys) -> None:
    code = run_from_args(_args(["--url", faulty_server, "--data", str(DATA), "--limit", "6", "--timeout", "3",
                                "--max-new-tokens", "96", "--out", str(tmp_path / "b"), "--json"]))
    s = json.loads(capsys.readouterr().out)
    assert code == 1
    # requests 3 and 6 malformed (bad JSON, then JSON without 'text'), request 5 slower than the timeout
    assert s["errors"] == {"malformed": 2, "timeout": 1} and s["completed"] == 3 and s["completion_rate"] == 0.5
    rows = load_gsm8k_rows(tmp_path / "b")
    assert [r["error_kind"] for r in rows] == [None, None, "malformed", None, "timeout", "malformed"]
    assert "not JSON" in rows[2]["error"] and "'text'" in rows[5]["error"]
    assert all(r["output"] is None and not r["correct"]["sglang"] for r in rows if r["error_kind"])
    assert s["accept_histogram"] is not None and sum(s["accept_histogram"]) == s["spec_verify_ct"]


def test_refused_connection_is_recorded(tmp_path: Path, capsys) -> None:
    data = tmp_path / "q.jsonl"
    data.write_text("".join(json.dumps({"question": f"q{i}?", "answer": f"#### {i}"}) + "\n" for i in range(3)))
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    code = run_from_args(_args(["--url", url, "--data", str(data), "--limit", "3", "--shots", "0", "--json",
                                "--out", str(tmp_path / "b")]))
    s = json.loads(capsys.readouterr().out)
    assert code == 1 and s["completion_rate"] == 0.0 and s["errors"] == {"connect": 3}
    assert s["accuracy"] == 0.0 and s["mean_accept_length"] is None and s["output_tokens_per_s"] == 0.0
    assert all("cannot connect" in r["error"] for r in load_gsm8k_rows(tmp_path / "b"))
    with pytest.raises(InputError, match="already exists"):  # refused before any request is sent
        run_from_args(_args(["--url", url, "--data", str(data), "--limit", "3", "--shots", "0",
                             "--out", str(tmp_path / "b")]))
    # no --out but an ingest callback: a temporary bundle, complete when ingested, removed afterwards
    seen: list[tuple[Path, bool]] = []
    run_from_args(_args(["--url", url, "--data", str(data), "--limit", "3", "--shots", "0", "--name", "x"]),
                  ingest=lambda p: seen.append((p, (p / "parts" / "gsm8k" / "part.json").is_file())))
    assert len(seen) == 1 and seen[0][1] and not seen[0][0].exists()
    assert json.loads((tmp_path / "b" / "manifest.json").read_text())["run"]["labels"]["workload"] == "gsm8k-3"
