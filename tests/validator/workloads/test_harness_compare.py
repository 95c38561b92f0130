"""End to end with the reference harness: D-only vs PD acceptance through `validator compare`.

Same prompts, greedy: D-only vs PD (bf16 partial-sum context) must come out equivalent, and D-only vs
a broken PD (a stage's contribution missing) must fail at the positions that drop.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from validator.app.cli import main
from validator.workloads.harness import Harness, write_acceptance_part

PROMPTS = [f"Question: {i} apples and {i * 3 + 1} pears. How many fruits?\nAnswer:".encode() for i in range(40)]


@pytest.fixture(scope="module")
def bundles(tmp_path_factory) -> dict[str, Path]:
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        root = tmp_path_factory.mktemp("harness")
        out = {}
        for mode in ("d-only", "pd", "pd-broken"):
            h = Harness(seed=0, mode=mode, block=4)
            recs = []
            for i, p in enumerate(PROMPTS):
                _, r = h.generate(list(p), 48, request_id=f"q{i}", ignore_eos=True)
                recs.extend(r)
            out[mode] = write_acceptance_part(recs, root / mode, run_name=mode)
        return out
    finally:
        torch.set_num_threads(n)


def _compare(tmp_path: Path, capsys, a: Path, b: Path) -> tuple[int, dict]:
    code = main(["--home", str(tmp_path / "h"), "compare", str(a), str(b), "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_d_only_vs_pd_is_equivalent(bundles: dict[str, Path], tmp_path: Path, capsys) -> None:
    code, doc = _compare(tmp_path, capsys, bundles["d-only"], bundles["pd"])
    acc = doc["acceptance"]
    # paired over the same 40 prompts: identical greedy outputs and per-step acceptance -> equivalent
    assert acc["verdict"] == "pass" and code == 0, acc["reasons"]
    assert all(p["verdict"] == "equivalent" for p in acc["positions"])


def test_d_only_vs_broken_pd_fails(bundles: dict[str, Path], tmp_path: Path, capsys) -> None:
    code, doc = _compare(tmp_path, capsys, bundles["d-only"], bundles["pd-broken"])
    acc = doc["acceptance"]
    assert code == 1 and doc["verdict"] == "fail" and acc["verdict"] == "fail"
    assert acc["positions"][0]["verdict"] == "different"
