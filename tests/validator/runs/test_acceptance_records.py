"""Acceptance records: JSONL schema and errors, Parquet round trip, the probe recorder, run summaries."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from probes.core.acceptance import ACCEPTANCE_FILE, AcceptanceRecorder, AcceptanceRecordError
from validator.judging.acceptance import StepArrays, summarize_run
from validator.runs.acceptance_records import (
    COLUMNS,
    AcceptanceInputError,
    check_frame,
    empty_frame,
    frame_to_records,
    normalize_record,
    read_acceptance_bundle,
    read_acceptance_jsonl,
    read_acceptance_parquet,
    records_to_frame,
    write_acceptance_jsonl,
    write_acceptance_parquet,
)

try:
    from tests.validator.judging.acceptance_factories import make_records, step
except ImportError:  # tests/ is not a package: pytest puts this folder on sys.path
    from acceptance_factories import make_records, step  # type: ignore[no-redef]


def write_lines(path: Path, lines: list[Any]) -> Path:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


RICH = [
    step(
        "r0",
        0,
        [5, 6, 7],
        2,
        prompt_hash="p0",
        draft_logprobs=[-0.1, {"top_ids": [6, 9], "top_logprobs": [-0.2, -1.9], "logprob": -0.2}, None],
        target_tokens=[5, 6, 8, 4],
        target_logprobs=[{"top_ids": [5], "top_logprobs": [-0.05]}, -0.3, -float("inf"), -2.0],
        output_tokens=[5, 6, 8],
    ),
    step("r0", 1, [1, 2], 0, prompt_hash="p0", bonus=False),
    step("r1", 0, [], 0, output_tokens=[3]),
]


# -- schema -------------------------------------------------------------------------------------------


def test_normalize_defaults_and_logprob_split() -> None:
    row = normalize_record(RICH[0], where="x")
    assert set(row) == set(COLUMNS)
    assert row["bonus"] is True and row["num_proposed"] == 3
    assert row["draft_logprob"] == [-0.1, -0.2, None]
    assert row["draft_top_ids"] == [None, [6, 9], None]
    assert row["draft_top_logprobs"] == [None, [-0.2, -1.9], None]
    assert row["target_logprob"] == [None, -0.3, -math.inf, -2.0]
    plain = normalize_record(step("r", 0, [1, 2], 1, draft_logprobs=[-0.5, -1.0]), where="x")
    assert plain["draft_top_ids"] is None and plain["draft_logprob"] == [-0.5, -1.0]
    assert normalize_record(step("r", 0, [1], 1, bonus=None), where="x")["bonus"] is True


def test_error_message_names_file_line_and_field(tmp_path: Path) -> None:
    good = [step("r", i, [1] * 7, 3) for i in range(15)]
    path = write_lines(tmp_path / "steps.jsonl", [*good, "", step("r", 99, [1] * 7, 9)])
    with pytest.raises(AcceptanceInputError) as err:
        read_acceptance_jsonl(path)
    assert str(err.value) == f"{path} line 17: 'accepted' must be an int between 0 and len(proposed)=7, got 9"


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"request_id": "r", "step": 1, ', "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        (step("r", 1, [1], 0) | {"request_id": 3}, "'request_id' must be a non-empty string"),
        ({"request_id": "r", "step": 1, "proposed": [1]}, "missing required key 'accepted'"),
        (step("r", 1, [1], 0) | {"step": "1"}, "'step' must be an int >= 0"),
        (step("r", -1, [1], 0), "'step' must be an int >= 0"),
        (step("r", 1, [1, 2.0], 0), "'proposed'[1] must be a non-negative int"),
        (step("r", 1, [1], True), "'accepted' must be an int"),
        (step("r", 1, [1, 2], 3), "'accepted' must be an int between 0 and len(proposed)=2, got 3"),
        (step("r", 1, [1], 0, bonus="yes"), "'bonus' must be true or false"),
        (step("r", 1, [1, 2], 0, draft_logprobs=[-1.0]), "'draft_logprobs' has 1 entries, expected 2"),
        (step("r", 1, [1], 0, draft_logprobs=[0.5]), "must be a logprob"),
        (step("r", 1, [1], 0, draft_logprobs=[{"top_ids": [1]}]), "without 'top_logprobs'"),
        (step("r", 1, [1], 0, draft_logprobs=[{"top_ids": [1, 1], "top_logprobs": [-1, -2]}]), "repeated"),
        (step("r", 1, [1], 0, target_tokens=[1, 2, 3]), "'target_tokens' has 3 entries, expected 1 or 2"),
        (step("r", 1, [1], 1, output_tokens=[1, 2, 3]), "more than accepted + bonus = 2"),
        (step("r", 0, [1], 0), "duplicate step (request_id='r', step=0), first seen at"),
        (step("r", 1, [1], 0, prompt_hash="other"), "'prompt_hash' 'other' differs"),
    ],
)
def test_jsonl_errors_name_file_and_line(tmp_path: Path, line: Any, message: str) -> None:
    path = write_lines(tmp_path / "run.jsonl", [step("r", 0, [4, 5], 1), line])
    with pytest.raises(AcceptanceInputError) as err:
        read_acceptance_jsonl(path)
    assert str(err.value).startswith(f"{path} line 2: ")
    assert message in str(err.value)


def test_duplicate_names_first_line(tmp_path: Path) -> None:
    path = write_lines(
        tmp_path / "d.jsonl", [step("a", 0, [1], 1), step("a", 1, [1], 0), step("a", 0, [2], 0)]
    )
    with pytest.raises(
        AcceptanceInputError, match=r"d\.jsonl line 3: duplicate .* first seen at .*d\.jsonl line 1"
    ):
        read_acceptance_jsonl(path)


def test_strict_rejects_unknown_keys() -> None:
    rec = step("r", 0, [1], 0, acepted=1)
    assert records_to_frame([rec])["accepted"].tolist() == [0]
    with pytest.raises(AcceptanceInputError, match=r"records record 1: unknown keys \['acepted'\]"):
        records_to_frame([rec], strict=True)


def test_missing_file_and_empty_file(tmp_path: Path) -> None:
    with pytest.raises(AcceptanceInputError, match="cannot open"):
        read_acceptance_jsonl(tmp_path / "nope.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n\n")
    df = read_acceptance_jsonl(tmp_path / "empty.jsonl")
    assert list(df.columns) == list(COLUMNS) and len(df) == 0
    pd.testing.assert_frame_equal(df, empty_frame())


# -- round trips --------------------------------------------------------------------------------------


def test_jsonl_round_trip(tmp_path: Path) -> None:
    df = records_to_frame(RICH)
    assert list(frame_to_records(df)) == RICH
    assert write_acceptance_jsonl(df, tmp_path / "x.jsonl") == 3
    pd.testing.assert_frame_equal(read_acceptance_jsonl(tmp_path / "x.jsonl"), df)


def test_parquet_round_trip_is_lossless(tmp_path: Path) -> None:
    df = records_to_frame(
        RICH + make_records(300, [0.8, 0.7, 0.6], seed=3, output_tokens=True, prune=0.3, prefix="s")
    )
    write_acceptance_parquet(df, tmp_path / "a.parquet")
    back = read_acceptance_parquet(tmp_path / "a.parquet")
    pd.testing.assert_frame_equal(back, df)
    assert list(frame_to_records(back)) == list(frame_to_records(df))
    assert back["target_logprob"].iloc[0][2] == -math.inf
    empty = empty_frame()
    write_acceptance_parquet(empty, tmp_path / "e.parquet")
    pd.testing.assert_frame_equal(read_acceptance_parquet(tmp_path / "e.parquet"), empty)


def test_parquet_errors(tmp_path: Path) -> None:
    (tmp_path / "bad.parquet").write_bytes(b"not parquet")
    with pytest.raises(AcceptanceInputError, match="bad.parquet: not a readable Parquet file"):
        read_acceptance_parquet(tmp_path / "bad.parquet")
    df = records_to_frame([step("r", 0, [1, 2], 1), step("r", 1, [1, 2], 2)])
    df.loc[1, "accepted"] = 5
    with pytest.raises(
        AcceptanceInputError, match=r"frame row 2: 'accepted' must be between 0 and len\(proposed\)"
    ):
        check_frame(df)
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"request_id": ["r"]}), tmp_path / "few.parquet")
    with pytest.raises(AcceptanceInputError, match="few.parquet: missing columns"):
        read_acceptance_parquet(tmp_path / "few.parquet")


# -- the probe recorder -------------------------------------------------------------------------------


def test_recorder_writes_what_the_loader_reads(tmp_path: Path) -> None:
    bundle = tmp_path / "run1"
    with AcceptanceRecorder(bundle, part="pp0-tp0", buffer_records=2) as rec:
        for r in RICH:
            kwargs = {k: v for k, v in r.items() if k not in ("request_id", "proposed", "accepted")}
            rec.record(r["request_id"], r["proposed"], r["accepted"], **kwargs)
        rec.record("r1", [9, 9], 1)  # step defaults to the request's next index (1)
        final = bundle / "parts" / "pp0-tp0" / ACCEPTANCE_FILE
        assert not final.exists()  # hidden until close
        assert len(list(final.parent.glob(".tmp-acceptance-*.jsonl"))) == 1
    assert final.exists() and not list(final.parent.glob(".tmp-*"))
    df = read_acceptance_jsonl(final)
    pd.testing.assert_frame_equal(df.iloc[:3].reset_index(drop=True), records_to_frame(RICH))
    assert df.iloc[3][["request_id", "step", "accepted"]].tolist() == ["r1", 1, 1]
    pd.testing.assert_frame_equal(read_acceptance_bundle(bundle), df)
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["run"]["name"] == "run1"


def test_recorder_manifest_matches_bundle_writer(tmp_path: Path) -> None:
    from probes.core.bundle import BundleWriter

    with (
        BundleWriter(tmp_path / "b", run_name="exp", part="tp1") as w,
        AcceptanceRecorder.for_writer(w) as rec,
    ):
        rec.record("q", [1, 2, 3], 3)
    assert (tmp_path / "b" / "parts" / "tp1" / ACCEPTANCE_FILE).exists()
    assert json.loads((tmp_path / "b" / "manifest.json").read_text())["run"]["name"] == "exp"
    with pytest.raises(AcceptanceRecordError, match="belongs to run 'exp'"):
        AcceptanceRecorder(tmp_path / "b", "tp2", run_name="other")


def test_recorder_refuses_bad_records_and_hides_partial_files(tmp_path: Path) -> None:
    rec = AcceptanceRecorder(tmp_path / "b")
    with pytest.raises(AcceptanceRecordError, match="between 0 and len"):
        rec.record("r", [1, 2], 3)
    with pytest.raises(AcceptanceRecordError, match="sequence of ints"):
        rec.record("r", [1, 2.5], 0)
    with pytest.raises(AcceptanceRecordError, match="expected 2"):
        rec.record("r", [1, 2], 0, draft_logprobs=[-1.0])
    rec.record("r", [1], 1, step=4)
    with pytest.raises(AcceptanceRecordError, match="step 4 recorded after step 4"):
        rec.record("r", [1], 1, step=4)
    rec.abort()
    part = tmp_path / "b" / "parts" / "part0"
    assert not list(part.iterdir())
    with pytest.raises(ZeroDivisionError), AcceptanceRecorder(tmp_path / "b") as rec2:
        rec2.record("r", [1], 0)
        raise ZeroDivisionError
    assert not (part / ACCEPTANCE_FILE).exists() and len(list(part.glob(".tmp-acceptance-*"))) == 1
    with AcceptanceRecorder(tmp_path / "b") as rec3:
        rec3.record("r", [1], 0)
    with pytest.raises(AcceptanceRecordError, match="already exist"):
        AcceptanceRecorder(tmp_path / "b")


def test_bundle_merges_parts_and_refuses_cross_part_duplicates(tmp_path: Path) -> None:
    for part, rid in (("p0", "a"), ("p1", "b")):
        with AcceptanceRecorder(tmp_path / "b", part) as rec:
            rec.record(rid, [1, 2], 2)
    assert read_acceptance_bundle(tmp_path / "b")["request_id"].tolist() == ["a", "b"]
    with AcceptanceRecorder(tmp_path / "b", "p2") as rec:
        rec.record("a", [1, 2], 0)
    with pytest.raises(
        AcceptanceInputError, match=r"p2.acceptance\.jsonl line 1: duplicate .*p0.acceptance\.jsonl line 1"
    ):
        read_acceptance_bundle(tmp_path / "b")
    with pytest.raises(AcceptanceInputError, match="no parts"):
        read_acceptance_bundle(tmp_path / "empty")


# -- summaries ----------------------------------------------------------------------------------------


def test_summary_counts_by_hand() -> None:
    df = records_to_frame(
        [
            step("a", 0, [1, 2, 3], 3),
            step("a", 1, [1, 2, 3], 1),
            step("a", 2, [1, 2], 0, bonus=False),
            step("b", 0, [1, 2, 3], 2),
        ]
    )
    s = summarize_run(StepArrays.from_frame(df))
    assert (s.requests, s.steps, s.proposed_drafts, s.accepted_drafts, s.bonus_tokens) == (2, 4, 11, 6, 3)
    assert s.histogram == (1, 1, 1, 1)
    assert s.reached == (4, 3, 2) and s.accepted_at == (3, 2, 1)
    assert s.conditional == (0.75, 2 / 3, 0.5) and s.unconditional == (0.75, 0.5, 0.25)
    assert s.accept_length == 9 / 4 and s.accepted_per_step == 6 / 4 and s.accept_rate == 6 / 11
    m = s.to_dict()["engine_metrics"]
    assert m["sglang"]["spec_accept_length"] == 2.25 and m["sglang"]["spec_accept_histogram"] == [1, 1, 1, 1]
    assert (
        m["vllm"]["num_accepted_tokens_per_pos"] == [3, 2, 1] and m["vllm"]["mean_acceptance_length"] == 2.5
    )
    json.dumps(s.to_dict(), allow_nan=False)
