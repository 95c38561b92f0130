"""validator.runs.jsonlines.json_lines: the JSONL line loop the workloads share (GSM8K rows, the PD prompts)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from validator.errors import InputError
from validator.runs.jsonlines import json_lines


def test_numbers_lines_from_one_and_skips_blank_ones() -> None:
    lines = ['{"a": 1}\n', "\n", "  \t\n", "[2]\n", "3"]
    assert list(json_lines("f.jsonl", lines)) == [(1, {"a": 1}), (4, [2]), (5, 3)]


def test_not_json_names_file_and_line() -> None:
    with pytest.raises(InputError, match=r"^d/f\.jsonl line 3: not valid JSON \(Expecting value: line 1 column 1 \(char 0\)\)$"):
        list(json_lines(Path("d/f.jsonl"), ["1", "", "oops"]))


def test_limit_stops_before_reading_the_next_line() -> None:
    assert list(json_lines("f", ["1", "", "2", "not json"], limit=2)) == [(1, 1), (3, 2)]
    assert list(json_lines("f", ["not json"], limit=0)) == []


def test_a_key_named_twice_names_file_and_line() -> None:
    with pytest.raises(InputError, match=r"^f\.jsonl line 2: key 'a' appears twice in one object$"):
        list(json_lines("f.jsonl", ['{"a": 1}', '{"a": 1, "b": {"c": 2}, "a": 3}']))
    assert list(json_lines("f", ['{"a": "x:y:z"}'])) == [(1, {"a": "x:y:z"})]  # colons inside strings are no keys


def test_what_orjson_refuses_json_reads() -> None:
    got = list(json_lines("f", ['{"x": NaN, "y": 1e999, "n": 123456789012345678901234567890}']))
    assert got[0][0] == 1 and math.isnan(got[0][1]["x"]) and got[0][1]["y"] == math.inf
    assert got[0][1]["n"] == 123456789012345678901234567890


def test_the_readers_own_error_and_text_that_is_not_utf8(tmp_path: Path) -> None:
    class RecordsError(InputError):
        pass

    with pytest.raises(RecordsError, match=r"^r\.jsonl line 1: not valid JSON \("):
        list(json_lines("r.jsonl", ["[" * 100_000], error=RecordsError))  # nested past any parser's depth
    p = tmp_path / "latin1.jsonl"
    p.write_bytes(b'{"a": "caf\xe9"}\n')
    with open(p, encoding="utf-8") as f, pytest.raises(InputError, match=r"latin1\.jsonl: not UTF-8 text$"):
        list(json_lines(p, f))
