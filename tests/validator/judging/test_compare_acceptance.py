"""`validator compare` with acceptance records: JSONL files directly, bundles, and stored runs."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from probes import AcceptanceRecorder, BundleWriter
from tests.validator.judging.acceptance_factories import make_records
from validator.app.cli import main
from validator.runs.acceptance_records import write_acceptance_jsonl

RATES = [0.8, 0.7, 0.6, 0.5]


def _jsonl(path: Path, records: list[dict]) -> Path:
    write_acceptance_jsonl(records, path)
    return path


def test_jsonl_files_compare_directly(tmp_path: Path, capsys) -> None:
    a = _jsonl(tmp_path / "d_only.jsonl", make_records(40000, RATES, seed=1))
    same = _jsonl(tmp_path / "pd.jsonl", make_records(40000, RATES, seed=2))
    shifted = _jsonl(tmp_path / "pd_bad.jsonl", make_records(20000, [0.8, 0.7, 0.52, 0.5], seed=3))
    home = ["--home", str(tmp_path / "h")]
    code = main(home + ["compare", str(a), str(same), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0 and doc["verdict"] == "pass" and doc["acceptance"]["verdict"] == "pass"
    assert doc["pairs"] == []
    code = main(home + ["compare", str(a), str(shifted)])
    out = capsys.readouterr().out
    assert code == 1 and "[acceptance]" in out and "verdict: FAIL" in out
    small = _jsonl(tmp_path / "small.jsonl", make_records(200, RATES, seed=4))
    code = main(home + ["compare", str(a), str(small), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 3 and doc["acceptance"]["verdict"] == "inconclusive"


def test_bundle_with_tensors_and_acceptance_round_trips_through_the_store(tmp_path: Path, capsys) -> None:
    def bundle(name: str, seed: int, rates: list[float]) -> Path:
        root = tmp_path / name
        with BundleWriter(root, run_name=name, part="rank0") as w:
            w.add("draft.logits", torch.ones(4, 8), step=0)
        with AcceptanceRecorder(root, part="verify") as rec:  # a part with acceptance records only
            for r in make_records(20000, rates, seed=seed):
                rec.record(r["request_id"], r["proposed"], r["accepted"], step=r["step"])
        return root

    home = ["--home", str(tmp_path / "h")]
    assert main(home + ["ingest", str(bundle("donly", 1, RATES))]) == 0
    assert main(home + ["ingest", str(bundle("pd", 2, [0.8, 0.7, 0.52, 0.5]))]) == 0
    capsys.readouterr()
    code = main(home + ["show", "donly", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert [a["kind"] for a in doc["artifacts"]] == ["acceptance"]
    code = main(home + ["compare", "donly", "pd", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 1
    assert doc["counts"]["pass"] == 1  # the tensor matches...
    assert doc["acceptance"]["verdict"] == "fail"  # ...but position 2 drifted
    failing = [p for p in doc["acceptance"]["positions"] if p["verdict"] == "different"]
    assert [p["position"] for p in failing] == [2]


def test_acceptance_policy_section(tmp_path: Path, capsys) -> None:
    a = _jsonl(tmp_path / "a.jsonl", make_records(20000, RATES, seed=1))
    b = _jsonl(tmp_path / "b.jsonl", make_records(20000, [0.8, 0.7, 0.57, 0.5], seed=3))
    pol = tmp_path / "p.toml"
    pol.write_text("[acceptance]\nmargin = 0.05\n")
    home = ["--home", str(tmp_path / "h")]
    assert main(home + ["compare", str(a), str(b), "--policy", str(pol)]) == 0
    pol.write_text("[acceptance]\nmargn = 0.05\n")
    assert main(home + ["compare", str(a), str(b), "--policy", str(pol)]) == 2
    assert "unknown [acceptance] key" in capsys.readouterr().err
    pol.write_text("[acceptance]\nlog_odds_margin = 0.3\n")  # 0.6 -> 0.57 is a log odds ratio of -0.12
    assert main(home + ["compare", str(a), str(b), "--policy", str(pol), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["acceptance"]["settings"]["margin_scale"] == "log_odds" and doc["acceptance"]["settings"]["margin"] == 0.3
    pol.write_text("[acceptance]\nmargin = 0.05\nlog_odds_margin = 0.3\n")
    assert main(home + ["compare", str(a), str(b), "--policy", str(pol)]) == 2
    assert "not both" in capsys.readouterr().err


def test_malformed_jsonl_is_one_line_exit_2(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"request_id": "r", "step": 0, "proposed": [1, 2], "accepted": 5}\n')
    code = main(["--home", str(tmp_path / "h"), "compare", str(bad), str(bad)])
    err = capsys.readouterr().err
    assert code == 2 and "bad.jsonl" in err and "line 1" in err and len(err.strip().splitlines()) == 1
