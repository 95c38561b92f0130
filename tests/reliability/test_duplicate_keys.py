"""A JSON record naming a key twice is refused with its file and line (json would keep the last value
silently): logprob records (`validator rl kl`) and acceptance records (bundles)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.servers import VALIDATOR
from validator.runs.acceptance_records import AcceptanceInputError, read_acceptance_jsonl
from validator.runs.jsonlines import DuplicateKeyError, check_unique, loads_unique
from validator.runs.logprob_records import LogprobInputError, read_logprob_jsonl

LOGPROB = '{"step": 0, "sample_id": "a", "token_index": %d, "rollout_logprob": -0.5, "train_logprob": -0.25}\n'


@pytest.mark.parametrize(
    "line",
    [
        '{"step": 0, "sample_id": "a", "token_index": 1, "rollout_logprob": -0.5, "train_logprob": -0.25, "train_logprob": -9}',
        '{"step": 0, "step" : 1, "sample_id": "a", "token_index": 1, "rollout_logprob": -0.5, "train_logprob": -0.25}',
        '{"step": 0, "sample_id": "a", "token_index": 1, "rollout_logprob": NaN, "train_logprob": -0.25, "step": 0}',  # json's path
    ],
)
def test_logprob_record_with_a_repeated_key_is_refused(tmp_path: Path, line: str) -> None:
    p = tmp_path / "lp.jsonl"
    p.write_text(LOGPROB % 0 + line + "\n")
    with pytest.raises(LogprobInputError, match=r"lp.jsonl line 2: key '(train_logprob|step)' appears twice in one object"):
        read_logprob_jsonl(p)


def test_colons_in_strings_are_no_duplicates(tmp_path: Path) -> None:
    p = tmp_path / "lp.jsonl"
    p.write_text(LOGPROB % 0 + LOGPROB.replace('"a"', '"a:b:c"') % 1)
    assert len(read_logprob_jsonl(p)) == 2
    assert loads_unique('{"a": {"b": 1, "c": [{"d": ":"}]}}') == {"a": {"b": 1, "c": [{"d": ":"}]}}
    with pytest.raises(DuplicateKeyError, match="'d' appears twice"):
        check_unique('{"a": [{"d": 1, "d": 2}]}', {"a": [{"d": 2}]})


def test_acceptance_record_with_a_repeated_key_is_refused(tmp_path: Path) -> None:
    good = {"request_id": "r", "step": 0, "proposed": [1, 2], "accepted": 1}
    p = tmp_path / "steps.jsonl"
    p.write_text(json.dumps(good) + "\n" + '{"request_id": "r", "step": 1, "proposed": [1, 2], "accepted": 1, "accepted": 2}\n')
    with pytest.raises(AcceptanceInputError, match=r"steps.jsonl line 2: key 'accepted' appears twice in one object"):
        read_acceptance_jsonl(p)


def test_cli_exits_2_naming_the_line(tmp_path: Path) -> None:
    p = tmp_path / "lp.jsonl"
    p.write_text(LOGPROB % 0 + LOGPROB.replace('"train_logprob": -0.25', '"train_logprob": -0.25, "train_logprob": -1') % 1)
    got = subprocess.run([VALIDATOR, "rl", "kl", str(p)], capture_output=True, text=True, timeout=120)
    assert got.returncode == 2, got.stderr
    assert f"{p} line 2: key 'train_logprob' appears twice" in got.stderr and "Traceback" not in got.stderr
