"""Calibration of the tensor verdicts' defaults: false alarms on valid computations, detection of drift.

Each *comparison* holds one tensor per size (16 Ki, 128 Ki and 1 Mi elements), each the output of a
seeded bf16 GEMM ``y = x @ W.T`` (inputs bf16, K = 1024) compared with its FP64 reference. The floor
pair is the reference against ``torch``'s bf16 GEMM; the candidate is judged with the default policy
(``floor_multiple = FLOOR_MULTIPLE``, bootstrap intervals), by the same calls ``compare_runs`` makes.

Null candidates (valid computations, must pass):
- ``split-k``: the GEMM as two K halves added in fp32, then rounded to bf16 (another valid kernel);
- ``jitter``: the fp32 GEMM result perturbed by an independent relative error of 2^-12 (about what a
  different fp32 accumulation order costs at this K), then rounded to bf16: a rerun whose rounding
  decisions differ from the floor's independently;
- ``bf16 hand-off``: the floor and the candidate both add two bf16 partial GEMMs in bf16 (a PP hand-off),
  split at two different random points of K: two valid kernels whose errors are independent and of the
  same size (here the floor pair is the reference against the first split).

Drift candidates: ``ref + s * c * (handoff - ref)`` for s in 1.25, 1.5, 1.75, 2, 3, where ``c`` scales the
second hand-off's error to its floor's rel_l2 (kept in float32), so the true ratio is exactly s; judged
per tensor size against the first hand-off's floor.

Rounding floors: the ratio of valid results to the rounding floor of their dtype (what the
``rounding_multiple`` defaults must admit): a bf16 GEMM, a bf16 chain GEMM -> RMSNorm -> GEMM -> RMSNorm
-> RoPE, and fp32 GEMMs at K = 512, 7168 and 43008 (the Kimi-K3 concat width); and one row that must be
caught (DETECT): an fp32 result that went through bf16.

Small tensors and runs of them (``--small``; NumPy float64 errors, judged by the real code: ``Policy.decide_many``,
``pooling.judge_units`` and ``compare.tensor_verdict``, as ``compare_runs`` calls them):

- *coverage*: single pairs of 8, 16, 32, 64 and 1,024 elements, one decode token (4 x 256) and 64 x 256, the
  reference Gaussian; the floor's and the candidate's errors independent draws of one of three noises:
  ``gauss`` (additive Gaussian), ``bf16`` (the bf16 rounding of a value perturbed by 2^-9 relative: rounding noise
  that scales with |a|) and ``outliers`` (bf16 noise on a reference with 1 element in 16 thirty times larger). A
  drift s multiplies the candidate's error draw by s: random drift whose true ratio is s, never a scaled copy of
  the floor's error. Counted: how often the 95% interval misses s, and the verdict;
- *runs*: runs of 20, 200 and 2,000 pairs of 16 elements (steps x 4 layers of one capture point, Gaussian noise),
  null, with one layer drifting 2x at every step, and with one step drifting 3x in every layer: the run's verdict,
  with its pooled units and multiplicity.

    python benchmarks/calibration.py                 # the committed results (benchmarks/calibration.md)
    python benchmarks/calibration.py --replicates 20 # a quick look
    python benchmarks/calibration.py --small          # the small-tensor and run tables alone
"""

from __future__ import annotations

import argparse
import math
import time
from collections import Counter

import numpy as np
import torch

from validator.judging.compare import Measured, PairResult, floor_from, measure_tensors, pair_frontier, tensor_verdict
from validator.judging.policy import FLOOR_MULTIPLE, Floor, Policy, default_rounding_multiple, fail_level
from validator.judging.pooling import Member, judge_units, plan_units, settled
from validator.numerics.floors import BlockSums, block_edges, rounding_sums
from validator.numerics.metrics import TensorMetrics, compare_tensors

SIZES = [(64, 256), (256, 512), (1024, 1024)]  # tokens x hidden: 16 Ki, 128 Ki, 1 Mi elements
K = 1024
DRIFTS = [1.25, 1.5, 1.75, 2.0, 3.0]
POLICY = Policy()


def _inputs(seed: int, tokens: int, hidden: int, k: int = K) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, k, generator=g)
    x[:, :4] *= 30.0  # a few outlier channels, as residual streams have
    scale = torch.exp(0.5 * torch.randn(tokens, 1, generator=g))  # per-token scale
    w = torch.randn(hidden, k, generator=g) / math.sqrt(k)
    return (x * scale).bfloat16(), w.bfloat16()


def _kernels(seed: int, tokens: int, hidden: int) -> dict[str, torch.Tensor]:
    x, w = _inputs(seed, tokens, hidden)
    ref = x.double() @ w.double().T
    exact32 = x.float() @ w.float().T
    h = K // 2
    split = (x[:, :h].float() @ w[:, :h].float().T + x[:, h:].float() @ w[:, h:].float().T).bfloat16()
    g = torch.Generator().manual_seed(seed + 7)
    jitter = (exact32 * (1 + 2.0**-12 * torch.randn(exact32.shape, generator=g))).bfloat16()
    s1, s2 = (int(v) for v in torch.randint(K // 8, K - K // 8, (2,), generator=g))

    def handoff(cut: int) -> torch.Tensor:
        return (x[:, :cut] @ w[:, :cut].T) + (x[:, cut:] @ w[:, cut:].T)  # bf16 + bf16, rounded to bf16

    return {"ref": ref, "floor": (x @ w.T), "split-k": split, "jitter": jitter, "handoff-floor": handoff(s1), "bf16 hand-off": handoff(s2)}


RATIOS: dict[str, list[float]] = {}


def _judge(ref: torch.Tensor, cand: torch.Tensor, floor: Floor, dtype_b: str, kind: str = "") -> str:
    """The default policy's status for one pair, through the calls compare_runs makes."""
    got = measure_tensors(ref, cand)
    assert got.metrics is not None
    d = POLICY.decide("y", got.metrics, floor, have_floor=True, dtypes=("float64", dtype_b), blocks=got.blocks)
    if kind and d.value is not None and d.interval is not None:
        RATIOS.setdefault(kind, []).extend([d.value, d.interval[1] - d.interval[0]])
    return d.status


def _measured(ref: torch.Tensor, floor_cand: torch.Tensor) -> Floor:
    return floor_from(measure_tensors(ref, floor_cand), Measured(None, None), have_floor=True)


def measured_floor(replicates: int) -> tuple[dict[str, Counter[str]], dict[tuple[float, int], Counter[str]]]:
    null: dict[str, Counter[str]] = {"split-k": Counter(), "jitter": Counter(), "bf16 hand-off": Counter()}
    drift: dict[tuple[float, int], Counter[str]] = {(s, t * h): Counter() for s in DRIFTS for t, h in SIZES}
    for r in range(replicates):
        per_kind: dict[str, list[str]] = {k: [] for k in null}
        for i, (t, h) in enumerate(SIZES):
            ks = _kernels(1000 * r + i, t, h)
            floor = _measured(ks["ref"], ks["floor"])
            for kind in null:
                fl = _measured(ks["ref"], ks["handoff-floor"]) if kind == "bf16 hand-off" else floor
                per_kind[kind].append(_judge(ks["ref"], ks[kind], fl, "bfloat16", f"{kind} {t * h:,}"))
            hfloor = _measured(ks["ref"], ks["handoff-floor"])
            err = ks["bf16 hand-off"].double() - ks["ref"]
            err *= hfloor.rel_l2 / float(err.norm() / ks["ref"].norm())  # rel_l2 of ref + err == the floor's
            for s in DRIFTS:
                drift[(s, t * h)][_judge(ks["ref"], (ks["ref"] + s * err).float(), hfloor, "bfloat16")] += 1
        for kind, statuses in per_kind.items():  # a comparison fails if any of its tensors fails
            null[kind]["fail" if "fail" in statuses else "inconclusive" if "inconclusive" in statuses else "pass"] += 1
    return null, drift


def _rmsnorm(x: torch.Tensor) -> torch.Tensor:
    xf = x.double() if x.dtype == torch.float64 else x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype)


def _rope(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    pos = torch.arange(x.shape[0], dtype=torch.float64)[:, None]
    ang = pos / 10000.0 ** (torch.arange(d, dtype=torch.float64) / d)
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    a, b = x[..., :d], x[..., d:]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], -1)


def _chain(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    return _rope(_rmsnorm(_rmsnorm(x @ w1.T) @ w2.T))


def rounding_floor(replicates: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for r in range(replicates):
        x, w = _inputs(5000 + r, 256, 512)
        ref = x.double() @ w.double().T
        rows = {"bf16 GEMM (K 1024)": (ref, (x @ w.T), "bfloat16")}
        g = torch.Generator().manual_seed(9000 + r)
        w2 = (torch.randn(512, 512, generator=g) / math.sqrt(512)).bfloat16()
        rows["bf16 chain GEMM-norm-GEMM-norm-RoPE"] = (_chain(x.double(), w.double(), w2.double()), _chain(x, w, w2), "bfloat16")
        for k in (512, 7168, 43008):
            if r >= max(2, replicates // 10) and k == 43008:
                continue  # the widest GEMM is slow on a CPU: fewer replicates
            xk, wk = _inputs(7000 + r, 64, 256, k)
            rows[f"fp32 GEMM (K {k})"] = (xk.double() @ wk.double().T, xk.float() @ wk.float().T, "float32")
            if k == 7168:  # what the wide multiple exists to catch: an fp32 hand-off that went through bf16
                rows["DETECT: fp32 GEMM (K 7168) passed through bf16"] = (rows[f"fp32 GEMM (K {k})"][0], (xk.float() @ wk.float().T).bfloat16().float(), "float32")
        for name, (ref_t, cand, dt) in rows.items():
            rs = rounding_sums(ref_t, dt)
            out.setdefault(name, []).append(compare_tensors(ref_t, cand).rel_l2 / rs.rel_l2)
    return out


SMALL_SHAPES = [(8,), (16,), (32,), (64,), (1024,), (4, 256), (64, 256)]
NOISES = ("gauss", "bf16", "outliers")
SMALL_DRIFTS = (1.0, 1.5, 2.0, 3.0)


def _bf16(x: np.ndarray) -> np.ndarray:
    """Round to bfloat16 (nearest even), in float64."""
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32).astype(np.float64)


def _small_pair(rng: np.random.Generator, shape: tuple[int, ...], noise: str, s: float) -> tuple[TensorMetrics, BlockSums, Floor]:
    """A reference, a floor error and a candidate error drawn independently (the candidate's times ``s``): the
    pair's metrics, block sums and measured floor, as compare_runs hands them to the policy."""
    n = math.prod(shape)
    a = rng.standard_normal(n)
    if noise == "outliers":
        a[rng.choice(n, max(1, n // 16), replace=False)] *= 30.0
    if noise == "gauss":
        ef, ec = 1e-3 * rng.standard_normal(n), 1e-3 * s * rng.standard_normal(n)
    else:
        ef = _bf16(a * (1 + 2.0**-9 * rng.standard_normal(n))) - a
        ec = s * (_bf16(a * (1 + 2.0**-9 * rng.standard_normal(n))) - a)
    edges = block_edges(shape)
    rows = shape[0] if len(shape) > 1 and shape[0] >= 64 else n

    def sums(e: np.ndarray) -> BlockSums:
        return BlockSums(np.add.reduceat(e * e, edges[:-1]), np.add.reduceat(a * a, edges[:-1]), rows)

    cand, floor = sums(ec), sums(ef)
    rel = math.sqrt(float(cand.d2.sum() / cand.a2.sum()))
    m = TensorMetrics(n, "float64", "bfloat16", float(np.linalg.norm(a)), float(np.linalg.norm(a + ec)), rel,
                      1.0, float(np.abs(ec).max()), float(np.abs(ec).mean()), 0.0, 0.0, 1.0, 0.0, 0.0, 0, 0, 0, None)
    return m, cand, Floor("measured", floor.rel_l2, floor)


MISSES: dict[tuple[tuple[int, ...], str, float], int] = {}


def small_coverage(replicates: int) -> dict[tuple[tuple[int, ...], str, float], Counter[str]]:
    """Single pairs: how often the interval misses the true ratio, and the verdicts (one unit each)."""
    rng = np.random.default_rng(20261206)
    out: dict[tuple[tuple[int, ...], str, float], Counter[str]] = {}
    for shape in SMALL_SHAPES:
        for noise in NOISES:
            for s in SMALL_DRIFTS:
                drawn = [_small_pair(rng, shape, noise, s) for _ in range(replicates)]
                ds = POLICY.decide_many([("y", m, fl, ("float64", "bfloat16"), c) for m, c, fl in drawn], have_floor=True)
                c: Counter[str] = Counter(d.status for d in ds)
                MISSES[(shape, noise, s)] = sum(not (d.interval and d.interval[0] <= s <= d.interval[1]) for d in ds)
                out[(shape, noise, s)] = c
    return out


RUN_SIZES = (20, 200, 2000)
LAYERS = 4


def _drift(case: str, coords: dict[str, int]) -> float:
    if case == "layer 2 at 2x" and coords["layer"] == 2:
        return 2.0
    if case == "step 0 at 3x" and coords["step"] == 0:
        return 3.0
    return 1.0


def small_runs(replicates: int, elements: int = 16) -> dict[tuple[int, str], Counter[str]]:
    """Runs of small pairs (steps x LAYERS of one capture point), null and with layer 2 drifting 2x: the run's
    tensor verdict, through the calls compare_runs makes."""
    rng = np.random.default_rng(20261207)
    out: dict[tuple[int, str], Counter[str]] = {}
    for size in RUN_SIZES:
        ids = [("router", {"step": i // LAYERS, "layer": i % LAYERS}) for i in range(size)]
        plan = plan_units(ids)
        units = size + len(plan)
        for case in ("null", "layer 2 at 2x", "step 0 at 3x"):
            c: Counter[str] = Counter()
            for _ in range(replicates):
                drawn = [_small_pair(rng, (elements,), "gauss", _drift(case, cd)) for _, cd in ids]
                ds = POLICY.decide_many([("router", m, fl, ("float64", "bfloat16"), cb) for m, cb, fl in drawn],
                                        have_floor=True, units=units)
                members: list[Member | None] = [Member(d.judged, d.limit, d.floor_kind, cb, fl.blocks, elements)
                                                for d, (_, cb, fl) in zip(ds, drawn)]
                pooled = judge_units(plan, members, level=fail_level(units))
                by_pool = settled(pooled)
                pairs = [PairResult("router", cd, f"router step={cd['step']} layer={cd['layer']}", d.status, m, d, (elements,),
                                    (elements,), capture_index=i,
                                    pooled_pass=i in by_pool and d.status == "inconclusive" and d.borderline)
                         for i, ((_, cd), d, (m, _, _)) in enumerate(zip(ids, ds, drawn))]
                verdict, _ = tensor_verdict(pairs, [], [], POLICY, pair_frontier(pairs), pooled)
                c[verdict] += 1
                c["pairs alone fail"] += sum(d.status == "fail" for d in ds)
            out[(size, case)] = c
    return out


def print_small(replicates: int) -> None:
    cov = small_coverage(replicates)
    print(f"## Single small pairs: random drift, measured floor, limit {FLOOR_MULTIPLE}x ({replicates} pairs per row)\n")
    print("| elements (shape) | noise | true ratio | interval misses it | fail | inconclusive | pass |\n|---|---|---|---|---|---|---|")
    for (shape, noise, s), c in cov.items():
        n = sum(c.values())
        print(f"| {math.prod(shape):,} {shape} | {noise} | {s:g} | {MISSES[(shape, noise, s)] / n:.1%} | {_rate(c, 'fail')} | "
              f"{_rate(c, 'inconclusive')} | {_rate(c, 'pass')} |")
    runs = small_runs(replicates)
    print(f"\n## Runs of small pairs (16 elements each, steps x {LAYERS} layers, pooled units, Bonferroni FAIL level)\n")
    print("| pairs per run | candidate | runs | run FAIL | run INCONCLUSIVE | run PASS | pairs failing alone |\n|---|---|---|---|---|---|---|")
    for (size, case), c in runs.items():
        n = sum(c[k] for k in ("fail", "inconclusive", "pass"))
        print(f"| {size:,} | {case} | {n} | {c['fail'] / n:.1%} | {c['inconclusive'] / n:.1%} | {c['pass'] / n:.1%} | "
              f"{c['pairs alone fail']} |")


def _rate(c: Counter[str], key: str) -> str:
    n = sum(c.values())
    return f"{c[key] / n:.1%} ({c[key]}/{n})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replicates", type=int, default=200)
    ap.add_argument("--small", action="store_true", help="the small-tensor and run tables alone")
    args = ap.parse_args()
    torch.manual_seed(0)
    t0 = time.time()
    print_small(args.replicates)
    print(f"\n({time.time() - t0:.0f} s)\n")
    if args.small:
        return
    null, drift = measured_floor(args.replicates)
    print(f"## Measured floor, default floor_multiple = {FLOOR_MULTIPLE} ({args.replicates} comparisons per null, "
          f"{len(SIZES)} tensors each)\n")
    print("| null candidate | false fail (per comparison) | inconclusive | pass |\n|---|---|---|---|")
    for kind, c in null.items():
        print(f"| {kind} | {_rate(c, 'fail')} | {_rate(c, 'inconclusive')} | {_rate(c, 'pass')} |")
    print("\n| null candidate, tensor elements | median ratio | max ratio | median interval width |\n|---|---|---|---|")
    for key, vals in RATIOS.items():
        r, w = sorted(vals[0::2]), sorted(vals[1::2])
        print(f"| {key} | {r[len(r) // 2]:.3f} | {r[-1]:.3f} | {w[len(w) // 2]:.3f} |")
    print("\n| drift (x floor) | tensor elements | detected (fail) | inconclusive | pass |\n|---|---|---|---|---|")
    for (s, n), c in drift.items():
        print(f"| {s:g}x | {n:,} | {_rate(c, 'fail')} | {_rate(c, 'inconclusive')} | {_rate(c, 'pass')} |")
    rf = rounding_floor(max(10, args.replicates // 10))
    print("\n## Rounding floor: valid results as a multiple of their dtype's rounding floor\n")
    print("| computation | replicates | min | median | max | default rounding_multiple |\n|---|---|---|---|---|---|")
    for name, vals in rf.items():
        vals.sort()
        dt = "float32" if "fp32" in name else "bfloat16"
        print(f"| {name} | {len(vals)} | {vals[0]:.2f} | {vals[len(vals) // 2]:.2f} | {vals[-1]:.2f} | "
              f"{default_rounding_multiple(dt):g} |")
    print(f"\n({time.time() - t0:.0f} s, torch {torch.__version__}, {torch.get_num_threads()} threads)")


if __name__ == "__main__":
    main()
