"""`validator probe gsm8k` into the store, then `validator compare` of two GSM8K runs (flipped questions)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.validator.workloads.test_gsm8k import DATA, _start_server
from validator.app.cli import main
from validator.workloads.gsm8k import load_questions


def _oracle(tmp: Path, wrong: tuple[int, ...]) -> Path:
    rows = load_questions(DATA, 6)
    for i in wrong:
        text, num = rows[i]["answer"].rsplit("#### ", 1)
        rows[i]["answer"] = f"{text}#### {int(num.replace(',', '')) + 1}"
    path = tmp / f"oracle-{'-'.join(map(str, wrong)) or 'right'}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def servers(tmp_path_factory) -> Iterator[tuple[str, str]]:
    tmp = tmp_path_factory.mktemp("gsm")
    right = _start_server(tmp, "--oracle", str(_oracle(tmp, ())), "--mode", "d-only")
    broken = _start_server(tmp, "--oracle", str(_oracle(tmp, (1, 3))), "--mode", "pd")
    a, b = next(right), next(broken)
    yield a, b
    for gen in (right, broken):
        gen.close()


def test_probe_stores_runs_and_compare_lists_flips(servers: tuple[str, str], tmp_path: Path, capsys) -> None:
    home = ["--home", str(tmp_path / "h")]
    for name, url in zip(("donly", "pd"), servers):
        code = main(home + ["probe", "gsm8k", "--url", url, "--data", str(DATA), "--limit", "6", "--name", name, "--json"])
        assert code == 0
        summary = json.loads(capsys.readouterr().out)
        assert summary["completion_rate"] == 1.0
    code = main(home + ["show", "pd", "--json"])
    assert [a["kind"] for a in json.loads(capsys.readouterr().out)["artifacts"]] == ["gsm8k"]
    code = main(home + ["compare", "donly", "pd", "--json"])
    doc = json.loads(capsys.readouterr().out)
    gsm = doc["gsm8k"]
    assert gsm["accuracy_a"] == 1.0 and gsm["accuracy_b"] == pytest.approx(4 / 6)
    assert sorted(f["index_b"] for f in gsm["flips"]) == [1, 3] and gsm["lost"] == 2
    assert gsm["verdict"] == "pass" and code == 0  # 2 of 6 lost is not significant (McNemar p = 0.5)
    code = main(home + ["compare", "donly", "pd"])
    assert "[gsm8k]" in capsys.readouterr().out
