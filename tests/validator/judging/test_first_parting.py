"""Where acceptance and greedy output first part (``validator.judging.acceptance.first_parting``), per request and
overall, as the acceptance section carries it and the text tables print it."""

from __future__ import annotations

from validator.judging.acceptance import compare_acceptance
from validator.judging.text import acceptance_parting_line
from validator.runs.acceptance_records import records_to_frame

try:
    from tests.validator.judging.acceptance_factories import step
except ImportError:  # tests/ is not a package: pytest puts this folder on sys.path
    from acceptance_factories import step  # type: ignore[no-redef]

FAST = {"resamples": 200}


def _frontier(a: list[dict], b: list[dict]) -> dict:
    c = compare_acceptance(records_to_frame(a), records_to_frame(b), **FAST)
    assert c.frontier is not None
    d = c.to_dict()["frontier"]
    assert d == c.frontier.to_dict()
    return d


def test_first_step_and_position_where_the_verifier_decided_differently() -> None:
    a = [
        step("q0", 0, [1, 2, 3], 3, target_tokens=[1, 2, 3, 4]),
        step("q0", 1, [5, 6, 7], 1, target_tokens=[5, 9, 9, 9]),
        step("q1", 0, [1, 2, 3], 2, target_tokens=[1, 2, 8, 8]),
        step("q1", 1, [4, 5, 6], 0, target_tokens=[7, 7, 7, 7]),
        step("q2", 0, [1, 2], 2, target_tokens=[1, 2, 3]),
    ]
    b = [
        a[0],
        step("q0", 1, [5, 6, 7], 2, target_tokens=[5, 6, 9, 9]),  # position 1: A rejected, B accepted
        a[2],
        step("q1", 1, [4, 5], 0, target_tokens=[7, 7, 7]),  # fewer drafts, the same decisions: no parting
        a[4],
        step("q2", 1, [3], 1, target_tokens=[3, 4]),  # B ran one verify step longer
    ]
    f = _frontier(a, b)
    per = {p["key"]: p for p in f["per_request"]}
    assert (per["q0"]["acceptance_step"], per["q0"]["acceptance_position"]) == (1, 1)
    assert (per["q1"]["acceptance_step"], per["q1"]["acceptance_position"]) == (None, None)
    assert (per["q2"]["acceptance_step"], per["q2"]["acceptance_position"]) == (1, None)  # a step only B has
    # the greedy output (accepted drafts + the target's token): q0 emits 5, 9 against 5, 6, 9 at step 1
    assert (per["q0"]["output_step"], per["q0"]["output_token"]) == (1, 5)
    assert (per["q1"]["output_step"], per["q2"]["output_step"]) == (None, 1)
    assert (f["requests"], f["acceptance_parted"], f["output_parted"], f["output_source"]) == (3, 2, 2, "target_tokens")
    # overall: the earliest step, then the lowest position (a step only one run has counts after any position)
    # or token (q2 had emitted 3 tokens before its step 1, q0 5)
    assert f["first_acceptance"]["key"] == "q0" and f["first_output"]["key"] == "q2"
    line = acceptance_parting_line(f)
    assert line == ("acceptance first parts at verify step 1, position 1 (request q0; 2/3 requests); "
                    "greedy output at step 1, token 3 (request q2; 2/3 requests)")


def test_rejection_against_not_reached_is_a_parting() -> None:
    a = [step("q", 0, [1, 2, 3], 1, target_tokens=[1, 5, 5, 5])]
    b = [step("q", 0, [1], 1, target_tokens=[1, 5])]  # position 1: A rejected it, B never proposed it
    f = _frontier(a, b)
    assert (f["first_acceptance"]["acceptance_step"], f["first_acceptance"]["acceptance_position"]) == (0, 1)
    assert f["first_output"] is None and acceptance_parting_line(f).endswith("; greedy output identical")


def test_equal_runs_never_part() -> None:
    a = [step("q0", 0, [1, 2], 1, output_tokens=[1, 7]), step("q0", 1, [3], 1, output_tokens=[3, 4])]
    f = _frontier(a, list(a))
    assert f["first_acceptance"] is None and f["first_output"] is None and f["acceptance_parted"] == 0
    assert acceptance_parting_line(f) == (
        "acceptance never parts (1 paired requests: every verify step decided alike); greedy output identical"
    )


def test_the_table_prints_it() -> None:
    a = [step("q0", 0, [1, 2], 2), step("q0", 1, [3, 4], 0)]
    b = [step("q0", 0, [1, 2], 2), step("q0", 1, [3, 4], 1)]
    text = compare_acceptance(records_to_frame(a), records_to_frame(b), **FAST).format_table()
    assert "first parting                acceptance first parts at verify step 1, position 0 (request q0; 1/1 requests)" in text
