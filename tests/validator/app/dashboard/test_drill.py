from __future__ import annotations

import math

import pytest
import torch

from validator.app.dashboard.drill import HIST_EDGES, error_profile
from validator.numerics.metrics import compare_tensors


def _pair(dtype: torch.dtype, shape: tuple[int, ...] = (40, 6, 5), seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(shape, generator=g, dtype=torch.float64)
    b = a + 1e-2 * torch.randn(shape, generator=g, dtype=torch.float64)
    return a.to(dtype), b.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
def test_matches_direct_fp64_computation(dtype: torch.dtype) -> None:
    a, b = _pair(dtype)
    prof = error_profile(a, b, top_k=7, chunk_elems=64)  # many chunks
    x, y = a.double(), b.double()
    d = y - x
    assert prof.rel_l2 == pytest.approx(float(d.norm() / x.norm()), rel=1e-12)
    assert prof.rel_l2 == pytest.approx(compare_tensors(a, b).rel_l2, rel=1e-6)  # the engine's stated accuracy
    assert prof.max_abs == float(d.abs().max())
    rows = (d.pow(2).sum((1, 2)).sqrt() / x.pow(2).sum((1, 2)).sqrt()).tolist()
    assert prof.tokens is not None and prof.tokens.rel_l2 == pytest.approx(rows, rel=1e-12)
    heads = (d.pow(2).sum((0, 2)).sqrt() / x.pow(2).sum((0, 2)).sqrt()).tolist()
    assert prof.heads is not None and prof.heads.rel_l2 == pytest.approx(heads, rel=1e-12)
    top = torch.topk(d.abs().flatten(), 7).values.tolist()
    assert [w.abs_err for w in prof.worst] == top
    for w in prof.worst:
        assert abs(float(y[w.index]) - float(x[w.index])) == w.abs_err and w.a == float(x[w.index])
    assert sum(prof.hist_counts) + prof.equal == prof.compared == a.numel()
    assert len(prof.hist_counts) == len(HIST_EDGES) - 1


def test_chunking_does_not_change_the_result() -> None:
    a, b = _pair(torch.float32, (33, 4, 8))
    whole, pieces = error_profile(a, b), error_profile(a, b, chunk_elems=1)
    assert whole.hist_counts == pieces.hist_counts
    assert whole.worst == pieces.worst and whole.equal == pieces.equal
    assert whole.tokens is not None and pieces.tokens is not None
    assert whole.tokens.rel_l2 == pytest.approx(pieces.tokens.rel_l2, rel=1e-12)


def test_non_finite_positions_are_left_out_and_counted() -> None:
    a = torch.zeros(4, 3)
    b = torch.zeros(4, 3)
    a[0, 0], b[1, 1], b[2, 2] = math.nan, math.inf, 0.5
    prof = error_profile(a, b)
    assert prof.nonfinite == 2 and prof.compared == 10 and prof.equal == 9
    assert [(w.index, w.abs_err, w.rel_err) for w in prof.worst] == [((2, 2), 0.5, None)]
    assert prof.tokens is not None and prof.tokens.rel_l2[2] == math.inf and prof.tokens.rel_l2[0] == 0.0
    assert prof.heads is None  # 2-d: tokens only
    assert not prof


def test_long_axes_are_bucketed() -> None:
    a, b = _pair(torch.float32, (1000, 16))
    prof = error_profile(a, b, max_points=64)
    assert prof.tokens is not None
    t = prof.tokens
    assert t.bucket == 16 and len(t.rel_l2) == 63 and t.start[:3] == (0, 16, 32) and t.length == 1000
    d = (b.double() - a.double())[:16]
    assert t.abs_l2[0] == pytest.approx(float(d.norm()), rel=1e-12)


@pytest.mark.parametrize("shape", [(), (17,), (0, 4)])
def test_small_shapes(shape: tuple[int, ...]) -> None:
    a, b = torch.ones(shape), torch.ones(shape) * 2
    prof = error_profile(a, b)
    assert prof.shape == shape and prof.compared == a.numel()
    assert prof.tokens is None if len(shape) < 2 else prof.tokens is not None
    if a.numel():
        assert prof.rel_l2 == 1.0 and prof.worst[0].abs_err == 1.0


def test_equal_tensors_and_bad_input() -> None:
    a = torch.randn(5, 2, 3)
    prof = error_profile(a, a.clone())
    assert prof and prof.rel_l2 == 0 and prof.worst == () and sum(prof.hist_counts) == 0
    with pytest.raises(ValueError, match="shape mismatch"):
        error_profile(a, a[:4])
