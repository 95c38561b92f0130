"""validator.judging.exit_codes: every verdict's exit code, as the CLI and the API give it."""

from __future__ import annotations

from validator.errors import ValidatorError
from validator.judging.exit_codes import EXIT_INPUT_ERROR, VERDICT_EXIT


def test_every_verdict_word_has_its_exit_code() -> None:
    comparison = {"pass": 0, "fail": 1, "inconclusive": 3}
    rl_kl = {"at floor": 0, "above floor": 1, "diverging": 1, "inconclusive": 3}
    manifest_diff = {"identical": 0, "updated": 0, "different": 1}
    assert VERDICT_EXIT == {**comparison, **rl_kl, **manifest_diff}
    assert EXIT_INPUT_ERROR == ValidatorError.exit_code == 2 and EXIT_INPUT_ERROR not in VERDICT_EXIT.values()
