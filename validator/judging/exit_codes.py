"""The exit code of every verdict the validator gives, one map for the CLI, the API and the reports.

0: the runs agree; 1: they do not; 3: the data cannot tell; 2 is no verdict but an input the user must fix
(:class:`validator.errors.ValidatorError`'s ``exit_code``). Each kind of judgement names its verdicts in its own
words; no word means two things.
"""

from __future__ import annotations

from typing import Final

__all__ = ["EXIT_FAIL", "EXIT_INCONCLUSIVE", "EXIT_INPUT_ERROR", "EXIT_PASS", "VERDICT_EXIT"]

EXIT_PASS: Final = 0
EXIT_FAIL: Final = 1
EXIT_INPUT_ERROR: Final = 2
EXIT_INCONCLUSIVE: Final = 3

VERDICT_EXIT: Final[dict[str, int]] = {
    # a comparison of two runs (judging.compare)
    "pass": EXIT_PASS,
    "fail": EXIT_FAIL,
    "inconclusive": EXIT_INCONCLUSIVE,  # also the RL KL report's
    # the RL train/rollout KL report (judging.rl_kl)
    "at floor": EXIT_PASS,
    "above floor": EXIT_FAIL,
    "diverging": EXIT_FAIL,
    # two weight manifests (judging.manifest_diff)
    "identical": EXIT_PASS,
    "updated": EXIT_PASS,
    "different": EXIT_FAIL,
}
