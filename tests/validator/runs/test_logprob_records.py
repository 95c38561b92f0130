"""Logprob records: reading JSONL, the errors (file, line, field), Parquet round trip."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from validator.runs.logprob_records import (
    LogprobInputError,
    read_logprob_jsonl,
    read_logprob_parquet,
    records_from_objects,
    write_logprob_parquet,
)


def _line(**kw: object) -> dict[str, object]:
    base: dict[str, object] = {"step": 0, "sample_id": "a", "token_index": 0, "rollout_logprob": -0.5, "train_logprob": -0.25}
    base.update(kw)
    return base


def _write(path: Path, objs: list[object], raw: str = "") -> Path:
    path.write_text("".join(json.dumps(o) + "\n" for o in objs) + raw)
    return path


def test_reads_records_in_order(tmp_path: Path) -> None:
    objs = [
        _line(),
        _line(token_index=1, rollout_logprob=-1, train_logprob=0.0, weight_version=3),
        _line(step=2, sample_id=7, rollout_logprob=-2.0, weight_version=None),
    ]
    objs[0]["weight_version"] = 3
    p = _write(tmp_path / "lp.jsonl", objs, raw="\n   \n")
    rec = read_logprob_jsonl(p)
    assert len(rec) == 3
    assert rec.step.tolist() == [0, 0, 2]
    assert [rec.sample_ids[i] for i in rec.sample] == ["a", "a", "7"]
    assert rec.token_index.tolist() == [0, 1, 0]
    assert rec.rollout_logprob.tolist() == [-0.5, -1.0, -2.0]
    assert rec.train_logprob.tolist() == [-0.25, 0.0, -0.25]
    assert rec.weight_version.tolist() == [3, 3, -1]
    assert rec.rollout_logprob.dtype == np.float64


@pytest.mark.parametrize(
    ("obj", "raw", "message"),
    [
        (None, "{not json\n", "line 2: not valid JSON"),
        ([1, 2], "", "line 2: expected a JSON object, got list"),
        (_line(train_logprob=None), "", "line 2: missing required field"),
        ({"step": 0, "sample_id": "a", "token_index": 0, "rollout_logprob": -1}, "", "line 2: missing required field 'train_logprob'"),
        (_line(step=-1), "", "line 2: 'step' must be an int >= 0, got -1"),
        (_line(step=1.5), "", "line 2: 'step' must be an int >= 0"),
        (_line(token_index=True), "", "line 2: 'token_index' must be an int >= 0"),
        (_line(sample_id=""), "", "line 2: 'sample_id' must be a non-empty string or an int"),
        (_line(sample_id=[1]), "", "line 2: 'sample_id' must be"),
        (_line(rollout_logprob="x"), "", "line 2: 'rollout_logprob' must be a number"),
        (_line(train_logprob=0.5), "", "line 2: 'train_logprob' must be a logprob (<= 0), got 0.5"),
        (_line(weight_version=-2), "", "line 2: 'weight_version' must be an int >= 0 or absent"),
        (_line(token_index=0), "", "line 2: duplicate token (step=0, sample_id='a', token_index=0), first at"),
        (_line(token_index=1, weight_version=4), "", "line 2: 'weight_version' 4 differs from None"),
    ],
)
def test_errors_name_file_line_and_field(tmp_path: Path, obj: object, raw: str, message: str) -> None:
    objs: list[object] = [_line()] + ([] if obj is None and raw else [obj] if obj is not None else [])
    if obj is not None and isinstance(obj, dict) and obj.get("train_logprob", 0) is None:
        del obj["train_logprob"]
    p = _write(tmp_path / "bad.jsonl", objs, raw=raw)
    with pytest.raises(LogprobInputError, match="bad.jsonl " + message.replace("(", r"\(").replace(")", r"\)")):
        read_logprob_jsonl(p)


@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_non_finite_logprobs_are_refused(tmp_path: Path, token: str) -> None:
    p = tmp_path / "nf.jsonl"
    p.write_text(json.dumps(_line()) + "\n" + f'{{"step": 0, "sample_id": "b", "token_index": 0, "rollout_logprob": {token}, "train_logprob": -1}}\n')
    with pytest.raises(LogprobInputError, match=r"nf.jsonl line 2: 'rollout_logprob' must be finite"):
        read_logprob_jsonl(p)


def test_empty_and_missing_files(tmp_path: Path) -> None:
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(LogprobInputError, match=r"empty.jsonl: no records"):
        read_logprob_jsonl(tmp_path / "empty.jsonl")
    with pytest.raises(LogprobInputError, match=r"missing.jsonl: cannot read"):
        read_logprob_jsonl(tmp_path / "missing.jsonl")
    (tmp_path / "bin.jsonl").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(LogprobInputError, match=r"bin.jsonl: not UTF-8"):
        read_logprob_jsonl(tmp_path / "bin.jsonl")


def test_objects_and_parquet_round_trip(tmp_path: Path) -> None:
    rec = records_from_objects([_line(weight_version=1), _line(token_index=1, weight_version=1), _line(step=1, sample_id=3)], source="body")
    write_logprob_parquet(rec, tmp_path / "lp.parquet")
    back = read_logprob_parquet(tmp_path / "lp.parquet")
    for name in ("step", "sample", "token_index", "rollout_logprob", "train_logprob", "weight_version"):
        assert np.array_equal(getattr(back, name), getattr(rec, name)), name
    assert back.sample_ids == rec.sample_ids
    with pytest.raises(LogprobInputError, match=r"body record 2: duplicate token"):
        records_from_objects([_line(), _line()], source="body")
    (tmp_path / "x.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(LogprobInputError, match=r"x.parquet: not a readable Parquet file"):
        read_logprob_parquet(tmp_path / "x.parquet")


def test_bundle_parts_hold_logprob_records(tmp_path: Path) -> None:
    from probes.core.bundle import ensure_manifest
    from validator.runs.sources import open_path

    root = tmp_path / "bundle"
    for part, step in (("rank0", 0), ("rank1", 1)):
        (root / "parts" / part).mkdir(parents=True)
        _write(root / "parts" / part / "logprobs.jsonl", [_line(step=step), _line(step=step, token_index=1)])
    ensure_manifest(root, "rl-run", {"model": "m"})
    view = open_path(root)
    assert view.has_logprobs and not view.tensors
    rec = view.load_logprobs()
    assert rec.step.tolist() == [0, 0, 1, 1]
    _write(root / "parts" / "rank1" / "logprobs.jsonl", [_line(step=0)])
    with pytest.raises(LogprobInputError, match=r"rank1/logprobs.jsonl line 1: duplicate token .* first at .*rank0/logprobs.jsonl line 1"):
        open_path(root).load_logprobs()
