"""validator.workloads._jsonl: the JSONL line loop hf_pd and gsm8k share."""

from __future__ import annotations

from pathlib import Path

import pytest

from validator.errors import InputError
from validator.workloads._jsonl import json_lines


def test_numbers_lines_from_one_and_skips_blank_ones() -> None:
    lines = ['{"a": 1}\n', "\n", "  \t\n", "[2]\n", "3"]
    assert list(json_lines("f.jsonl", lines)) == [(1, {"a": 1}), (4, [2]), (5, 3)]


def test_not_json_names_file_and_line() -> None:
    with pytest.raises(InputError, match=r"^d/f\.jsonl line 3: not JSON \(Expecting value: line 1 column 1 \(char 0\)\)$"):
        list(json_lines(Path("d/f.jsonl"), ["1", "", "oops"]))


def test_limit_stops_before_reading_the_next_line() -> None:
    assert list(json_lines("f", ["1", "", "2", "not json"], limit=2)) == [(1, 1), (3, 2)]
    assert list(json_lines("f", ["not json"], limit=0)) == []
