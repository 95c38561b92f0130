"""probes.rl.logprobs: the recorder writes records the validator reads back, atomically."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from probes.rl.logprobs import LogprobRecorder, LogprobRecordError
from validator.runs.sources import open_path


def test_recorder_round_trip(tmp_path: Path) -> None:
    root = tmp_path / "b"
    with LogprobRecorder(root, part="t0", run_name="rl", labels={"model": "m"}) as rec:
        rec.record_sample(
            step=0,
            sample_id="a",
            rollout_logprobs=[-0.5, -1.0],
            train_logprobs=torch.tensor([-0.4, -1.1]),
            weight_version=3,
        )
        rec.record_sample(step=1, sample_id=7, rollout_logprobs=torch.tensor([-2.0]), train_logprobs=[-2.5])
        assert not (root / "parts" / "t0" / "logprobs.jsonl").exists()
    view = open_path(root)
    r = view.load_logprobs()
    assert r.step.tolist() == [0, 0, 1] and r.token_index.tolist() == [0, 1, 0]
    assert r.train_logprob.tolist() == pytest.approx([-0.4, -1.1, -2.5])
    assert r.weight_version.tolist() == [3, 3, -1]
    assert not list((root / "parts" / "t0").glob(".tmp-*"))


def test_recorder_refuses_bad_records(tmp_path: Path) -> None:
    rec = LogprobRecorder(tmp_path / "b")
    with pytest.raises(LogprobRecordError, match=r"rollout_logprobs\[1\]: a logprob must be finite"):
        rec.record_sample(step=0, sample_id="a", rollout_logprobs=[-1.0, float("nan")], train_logprobs=[-1.0, -1.0])
    with pytest.raises(LogprobRecordError, match="2 rollout logprobs but 1 train"):
        rec.record_sample(step=0, sample_id="a", rollout_logprobs=[-1.0, -1.0], train_logprobs=[-1.0])
    with pytest.raises(LogprobRecordError, match="step must be"):
        rec.record_sample(step=-1, sample_id="a", rollout_logprobs=[], train_logprobs=[])
    rec.abort()
    assert not list((tmp_path / "b" / "parts" / "logprobs").iterdir())
    with pytest.raises(LogprobRecordError, match="part name"):
        LogprobRecorder(tmp_path / "b", part="../x")


def test_exception_after_close_is_not_replaced(tmp_path: Path) -> None:
    """Closed inside ``with``, then an exception: the file stays published and the exception is the caller's."""
    with pytest.raises(KeyError, match="mine"):
        with LogprobRecorder(tmp_path / "b", part="t0") as rec:
            rec.record_sample(step=0, sample_id="s", rollout_logprobs=[-0.5], train_logprobs=[-0.4])
            rec.close()
            raise KeyError("mine")
    assert (tmp_path / "b" / "parts" / "t0" / "logprobs.jsonl").is_file()
