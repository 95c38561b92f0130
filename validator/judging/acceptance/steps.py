"""One run's verify steps as arrays (:class:`StepArrays`), its summary (:func:`summarize_run`), and the
request-level bootstrap over its per-request totals.

Steps of one request are correlated, so every uncertainty that crosses steps resamples whole requests
(:meth:`StepArrays.per_request` gives their totals) instead of steps.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from validator.judging.acceptance.primitives import FloatArray, IntArray, position_counts
from validator.judging.acceptance.results import AcceptanceSummary


@dataclass(frozen=True, eq=False)
class StepArrays:
    """One run's verify steps as arrays, sorted by (request, step). ``request`` indexes ``request_ids``."""

    request_ids: tuple[str, ...]
    prompt_hashes: tuple[str | None, ...]
    request: IntArray
    step: IntArray
    num_proposed: IntArray
    accepted: IntArray
    bonus: npt.NDArray[np.bool_]
    proposed: tuple[Any, ...] = ()
    output_tokens: tuple[Any, ...] = ()
    target_tokens: tuple[Any, ...] = ()
    draft_logprob: tuple[Any, ...] = ()
    draft_top_ids: tuple[Any, ...] = ()
    draft_top_logprobs: tuple[Any, ...] = ()

    @classmethod
    def from_frame(cls, df: Any) -> StepArrays:
        """From an acceptance DataFrame (``validator.runs.acceptance_records`` columns; only the first five needed)."""
        n = len(df)
        rid = np.asarray(df["request_id"].to_numpy(), dtype=object)
        keys, inverse = (
            np.unique(rid.astype(str), return_inverse=True) if n else (np.array([], dtype=str), np.zeros(0))
        )
        inverse = inverse.astype(np.int64)
        step = np.asarray(df["step"].to_numpy(), dtype=np.int64)
        order = np.lexsort((step, inverse))
        if "num_proposed" in df:
            nprop = np.asarray(df["num_proposed"].to_numpy(), dtype=np.int64)
        else:
            nprop = np.fromiter((len(p) for p in df["proposed"]), dtype=np.int64, count=n)
        bonus = np.asarray(df["bonus"].to_numpy(), dtype=bool) if "bonus" in df else np.ones(n, dtype=bool)

        def col(name: str) -> tuple[Any, ...]:
            if name not in df:
                return (None,) * n
            values = df[name].to_numpy()
            return tuple(values[i] for i in order)

        hashes: list[str | None] = [None] * len(keys)
        if "prompt_hash" in df:
            ph = df["prompt_hash"].to_numpy()
            for i in range(n):
                h = ph[i]
                if isinstance(h, str):
                    hashes[inverse[i]] = h
        return cls(
            request_ids=tuple(str(k) for k in keys),
            prompt_hashes=tuple(hashes),
            request=inverse[order],
            step=step[order],
            num_proposed=nprop[order],
            accepted=np.asarray(df["accepted"].to_numpy(), dtype=np.int64)[order],
            bonus=bonus[order],
            proposed=col("proposed"),
            output_tokens=col("output_tokens"),
            target_tokens=col("target_tokens"),
            draft_logprob=col("draft_logprob"),
            draft_top_ids=col("draft_top_ids"),
            draft_top_logprobs=col("draft_top_logprobs"),
        )

    @property
    def n_steps(self) -> int:
        return len(self.step)

    @property
    def n_requests(self) -> int:
        return len(self.request_ids)

    @property
    def max_proposed(self) -> int:
        return int(self.num_proposed.max()) if self.n_steps else 0

    def request_slices(self) -> IntArray:
        """Row offsets: request r occupies rows ``[starts[r], starts[r + 1])``."""
        counts = np.bincount(self.request, minlength=self.n_requests)
        return np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)

    def per_request(self, positions: int) -> FloatArray:
        """Per request: [reached_0..K-1, accepted_0..K-1, steps, accepted drafts, emitted tokens]."""
        r, k_ = self.request, np.arange(positions)[None, :]
        n, a = self.num_proposed[:, None], self.accepted[:, None]
        reached, acc = (n > k_) & (a >= k_), a > k_
        cols = [np.bincount(r, weights=reached[:, k], minlength=self.n_requests) for k in range(positions)]
        cols += [np.bincount(r, weights=acc[:, k], minlength=self.n_requests) for k in range(positions)]
        cols.append(np.bincount(r, minlength=self.n_requests).astype(np.float64))
        cols.append(np.bincount(r, weights=self.accepted, minlength=self.n_requests))
        cols.append(np.bincount(r, weights=self.accepted + self.bonus, minlength=self.n_requests))
        return np.stack(cols, axis=1) if cols else np.zeros((self.n_requests, 0))



def summarize_run(steps: StepArrays, positions: int | None = None) -> AcceptanceSummary:
    k = steps.max_proposed if positions is None else positions
    reached, acc = position_counts(steps.num_proposed, steps.accepted, k)
    n = steps.n_steps
    proposed = int(steps.num_proposed.sum())
    accepted = int(steps.accepted.sum())
    bonus = int(steps.bonus.sum())
    with np.errstate(invalid="ignore", divide="ignore"):
        cond = np.where(reached > 0, acc / np.maximum(reached, 1), np.nan)
    return AcceptanceSummary(
        requests=steps.n_requests,
        steps=n,
        proposed_drafts=proposed,
        accepted_drafts=accepted,
        bonus_tokens=bonus,
        accept_rate=accepted / proposed if proposed else math.nan,
        accepted_per_step=accepted / n if n else math.nan,
        accept_length=(accepted + bonus) / n if n else math.nan,
        histogram=tuple(int(x) for x in np.bincount(steps.accepted, minlength=k + 1)),
        reached=tuple(int(x) for x in reached),
        accepted_at=tuple(int(x) for x in acc),
        conditional=tuple(float(x) for x in cond),
        unconditional=tuple(float(x) / n if n else math.nan for x in acc),
    )


# -- the request-level bootstrap ----------------------------------------------------------------------


def nanstd(x: FloatArray) -> FloatArray:
    """Column standard deviation (ddof=1) over finite values; NaN with fewer than two (no warnings)."""
    ok = np.isfinite(x)
    n = ok.sum(axis=0)
    mean = np.where(ok, x, 0.0).sum(axis=0) / np.maximum(n, 1)
    ss = (np.where(ok, x - mean, 0.0) ** 2).sum(axis=0)
    return np.where(n > 1, np.sqrt(ss / np.maximum(n - 1, 1)), np.nan)


def _ratio(num: FloatArray, den: FloatArray) -> FloatArray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)


def rates(totals: FloatArray, k: int) -> FloatArray:
    """Totals (rows: [reached_k.., accepted_k.., steps, accepted, emitted]) -> [cond.., uncond.., aps, len]."""
    reached, acc = totals[:, :k], totals[:, k : 2 * k]
    steps, accsum, emitted = totals[:, 2 * k : 2 * k + 1], totals[:, 2 * k + 1], totals[:, 2 * k + 2]
    return np.hstack(
        [
            _ratio(acc, reached),
            _ratio(acc, steps),
            _ratio(accsum, steps[:, 0])[:, None],
            _ratio(emitted, steps[:, 0])[:, None],
        ]
    )


def log_odds_columns(totals: FloatArray, k: int) -> FloatArray:
    """Totals (as in :func:`rates`) -> each position's Gart-adjusted log odds
    ``log((accepted + 1/2) / (reached - accepted + 1/2))``; NaN where a position was not reached."""
    reached, acc = totals[:, :k], totals[:, k : 2 * k]
    with np.errstate(invalid="ignore", divide="ignore"):
        out: FloatArray = np.where(reached > 0, np.log((acc + 0.5) / (reached - acc + 0.5)), np.nan)
    return out


def bootstrap(
    rng: np.random.Generator, ma: FloatArray, mb: FloatArray, resamples: int, joint: bool
) -> tuple[FloatArray, FloatArray]:
    """Resampled column totals: requests drawn with replacement (the same draw for both runs if joint)."""
    na, nb = ma.shape[0], mb.shape[0]
    out_a = np.full((resamples, ma.shape[1]), np.nan)
    out_b = np.full((resamples, mb.shape[1]), np.nan)
    chunk = max(1, min(resamples, 4_000_000 // max(na, nb, 1)))

    def weights(n: int, c: int) -> FloatArray:
        idx = rng.integers(0, n, size=(c, n)) + (np.arange(c) * n)[:, None]
        return np.bincount(idx.ravel(), minlength=c * n).reshape(c, n).astype(np.float64)

    for s in range(0, resamples, chunk):
        c = min(chunk, resamples - s)
        wa = weights(na, c) if na else None
        wb = wa if joint else (weights(nb, c) if nb else None)
        if wa is not None:
            out_a[s : s + c] = wa @ ma
        if wb is not None:
            out_b[s : s + c] = wb @ mb
    return out_a, out_b


def paired_rows(
    sa: StepArrays, sb: StepArrays, ma: IntArray, mb: IntArray, mode: str
) -> Iterator[tuple[int, int, range, range, str]]:
    """Per pair of requests (``ma``, ``mb``: rows of A's and B's requests, as ``pairing.pair_requests`` gave
    them): the two requests, their step rows in A and in B, and the pair's key (the prompt hash with ``mode``
    ``prompt_hash``, else A's request id)."""
    starts_a, starts_b = sa.request_slices(), sb.request_slices()
    for ia, ib in zip(ma.tolist(), mb.tolist(), strict=True):
        key = sa.prompt_hashes[ia] if mode == "prompt_hash" else sa.request_ids[ia]
        yield ia, ib, range(int(starts_a[ia]), int(starts_a[ia + 1])), range(int(starts_b[ib]), int(starts_b[ib + 1])), str(key)
