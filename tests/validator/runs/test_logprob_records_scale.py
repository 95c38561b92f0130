"""Logprob records at scale (issue 39, item 1): the columnar reader gives what the row-by-row checks give."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from validator.runs.logprob_records import (
    LogprobInputError,
    read_logprob_jsonl,
    read_logprob_parquet,
    records_from_objects,
    write_logprob_parquet,
)


def _objs(n_steps: int = 40, samples: int = 3, tokens: int = 4) -> list[dict[str, object]]:
    rng = np.random.default_rng(0)
    out: list[dict[str, object]] = []
    for step in range(n_steps):
        for s in range(samples):
            for t in range(tokens):
                ro = -float(rng.random())
                o: dict[str, object] = {"step": step, "sample_id": f"p{(s * 7 + step) % 5}-{s}", "token_index": t,
                                        "rollout_logprob": ro, "train_logprob": min(0.0, ro + float(rng.normal(0, 0.05)))}
                if s != 1:
                    o["weight_version"] = step // 4
                out.append(o)
    return out


def test_parquet_and_jsonl_give_the_records_of_the_objects(tmp_path: Path) -> None:
    objs = _objs()
    ref = records_from_objects(objs)
    (tmp_path / "lp.jsonl").write_text("".join(json.dumps(o) + "\n" for o in objs))
    write_logprob_parquet(ref, tmp_path / "lp.parquet")
    for got in (read_logprob_jsonl(tmp_path / "lp.jsonl"), read_logprob_parquet(tmp_path / "lp.parquet")):
        assert got.sample_ids == ref.sample_ids
        for f in ("step", "sample", "token_index", "rollout_logprob", "train_logprob", "weight_version"):
            assert np.array_equal(getattr(got, f), getattr(ref, f)), f


@pytest.mark.parametrize("where", ["jsonl", "parquet"])
def test_a_duplicate_token_names_both_places(tmp_path: Path, where: str) -> None:
    objs = _objs(n_steps=3)
    objs.append(dict(objs[5]))
    if where == "jsonl":
        (tmp_path / "lp.jsonl").write_text("".join(json.dumps(o) + "\n" for o in objs))
        with pytest.raises(LogprobInputError, match=r"lp.jsonl line 37: duplicate token \(step=0.*first at .*lp.jsonl line 6$"):
            read_logprob_jsonl(tmp_path / "lp.jsonl")
    else:
        table = pa.table({k: [o.get(k) for o in objs] for k in ("step", "sample_id", "token_index", "rollout_logprob",
                                                                 "train_logprob", "weight_version")})
        pq.write_table(table, str(tmp_path / "lp.parquet"))
        with pytest.raises(LogprobInputError, match=r"lp.parquet row 36: duplicate token \(step=0.*first at .*lp.parquet row 5$"):
            read_logprob_parquet(tmp_path / "lp.parquet")


def test_a_sample_with_two_weight_versions_is_refused_at_its_later_line() -> None:
    objs = _objs(n_steps=2)
    objs[2]["weight_version"] = 9  # sample 0 of step 0, its third token
    with pytest.raises(LogprobInputError, match=r"^records record 3: 'weight_version' 9 differs from 0 given for sample .* at records record 1$"):
        records_from_objects(objs)
