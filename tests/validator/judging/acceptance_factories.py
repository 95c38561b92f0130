"""Seeded synthetic acceptance records with known per-position conditional acceptance rates."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from validator.judging.acceptance import StepArrays
from validator.runs.acceptance_records import records_to_frame


def make_records(
    n_steps: int,
    rates: Sequence[float],
    *,
    steps_per_request: int = 50,
    seed: int = 0,
    request_sd: float = 0.0,
    prune: float = 0.0,
    bonus: bool = True,
    prefix: str = "r",
    prompt_hash: bool = False,
    output_tokens: bool = False,
    vocab: int = 32000,
) -> list[dict[str, Any]]:
    """``n_steps`` verify steps; position k is accepted with probability ``rates[k]`` once reached.

    ``request_sd`` adds a per-request random effect on the logit scale (correlated steps within a
    request); ``prune`` is the probability that a step proposes fewer than ``len(rates)`` drafts.
    """
    rng = np.random.default_rng(seed)
    k = len(rates)
    n_req = max(1, -(-n_steps // steps_per_request))
    request = np.arange(n_steps) // steps_per_request
    logit = np.log(np.asarray(rates) / (1 - np.asarray(rates)))
    offset = rng.normal(0.0, request_sd, size=n_req) if request_sd > 0 else np.zeros(n_req)
    p = 1 / (1 + np.exp(-(logit[None, :] + offset[request][:, None])))
    num = np.full(n_steps, k)
    if prune > 0:
        pruned = rng.random(n_steps) < prune
        num[pruned] = rng.integers(1, k + 1, size=int(pruned.sum()))
    ok = (rng.random((n_steps, k)) < p) & (np.arange(k)[None, :] < num[:, None])
    accepted = np.cumprod(ok, axis=1).sum(axis=1)
    tokens = rng.integers(0, vocab, size=(n_steps, k + 1))
    out: list[dict[str, Any]] = []
    for i in range(n_steps):
        r = int(request[i])
        rec: dict[str, Any] = {
            "request_id": f"{prefix}{r}",
            "step": i - r * steps_per_request,
            "proposed": tokens[i, : num[i]].tolist(),
            "accepted": int(accepted[i]),
        }
        if not bonus:
            rec["bonus"] = False
        if prompt_hash:
            rec["prompt_hash"] = f"h{r}"
        if output_tokens:
            rec["output_tokens"] = tokens[i, : accepted[i]].tolist() + ([int(tokens[i, k])] if bonus else [])
        out.append(rec)
    return out


def make_frame(n_steps: int, rates: Sequence[float], **kwargs: Any) -> pd.DataFrame:
    return records_to_frame(make_records(n_steps, rates, **kwargs))


def step(request_id: str, step: int, proposed: Sequence[int], accepted: int, **extra: Any) -> dict[str, Any]:
    """One hand-written record."""
    return {"request_id": request_id, "step": step, "proposed": list(proposed), "accepted": accepted, **extra}


def make_steps(
    rng: np.random.Generator, rates: Sequence[float], requests: int, steps_per_request: int, prefix: str = "r"
) -> StepArrays:
    """A run as :class:`StepArrays` directly (fast, for many replicates): every step proposes
    ``len(rates)`` drafts, position k accepted with probability ``rates[k]`` once reached."""
    n = requests * steps_per_request
    ok = rng.random((n, len(rates))) < np.asarray(rates)[None, :]
    return steps_from_accepted(np.cumprod(ok, axis=1).sum(axis=1), len(rates), requests, prefix)


def steps_from_accepted(accepted: Sequence[int] | np.ndarray, proposed: int, requests: int, prefix: str = "r") -> StepArrays:
    """Steps with the given accepted counts (``proposed`` drafts each), dealt round-robin to ``requests``
    requests, so every request gets the same mix."""
    acc = np.asarray(accepted, dtype=np.int64)
    request = np.arange(len(acc)) % requests
    order = np.argsort(request, kind="stable")
    step = np.arange(len(acc)) // requests
    return StepArrays(
        request_ids=tuple(f"{prefix}{r}" for r in range(requests)),
        prompt_hashes=(None,) * requests,
        request=request[order].astype(np.int64),
        step=step[order].astype(np.int64),
        num_proposed=np.full(len(acc), proposed, dtype=np.int64),
        accepted=acc[order],
        bonus=np.ones(len(acc), dtype=bool),
    )
