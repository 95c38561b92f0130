"""probes.core.hidden_jsonl: the recorders' hidden file (publish, keep, discard) and their ``with``."""

from __future__ import annotations

from pathlib import Path

import pytest

from probes.core.hidden_jsonl import HiddenJsonl, PublishOnExit


def test_publish_keep_discard(tmp_path: Path) -> None:
    out = HiddenJsonl(tmp_path, "x")
    assert out.tmp.parent == tmp_path and out.tmp.name.startswith(".tmp-x-") and out.tmp.suffix == ".jsonl"
    out.file.write("{}\n")
    out.publish(tmp_path / "x.jsonl")
    assert (tmp_path / "x.jsonl").read_text() == "{}\n" and not list(tmp_path.glob(".tmp-*"))

    kept = HiddenJsonl(tmp_path, "y")
    kept.file.write("1\n")
    kept.keep()
    assert kept.file.closed and kept.tmp.read_text() == "1\n"

    gone = HiddenJsonl(tmp_path, "z")
    gone.discard()
    assert gone.file.closed and not gone.tmp.exists()


class _Rec(PublishOnExit):
    def __init__(self) -> None:
        self.calls: list[str] = []

    def close(self) -> None:
        self.calls.append("close")

    def _keep(self) -> None:
        self.calls.append("keep")


def test_with_closes_on_a_clean_exit_and_keeps_on_an_exception() -> None:
    with _Rec() as rec:
        pass
    assert rec.calls == ["close"]
    with pytest.raises(KeyError), _Rec() as rec:
        raise KeyError("x")
    assert rec.calls == ["keep"]
