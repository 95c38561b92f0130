"""Where two runs' acceptance and greedy output first part: per paired request and overall.

For each pair of requests (matched as :func:`.pairing.pair_requests` matches them), the verify steps are
walked in order, matched by index as :func:`.pairing.divergence_summary` matches them:

- **acceptance** parts at the first step where the verifier decided differently: at draft position ``k``
  a step *accepted* (``accepted > k``), *rejected* (``accepted == k < proposed``) or did not reach it; the
  step's position is the first ``k`` whose outcome differs. A step that only one run has (the step numbers
  differ, or one run goes on longer) parts there, with no position;
- **greedy output** parts where the emitted tokens first differ (``.pairing.divergence_summary``: the step,
  and the token's index in the request's verified output), when the records carry tokens.

Overall: the earliest parting over the requests, by step, then position (or token), then request order.
Pure: arrays in, frozen results out; ``judging.text.acceptance_parting_line`` writes one as a line.
"""

from __future__ import annotations

from validator.judging.acceptance.primitives import IntArray
from validator.judging.acceptance.results import AcceptanceFrontier, DivergenceSummary, RequestParting
from validator.judging.acceptance.steps import StepArrays, paired_rows

__all__ = ["RequestParting", "AcceptanceFrontier", "acceptance_frontier"]


def _outcome(proposed: int, accepted: int, k: int) -> int:
    """Draft position ``k`` in a step: 1 accepted, 0 rejected, -1 not reached."""
    if accepted > k:
        return 1
    return 0 if k == accepted and k < proposed else -1


def _first_position(na: int, aa: int, nb: int, ab: int) -> int | None:
    return next((k for k in range(max(na, nb)) if _outcome(na, aa, k) != _outcome(nb, ab, k)), None)


def _acceptance_parting(sa: StepArrays, sb: StepArrays, ra: range, rb: range) -> tuple[int | None, int | None]:
    """(step, position) where one request's acceptance first parts between the runs, or (None, None)."""
    for i, j in zip(ra, rb):
        s_a, s_b = int(sa.step[i]), int(sb.step[j])
        if s_a != s_b:
            return min(s_a, s_b), None
        k = _first_position(int(sa.num_proposed[i]), int(sa.accepted[i]), int(sb.num_proposed[j]), int(sb.accepted[j]))
        if k is not None:
            return s_a, k
    if len(ra) != len(rb):  # one run went on for more steps
        longer, sl, n = (sa, ra, len(rb)) if len(ra) > len(rb) else (sb, rb, len(ra))
        return int(longer.step[sl[n]]), None
    return None, None


def acceptance_frontier(
    sa: StepArrays, sb: StepArrays, ma: IntArray, mb: IntArray, mode: str, divergence: DivergenceSummary | None
) -> AcceptanceFrontier:
    """The paired requests ``ma`` (rows of A's requests) and ``mb`` (B's), as ``pair_requests`` gave them;
    ``divergence``: the greedy-output divergence of the same pairs (``divergence_summary``), if any."""
    per: list[RequestParting] = []
    greedy = divergence.per_request if divergence is not None else None
    for n, (ia, ib, ra, rb, key) in enumerate(paired_rows(sa, sb, ma, mb, mode)):
        step, pos = _acceptance_parting(sa, sb, ra, rb)
        g = greedy[n] if greedy is not None else None
        per.append(
            RequestParting(
                key=key,
                request_a=sa.request_ids[ia],
                request_b=sb.request_ids[ib],
                acceptance_step=step,
                acceptance_position=pos,
                output_step=g.first_divergent_step if g is not None else None,
                output_token=g.first_divergent_token if g is not None else None,
            )
        )
    inf = float("inf")
    acc = [(p.acceptance_step, inf if p.acceptance_position is None else p.acceptance_position, n, p)
           for n, p in enumerate(per) if p.acceptance_step is not None]
    out = [(p.output_step, inf if p.output_token is None else p.output_token, n, p)
           for n, p in enumerate(per) if p.output_step is not None]
    return AcceptanceFrontier(
        requests=len(per),
        acceptance_parted=len(acc),
        first_acceptance=min(acc, key=lambda t: t[:3])[3] if acc else None,
        output_source=divergence.source if divergence is not None else None,
        output_parted=len(out) if divergence is not None else None,
        first_output=min(out, key=lambda t: t[:3])[3] if out else None,
        per_request=tuple(per),
    )

