"""Paired analyses: requests matched across the runs (by prompt hash or request id), their steps matched by
index, McNemar's test on those steps, where greedy outputs first diverge, and draft-logprob agreement."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy.special import logsumexp

from validator.judging.acceptance.primitives import IntArray, mcnemar_test
from validator.judging.acceptance.results import (
    DivergenceSummary,
    LogprobComparison,
    McNemarResult,
    PairBy,
    RequestDivergence,
)
from validator.judging.acceptance.steps import StepArrays, paired_rows


def _hash_usable(s: StepArrays) -> bool:
    h = s.prompt_hashes
    return bool(h) and all(x is not None for x in h) and len(set(h)) == len(h)


def pair_requests(sa: StepArrays, sb: StepArrays, pair_by: PairBy) -> tuple[str, IntArray, IntArray]:
    empty = np.zeros(0, dtype=np.int64)
    if pair_by == "none":
        return "none", empty, empty
    if pair_by not in ("auto", "prompt_hash", "request_id"):
        raise ValueError(f"pair_by must be 'auto', 'prompt_hash', 'request_id' or 'none', got {pair_by!r}")
    usable = _hash_usable(sa) and _hash_usable(sb)
    if pair_by == "prompt_hash" and not usable:
        raise ValueError("pair_by='prompt_hash' needs one distinct prompt_hash per request in both runs")
    ka: Sequence[str | None]
    kb: Sequence[str | None]
    if pair_by == "prompt_hash" or (pair_by == "auto" and usable):
        mode, ka, kb = "prompt_hash", sa.prompt_hashes, sb.prompt_hashes
    else:
        if pair_by == "auto" and set(sa.request_ids) != set(sb.request_ids):
            return "none", empty, empty
        mode, ka, kb = "request_id", sa.request_ids, sb.request_ids
    where_b = {k: i for i, k in enumerate(kb)}
    pairs = [(i, where_b[k]) for i, k in enumerate(ka) if k in where_b]
    if not pairs:
        return "none", empty, empty
    arr = np.asarray(pairs, dtype=np.int64)
    return mode, arr[:, 0], arr[:, 1]


def step_pairs(sa: StepArrays, sb: StepArrays, ma: IntArray, mb: IntArray) -> tuple[IntArray, IntArray]:
    """Rows of A and B for the same request pair and step index."""
    pa = np.full(sa.n_requests, -1, dtype=np.int64)
    pb = np.full(sb.n_requests, -1, dtype=np.int64)
    pa[ma] = np.arange(len(ma))
    pb[mb] = np.arange(len(mb))
    big = int(max(sa.step.max(initial=0), sb.step.max(initial=0))) + 1
    rows_a = np.flatnonzero(pa[sa.request] >= 0)
    rows_b = np.flatnonzero(pb[sb.request] >= 0)
    key_a = pa[sa.request[rows_a]] * big + sa.step[rows_a]
    key_b = pb[sb.request[rows_b]] * big + sb.step[rows_b]
    _, ia, ib = np.intersect1d(key_a, key_b, assume_unique=True, return_indices=True)
    return rows_a[ia], rows_b[ib]


def paired_mcnemar(
    sa: StepArrays, sb: StepArrays, rows_a: IntArray, rows_b: IntArray, k: int, alpha: float
) -> McNemarResult:
    na, aa = sa.num_proposed[rows_a], sa.accepted[rows_a]
    nb, ab = sb.num_proposed[rows_b], sb.accepted[rows_b]
    both_reached = (na > k) & (aa >= k) & (nb > k) & (ab >= k)
    xa, xb = (aa > k)[both_reached], (ab > k)[both_reached]
    a_only, b_only = int((xa & ~xb).sum()), int((~xa & xb).sum())
    stat, p, method = mcnemar_test(a_only, b_only)
    return McNemarResult(
        position=k,
        pairs=int(both_reached.sum()),
        both=int((xa & xb).sum()),
        a_only=a_only,
        b_only=b_only,
        neither=int((~xa & ~xb).sum()),
        statistic=stat,
        p_value=p,
        method=method,
        significant=p < alpha,
    )


def _emitted(s: StepArrays, row: int, source: str) -> list[int]:
    if source == "output_tokens":
        return [int(x) for x in s.output_tokens[row]]
    acc = int(s.accepted[row])
    toks = [int(x) for x in s.proposed[row][:acc]]
    if source == "target_tokens" and s.bonus[row]:
        tt = s.target_tokens[row]
        if len(tt) > acc:
            toks.append(int(tt[acc]))
    return toks


def _divergence_source(sa: StepArrays, sb: StepArrays, rows_a: IntArray, rows_b: IntArray) -> str | None:
    for source, ca, cb in (
        ("output_tokens", sa.output_tokens, sb.output_tokens),
        ("target_tokens", sa.target_tokens, sb.target_tokens),
        ("proposed", sa.proposed, sb.proposed),
    ):
        if (
            len(ca)
            and len(cb)
            and all(ca[i] is not None for i in rows_a)
            and all(cb[i] is not None for i in rows_b)
        ):
            return source
    return None


def divergence_summary(
    sa: StepArrays, sb: StepArrays, ma: IntArray, mb: IntArray, mode: str
) -> DivergenceSummary | None:
    starts_a, starts_b = sa.request_slices(), sb.request_slices()
    all_a = (
        np.concatenate([np.arange(starts_a[i], starts_a[i + 1]) for i in ma])
        if len(ma)
        else np.zeros(0, np.int64)
    )
    all_b = (
        np.concatenate([np.arange(starts_b[i], starts_b[i + 1]) for i in mb])
        if len(mb)
        else np.zeros(0, np.int64)
    )
    source = _divergence_source(sa, sb, all_a.astype(np.int64), all_b.astype(np.int64))
    if source is None:
        return None
    per: list[RequestDivergence] = []
    for ia, ib, ra, rb, key in paired_rows(sa, sb, ma, mb, mode):
        i = j = offset = compared = 0
        first_step: int | None = None
        first_tok: int | None = None
        while i < len(ra) and j < len(rb):
            s_a, s_b = int(sa.step[ra[i]]), int(sb.step[rb[j]])
            if s_a != s_b:
                first_step, first_tok = min(s_a, s_b), offset
                break
            ea, eb = _emitted(sa, ra[i], source), _emitted(sb, rb[j], source)
            compared += 1
            if ea != eb:
                common = next((t for t, (x, y) in enumerate(zip(ea, eb)) if x != y), min(len(ea), len(eb)))
                first_step, first_tok = s_a, offset + common
                break
            offset += len(ea)
            i, j = i + 1, j + 1
        else:
            if i < len(ra) or j < len(rb):  # one run went on for more steps
                first_step = int(sa.step[ra[i]]) if i < len(ra) else int(sb.step[rb[j]])
                first_tok = offset
        per.append(
            RequestDivergence(
                key=key,
                request_a=sa.request_ids[ia],
                request_b=sb.request_ids[ib],
                steps_compared=compared,
                first_divergent_step=first_step,
                first_divergent_token=first_tok,
            )
        )
    firsts = [p.first_divergent_step for p in per if p.first_divergent_step is not None]
    return DivergenceSummary(
        source=source,
        requests=len(per),
        diverged=len(firsts),
        median_first_step=float(np.median(firsts)) if firsts else math.nan,
        per_request=tuple(per),
    )


def _top_kl(
    ids_a: Sequence[int], lp_a: Sequence[float], ids_b: Sequence[int], lp_b: Sequence[float]
) -> float:
    """KL(A || B) over the tokens in both top-k lists, each side renormalised over them (NaN if none)."""
    map_b = dict(zip((int(t) for t in ids_b), (float(x) for x in lp_b), strict=True))
    common = [(float(x), map_b[int(t)]) for t, x in zip(ids_a, lp_a, strict=True) if int(t) in map_b]
    if not common:
        return math.nan
    la, lb = np.array([c[0] for c in common]), np.array([c[1] for c in common])
    if not np.isfinite(la).any() or not np.isfinite(lb).any():
        return math.nan
    la, lb = la - logsumexp(la), lb - logsumexp(lb)
    pa = np.exp(la)
    live = pa > 0
    if np.any(~np.isfinite(lb[live])):
        return math.inf
    return float(max(0.0, np.sum(pa[live] * (la[live] - lb[live]))))


def logprob_comparisons(
    sa: StepArrays,
    sb: StepArrays,
    rows_a: IntArray,
    rows_b: IntArray,
    ma: IntArray,
    divergence: DivergenceSummary | None,
    positions: int,
) -> dict[int, LogprobComparison]:
    """Per position, over paired steps up to each request's first divergent step with equal earlier drafts."""
    if divergence is None or not len(sa.draft_top_ids) or not len(sb.draft_top_ids) or not len(sa.proposed):
        return {}
    limit = {
        int(ia): (math.inf if d.first_divergent_step is None else d.first_divergent_step)
        for ia, d in zip(ma.tolist(), divergence.per_request, strict=True)
    }
    acc: dict[int, dict[str, list[float]]] = {}
    for ra, rb in zip(rows_a.tolist(), rows_b.tolist(), strict=True):
        if sa.step[ra] > limit[int(sa.request[ra])]:
            continue
        pa, pb = list(sa.proposed[ra]), list(sb.proposed[rb])
        ta, tb = sa.draft_top_ids[ra], sb.draft_top_ids[rb]
        fa, fb = sa.draft_logprob[ra], sb.draft_logprob[rb]
        for k in range(min(len(pa), len(pb), positions)):
            if pa[:k] != pb[:k]:
                break
            d = acc.setdefault(k, {"argmax": [], "overlap": [], "kl": [], "lp": []})
            if (
                fa is not None
                and fb is not None
                and pa[k] == pb[k]
                and fa[k] is not None
                and fb[k] is not None
            ):
                d["lp"].append(abs(float(fa[k]) - float(fb[k])))
            if ta is None or tb is None or ta[k] is None or tb[k] is None:
                continue
            la, lb = sa.draft_top_logprobs[ra][k], sb.draft_top_logprobs[rb][k]
            ida, idb = [int(t) for t in ta[k]], [int(t) for t in tb[k]]
            d["argmax"].append(float(ida[int(np.argmax(la))] == idb[int(np.argmax(lb))]))
            d["overlap"].append(len(set(ida) & set(idb)) / min(len(ida), len(idb)))
            kl = _top_kl(ida, la, idb, lb)
            if not math.isnan(kl):
                d["kl"].append(kl)
    out: dict[int, LogprobComparison] = {}
    for k, d in acc.items():
        if not d["argmax"] and not d["lp"]:
            continue
        out[k] = LogprobComparison(
            position=k,
            pairs=len(d["argmax"]),
            argmax_agreement=float(np.mean(d["argmax"])) if d["argmax"] else math.nan,
            topk_overlap=float(np.mean(d["overlap"])) if d["overlap"] else math.nan,
            kl_pairs=len(d["kl"]),
            kl_mean=float(np.mean(d["kl"])) if d["kl"] else math.nan,
            kl_max=float(np.max(d["kl"])) if d["kl"] else math.nan,
            logprob_pairs=len(d["lp"]),
            logprob_abs_diff_mean=float(np.mean(d["lp"])) if d["lp"] else math.nan,
        )
    return out
