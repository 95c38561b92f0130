"""RL train/rollout KL: estimators and step means against an independent float64 NumPy computation, the trend
statistics against scipy, the bootstrap SE against the ratio estimator's analytic SE, verdicts and edge cases."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as sps

from validator.app.cli import main
from validator.judging.rl_kl import KLSettings, kl_by_step, kl_estimators, mann_kendall, sen_slope


def _series(levels: list[float], *, samples: int = 32, tokens: int = 50, seed: int = 0) -> tuple[np.ndarray, ...]:
    """Log-ratios r ~ N(-L, 2L) per token, so that KL = E[k3] = L at each step (E[exp r] = 1)."""
    rng = np.random.default_rng(seed)
    st, sm, ro, tr = [], [], [], []
    for i, lv in enumerate(levels):
        n = samples * tokens
        r = rng.normal(-lv, math.sqrt(2 * lv), n)
        lp = -rng.exponential(1.0, n) - 0.5
        st.append(np.full(n, i))
        sm.append(np.repeat(np.arange(samples), tokens))
        ro.append(lp)
        tr.append(lp + r)
    return tuple(np.concatenate(x) for x in (st, sm, ro, tr))


def test_estimators_match_their_definitions() -> None:
    """k3 = exp(r) - 1 - r against 50-digit arithmetic, across the switch to the series at |r| = 1e-4."""
    import mpmath

    mpmath.mp.dps = 50
    ro = np.array([-0.1, -2.0, -5.0, -1e-9, -0.7, -1.0, -1.0, -1.0, -1.0], dtype=np.float64)
    tr = np.array([-0.1, -1.5, -7.0, -0.3, -0.7 + 1e-12, -1.0 - 0.99e-4, -1.0 + 1.01e-4, -1.0 + 3e-8, -21.0])
    k1, k2, k3 = kl_estimators(ro, tr)
    for i in range(ro.size):
        r = float(tr[i]) - float(ro[i])
        assert k1[i] == -r
        assert k2[i] == pytest.approx(r * r / 2, rel=1e-15, abs=0)
        want = float(mpmath.expm1(mpmath.mpf(r)) - mpmath.mpf(r))
        assert k3[i] == pytest.approx(want, rel=1e-11, abs=0)
    assert (k3 >= 0).all()


def test_step_means_match_numpy_token_means() -> None:
    st, sm, ro, tr = _series([1e-3, 2e-3, 4e-3], samples=5, tokens=7)
    rng = np.random.default_rng(3)
    perm = rng.permutation(st.size)  # input order does not matter
    rep = kl_by_step(st[perm], sm[perm], ro[perm], tr[perm], settings=KLSettings(floor=2e-3))
    for s, row in zip([0, 1, 2], rep.steps):
        m = st == s
        r = tr[m].astype(np.float64) - ro[m]
        assert row.step == s and row.tokens == int(m.sum()) and row.samples == 5
        assert row.k1 == pytest.approx(np.mean(-r), rel=1e-12)
        assert row.k2 == pytest.approx(np.mean(r * r / 2), rel=1e-12)
        assert row.k3 == pytest.approx(np.mean(np.exp(r) - 1 - r), rel=1e-9)


def test_bootstrap_se_is_over_samples_not_tokens() -> None:
    """Tokens of one sample share a per-sample offset: the SE must be the ratio estimator's over samples."""
    rng = np.random.default_rng(5)
    samples, tokens = 40, 100
    offset = np.repeat(rng.normal(0, 0.05, samples), tokens)
    r = offset + rng.normal(0, 0.01, samples * tokens)
    lp = np.full(r.size, -3.0)
    rep = kl_by_step(np.zeros(r.size, dtype=np.int64), np.repeat(np.arange(samples), tokens), lp, lp + r,
                     settings=KLSettings(floor=1e-3, resamples=4000))
    k3 = np.expm1(r) - r
    per_sample = k3.reshape(samples, tokens).mean(axis=1)  # equal token counts: the ratio is a mean of means
    analytic = per_sample.std(ddof=1) / math.sqrt(samples)
    naive = k3.std(ddof=1) / math.sqrt(k3.size)
    se = rep.steps[0].k3_se
    assert se == pytest.approx(analytic, rel=0.08)
    assert se > 3 * naive


def test_floor_estimated_from_the_first_steps() -> None:
    st, sm, ro, tr = _series([2e-3] * 10, samples=6, tokens=9, seed=2)
    rep = kl_by_step(st, sm, ro, tr, settings=KLSettings(floor_steps=4))
    m = st < 4
    r = tr[m] - ro[m]
    assert rep.floor == pytest.approx(np.mean(np.exp(r) - 1 - r), rel=1e-9)
    assert rep.floor_source == "estimated" and rep.floor_se > 0
    assert [s.role for s in rep.steps] == ["floor window"] * 4 + ["judged"] * 6
    assert rep.band == pytest.approx(1.5 * rep.floor)


@pytest.mark.parametrize("n", [3, 8, 20, 49])
def test_mann_kendall_matches_scipy_kendall_tau(n: int) -> None:
    rng = np.random.default_rng(n)
    for trial in range(5):
        y = rng.normal(size=n) + 0.1 * trial * np.arange(n)
        s, _, p, exact = mann_kendall(y)
        assert exact
        ref = sps.kendalltau(np.arange(n), y, method="exact", alternative="greater")
        assert p == pytest.approx(ref.pvalue, rel=1e-9, abs=1e-15)
        assert s == round(ref.statistic * n * (n - 1) / 2)


def test_mann_kendall_with_ties_and_long_series_matches_scipy_asymptotic() -> None:
    rng = np.random.default_rng(9)
    for y in (np.round(rng.normal(size=30), 1), rng.normal(size=80) + 0.01 * np.arange(80)):
        s, var, p, exact = mann_kendall(y)
        assert not exact
        ref = sps.kendalltau(np.arange(y.size), y, method="asymptotic", alternative="greater")
        assert p == pytest.approx(ref.pvalue, rel=1e-9)


def test_sen_slope_matches_scipy_theilslopes() -> None:
    rng = np.random.default_rng(4)
    for n in (5, 12, 40):
        x = np.arange(n, dtype=np.float64) * 2 + 3
        y = 0.3 * x + rng.normal(size=n)
        y[1] = y[2]  # a tie
        slope, lo, hi = sen_slope(x, y)
        ref = sps.theilslopes(y, x, alpha=0.95)
        assert (slope, lo, hi) == pytest.approx((ref.slope, ref.low_slope, ref.high_slope), rel=1e-12)


def test_verdicts() -> None:
    flat = kl_by_step(*_series([2e-3] * 12), settings=KLSettings(floor=2e-3))
    assert flat.verdict == "at floor" and flat.exit_code == 0
    jump = kl_by_step(*_series([2e-3] * 8 + [8e-3] * 2 + [2e-3] * 2), settings=KLSettings(floor=2e-3))
    assert jump.verdict == "above floor" and jump.exit_code == 1
    assert [s.step for s in jump.steps if s.status == "above floor"] == [8, 9]
    drift = kl_by_step(*_series(list(np.linspace(2e-3, 3.5e-3, 15))))
    assert drift.verdict == "diverging" and drift.exit_code == 1, drift.reasons
    assert drift.trend is not None and drift.trend.p_increasing < 0.01
    json.dumps(drift.to_dict(), allow_nan=False)
    assert "verdict: DIVERGING" in drift.format_table()


def test_inconclusive_cases() -> None:
    one_step = kl_by_step(*_series([2e-3]), settings=KLSettings(floor=2e-3))
    assert one_step.verdict == "inconclusive" and one_step.exit_code == 3
    assert any("trend test needs" in r for r in one_step.reasons)
    few = kl_by_step(*_series([2e-3] * 4))  # floor estimated from 5 steps: nothing left to judge
    assert few.verdict == "inconclusive" and "no step to judge" in few.reasons[0]
    one_sample = kl_by_step(*_series([2e-3] * 10, samples=1), settings=KLSettings(floor=2e-3))
    assert one_sample.verdict == "inconclusive"
    assert math.isnan(one_sample.steps[0].k3_se)
    json.dumps(one_sample.to_dict(), allow_nan=False)
    noisy = kl_by_step(*_series([2e-3] * 10, samples=2, tokens=2), settings=KLSettings(floor=2e-3))
    assert noisy.verdict in ("inconclusive", "at floor")


def test_bad_arrays_raise() -> None:
    with pytest.raises(ValueError, match="finite"):
        kl_by_step([0], [0], [math.nan], [-1.0])
    with pytest.raises(ValueError, match="no tokens"):
        kl_by_step([], [], [], [])
    with pytest.raises(ValueError, match="floor"):
        KLSettings(floor=-1)


def _jsonl(path: Path, levels: list[float], **kw: int) -> Path:
    st, sm, ro, tr = _series(levels, **kw)
    tok: dict[tuple[int, int], int] = {}
    with open(path, "w") as f:
        for a, b, c, d in zip(st.tolist(), sm.tolist(), ro.tolist(), tr.tolist()):
            i = tok[(a, b)] = tok.get((a, b), -1) + 1
            f.write(json.dumps({"step": a, "sample_id": f"s{b}", "token_index": i, "rollout_logprob": c,
                                "train_logprob": min(d, 0.0), "weight_version": a}) + "\n")
    return path


def test_cli_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    flat = _jsonl(tmp_path / "flat.jsonl", [2e-3] * 10, samples=16, tokens=20)
    assert main(["rl", "kl", str(flat), "--floor", "2e-3"]) == 0
    out = capsys.readouterr().out
    assert "verdict: AT FLOOR" in out and "k3 95% CI" in out
    jump = _jsonl(tmp_path / "jump.jsonl", [2e-3] * 8 + [1e-2] * 2, samples=16, tokens=20)
    assert main(["rl", "kl", str(jump), "--floor", "2e-3", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["verdict"] == "above floor" and doc["steps"][9]["weight_versions"] == [9]
    assert main(["rl", "kl", str(_jsonl(tmp_path / "one.jsonl", [2e-3], samples=3, tokens=3))]) == 3
    (tmp_path / "nan.jsonl").write_text('{"step": 0, "sample_id": "a", "token_index": 0, "rollout_logprob": NaN, "train_logprob": -1}\n')
    assert main(["rl", "kl", str(tmp_path / "nan.jsonl")]) == 2
    assert "nan.jsonl line 1: 'rollout_logprob' must be finite" in capsys.readouterr().err
    assert main(["rl", "kl", str(flat), "--floor", "-1"]) == 2
