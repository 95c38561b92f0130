"""validator.numerics.ranges: a pair measured in ranges and merged gives the bits of the whole pair measured at
once (``floors.measure_blocks``, what a comparison runs): metrics, block sums, NaN counts, the largest ULP
distance, and the rounding floor."""

from __future__ import annotations

import math
import random

import pytest
import torch

from tests.validator.numerics.test_backends import DTYPES, pair, with_nonfinite
from tests.validator.numerics.test_batched import bits
from validator.numerics.backends.cpu import row_plan
from validator.numerics.floors import block_edges, measure_blocks, rounding_sums
from validator.numerics.metrics import MetricInputError
from validator.numerics.ranges import ROW, RangePartials, is_cut, measure_range, merge, rounding_range


def cuts_of(shape: tuple[int, ...]) -> list[int]:
    """Every element where a range may start: the first element of each row of partials."""
    numel = math.prod(shape)
    starts, _ = row_plan(block_edges(shape), numel)
    return [int(s) for s in starts[:-1]]


def ranges_of(shape: tuple[int, ...], how: str, seed: int = 0) -> list[tuple[int, int]]:
    numel = math.prod(shape)
    cuts = cuts_of(shape)
    edges = block_edges(shape)
    if how == "one":
        chosen = [0]
    elif how == "edges":  # every row block its own range
        chosen = sorted(set(edges[:-1]))
    elif how == "rows":  # every row of partials its own range
        chosen = cuts
    else:  # a few cuts anywhere allowed, inside row blocks included
        rng = random.Random(seed)
        chosen = sorted({0, *rng.sample(cuts, min(len(cuts), 5))})
    bounds = [*chosen, numel]
    return [(lo, hi) for lo, hi in zip(bounds, bounds[1:]) if hi > lo]


def in_ranges(a: torch.Tensor, b: torch.Tensor, spans: list[tuple[int, int]]) -> list[RangePartials]:
    """Each range measured from its own copy of its elements (as a task reads them)."""
    shape = tuple(a.shape)
    fa, fb = a.reshape(-1), b.reshape(-1)
    return [measure_range(fa[lo:hi].clone(), fb[lo:hi].clone(), shape, lo) for lo, hi in spans]


def spread(dt: torch.dtype, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sign flips and scalings: wide ULP distances, exponents far apart."""
    a, b = pair(dt, n, seed=3, noise=0.05)
    b[: n // 50] = (-a[: n // 50].double()).to(dt)
    b[n // 50 : n // 25] = (a[n // 50 : n // 25].double() * 37).to(dt)
    return a, b


def cases() -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    out: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for dt in DTYPES:
        name = str(dt).removeprefix("torch.")
        a, b = with_nonfinite(*pair(dt, 300 * 77, seed=1))
        out[f"nonfinite-{name}-300x77"] = (a.view(300, 77), b.view(300, 77))
        out[f"plain-{name}-20000"] = pair(dt, 20_000, seed=2)
    for dt in (torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn):
        a, b = spread(dt, 256 * 513)
        out[f"spread-{str(dt).removeprefix('torch.')}-256x513"] = (a.view(256, 513), b.view(256, 513))
    a64, b16 = pair(torch.float64, 128 * 640, seed=5, noise=0.002)
    out["f64-vs-bf16-128x640"] = (a64.view(128, 640), b16.to(torch.bfloat16).view(128, 640))
    a32, b32 = with_nonfinite(*pair(torch.float32, 1000 * 3 * 7, seed=6))
    out["f32-vs-bf16-1000x3x7"] = (a32.view(1000, 3, 7), b32.to(torch.bfloat16).view(1000, 3, 7))
    z = torch.zeros(64, 4096, dtype=torch.bfloat16)
    out["zeros-bf16"] = (z, z.clone())
    out["zero-ref-bf16"] = (z, pair(torch.bfloat16, 64 * 4096, seed=7)[0].view(64, 4096))
    out["scalar-f32"] = (torch.tensor(1.5), torch.tensor(1.25))
    out["decode-2x3000-bf16"] = tuple(t.view(2, 3000) for t in pair(torch.bfloat16, 6000, seed=8))  # type: ignore[assignment]
    return out


CASES = cases()


@pytest.mark.parametrize("how", ["one", "edges", "random", "rows"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_ranges_merge_to_the_whole_pairs_bits(name: str, how: str) -> None:
    a, b = CASES[name]
    whole = measure_blocks(a, b)
    assert bits(merge(in_ranges(a, b, ranges_of(tuple(a.shape), how, seed=len(name))))) == bits(whole)


@pytest.mark.parametrize("name", ["f64-vs-bf16-128x640", "nonfinite-float32-300x77", "plain-float32-20000"])
def test_rounding_floor_in_ranges(name: str) -> None:
    a = CASES[name][0]
    for target in ("bfloat16", "float16"):
        if not a.dtype.itemsize > torch.empty(0, dtype=getattr(torch, target)).element_size():
            continue
        whole = rounding_sums(a, target)
        spans = ranges_of(tuple(a.shape), "random", seed=9)
        flat = a.reshape(-1)
        got = merge([rounding_range(flat[lo:hi].clone(), target, tuple(a.shape), lo) for lo, hi in spans])[1]
        assert bits(got) == bits(whole)


def test_many_rows_in_one_chain() -> None:
    """Enough rows (16 Ki) that an order other than one row after another would show."""
    shape = (64, 1 << 19)
    g = torch.Generator().manual_seed(11)
    a = (torch.randn(shape, generator=g) * torch.logspace(-3, 3, shape[1])).to(torch.bfloat16)
    b = (a.float() * (1 + 0.01 * torch.randn(shape, generator=g))).to(torch.bfloat16)
    whole = measure_blocks(a, b)
    edges = block_edges(shape)
    spans = [(lo, hi) for lo, hi in zip(edges, edges[1:])]
    spans = [(lo, lo + 3 * ROW) for lo, _ in spans[:1]] + [(3 * ROW, edges[1])] + spans[1:]
    parts = in_ranges(a, b, spans)
    assert sum(len(p.rows) for p in parts) == math.prod(shape) // ROW
    assert bits(merge(parts)) == bits(whole)


def test_cuts_are_checked() -> None:
    shape = (300, 77)
    assert is_cut(shape, 0) and is_cut(shape, 300 * 77) and not is_cut(shape, 1) and not is_cut(shape, -1)
    assert all(is_cut(shape, c) for c in cuts_of(shape)) and all(is_cut(shape, e) for e in block_edges(shape))
    edge = block_edges(shape)[1]
    assert not is_cut(shape, edge + 1)
    a, b = CASES["nonfinite-float32-300x77"]
    with pytest.raises(MetricInputError, match="not a range of whole rows"):
        measure_range(a.reshape(-1)[1:100], b.reshape(-1)[1:100], shape, 1)
    with pytest.raises(MetricInputError, match="not measured in ranges"):
        measure_range(torch.arange(10), torch.arange(10), (10,), 0)
    parts = in_ranges(a, b, ranges_of(shape, "edges"))
    with pytest.raises(ValueError, match="do not follow each other"):
        merge(parts[1:])
    with pytest.raises(ValueError, match="end at element"):
        merge(parts[:-1])
