"""Many small pairs measured together (one pass of the CPU engine for several pairs) give the bits of
the same pairs measured one by one: totals, metrics, block sums, the comparison report."""

from __future__ import annotations

import math
import struct
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest
import torch

from tests.validator.numerics.test_backends import CASES, DTYPES, edges, pair, with_nonfinite
from validator.judging.compare import (
    PairToMeasure,
    _measure,
    _measure_all,
    compare_runs,
    measure_tensors,
    measure_tensors_many,
)
from validator.numerics.backends import Totals, batchable, cpu, small, totals_of, totals_of_many
from validator.numerics.backends.cpu import cpu_totals, cpu_totals_many
from validator.numerics.backends.small import NUMPY_MAX, small_totals
from validator.numerics.floors import block_edges, measure_blocks, measure_blocks_many
from validator.numerics.metrics import MetricInputError

if TYPE_CHECKING:
    from probes import BundleWriter


def bits(x: object) -> object:
    """``x`` with every float replaced by its bit pattern (so -0.0, NaN and every digit count)."""
    if isinstance(x, float):
        return struct.pack("<d", x)
    if isinstance(x, np.ndarray):
        return (x.dtype.str, x.shape, x.tobytes())
    if isinstance(x, (tuple, list)):
        return type(x)(bits(v) for v in x)
    if isinstance(x, dict):
        return {k: bits(v) for k, v in x.items()}
    if hasattr(x, "__dataclass_fields__"):
        return (type(x).__name__, {k: bits(getattr(x, k)) for k in x.__dataclass_fields__})
    return x


def mixed_pairs() -> list[tuple[torch.Tensor, torch.Tensor, list[int]]]:
    """Every case of test_backends (all dtypes, NaN/Inf, zero norms, empty, scalar, mixed dtypes, views),
    and small 2-D pairs of every dtype with the row blocks of a comparison, interleaved."""
    out = [(a, b, edges(a.numel())) for a, b, _, _ in CASES.values()]
    for i, dt in enumerate(DTYPES):
        for shape in ((16, 1024), (70, 33), (3, 5), (1, 7)):
            a, b = pair(dt, math.prod(shape), seed=40 + i, noise=0.02)
            if shape == (70, 33):
                a, b = with_nonfinite(a, b)
            out.insert(2 * i, (a.view(shape), b.view(shape), block_edges(shape)))
    z = torch.zeros(16, 64, dtype=torch.bfloat16)
    out += [(z, z, block_edges((16, 64))), (z, pair(torch.bfloat16, 1024)[0].view(16, 64), block_edges((16, 64)))]
    return out


@pytest.mark.parametrize("tols", [(1e-5, 1e-3), (1e-3, 1e-2), (0.0, 0.0), (1e-5, 2.0**21)])
def test_totals_of_many_equals_totals_of_bitwise(tols: tuple[float, float]) -> None:
    atol, rtol = tols
    pairs = mixed_pairs()
    one = [totals_of(a, b, atol=atol, rtol=rtol, chunk_elems=1000, edges=e) for a, b, e in pairs]
    assert bits(totals_of_many(pairs, atol=atol, rtol=rtol, chunk_elems=1000)) == bits(one)


def test_compare_cpu_many_equals_compare_cpu_bitwise_on_every_thread_count() -> None:
    for dt in DTYPES:
        pairs = [(a, b, e) for a, b, e in mixed_pairs() if a.dtype == b.dtype == dt and batchable(a, b)]
        assert len(pairs) >= 5, dt
        one = [cpu_totals(a, b, atol=1e-5, rtol=1e-3, edges=e) for a, b, e in pairs]
        for threads in (1, 2, 5):
            saved = cpu.threads()
            cpu.set_threads(threads)
            try:
                many: list[Totals] = cpu_totals_many(pairs, atol=1e-5, rtol=1e-3)
            finally:
                cpu.set_threads(saved)
            assert bits(many) == bits(one), (dt, threads)


def test_totals_of_many_without_edges_equals_totals_of() -> None:
    # no edges: one block, as totals_of takes them (once a pair of rows with -1 edge blocks, out of bounds)
    pairs = [(a, b, ()) for a, b, _ in mixed_pairs()]
    one = [totals_of(a, b, atol=1e-5, rtol=1e-3, chunk_elems=1 << 22) for a, b, _ in pairs]
    assert bits(totals_of_many(pairs, atol=1e-5, rtol=1e-3, chunk_elems=1 << 22)) == bits(one)


def test_wide_ulp_spreads_in_a_batch() -> None:
    # sign flips: ULP distances across the whole range, exponents far apart (the exact max_abs reads again)
    pairs = []
    for dt in (torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn):
        a, b = pair(dt, 20_000, seed=3, noise=0.05)
        b[:300] = (-a[:300].double()).to(dt)
        pairs += [(a, b, edges(a.numel())), (a[:999], b[:999], [0, 999])]
    assert bits(totals_of_many(pairs, atol=1e-5, rtol=1e-3, chunk_elems=1 << 22)) == bits(
        [totals_of(a, b, atol=1e-5, rtol=1e-3, chunk_elems=1 << 22, edges=e) for a, b, e in pairs]
    )
    for i in range(0, len(pairs), 2):  # numba's kernels, small pairs included (one dtype a call)
        assert bits(cpu_totals_many(pairs[i : i + 2], atol=1e-5, rtol=1e-3)) == bits(
            [cpu_totals(a, b, atol=1e-5, rtol=1e-3, edges=e) for a, b, e in pairs[i : i + 2]]
        )


def test_measure_blocks_many_equals_measure_blocks() -> None:
    pairs = [(a, b) for a, b, _ in mixed_pairs() if a.shape == b.shape]
    pairs.append((torch.arange(10), torch.arange(10) + 1))  # integers: the reference backend
    pairs.append((torch.zeros(3, dtype=torch.complex64), torch.zeros(3, dtype=torch.complex64)))  # rejected
    got = measure_blocks_many(pairs)
    for (a, b), r in zip(pairs, got):
        if isinstance(r, MetricInputError):
            with pytest.raises(MetricInputError, match=str(r)):
                measure_blocks(a, b)
        else:
            assert bits(r) == bits(measure_blocks(a, b))
    assert isinstance(got[-1], MetricInputError)


def test_measure_tensors_many_equals_measure_tensors() -> None:
    a, b = pair(torch.float64, 4096, seed=50)
    args: list[tuple[torch.Tensor, torch.Tensor, str | None]] = [
        (a.view(64, 64), b.view(64, 64), "bfloat16"),  # with the rounding floor
        (a.view(64, 64), b.view(64, 64).float(), None),
        (a.view(64, 64), b.view(32, 128), None),  # shape mismatch
        (torch.arange(6), torch.arange(6), None),
        (torch.zeros(3, dtype=torch.complex64), torch.zeros(3, dtype=torch.complex64), None),
        *[(x, y, None) for x, y, _ in mixed_pairs() if x.shape == y.shape],
    ]
    got = measure_tensors_many(args)
    assert bits([vars(m) for m in got]) == bits([vars(measure_tensors(x, y, rounding_dtype=r)) for x, y, r in args])
    assert got[2].error and got[4].error and got[0].rounding is not None


def add_noisy_tensors(w: BundleWriter, dtypes: list[torch.dtype], count: int, noise: torch.Generator, odd: tuple[int, float]) -> None:
    """``count`` tensors of four shapes (one empty) in ``dtypes`` by turns into bundle writer ``w``, the same
    values in every run but for 1% noise drawn from the run's ``noise``; tensor ``odd[0]`` holds ``odd[1]`` first."""
    for i in range(count):
        shape = [(16, 64), (3, 5), (80, 8), (0, 4)][i % 4]
        x = torch.randn(shape, generator=torch.Generator().manual_seed(i))
        x = x * (1 + 1e-2 * torch.randn(shape, generator=noise))
        if i == odd[0]:
            x[0, 0] = odd[1]
        w.add(f"t{i:02d}", x.to(dtypes[i % 4]), step=i % 3)


def test_compare_runs_batched_equals_pair_by_pair(tmp_path: Path) -> None:
    from probes import BundleWriter
    from validator.runs.reassembly import group_logical
    from validator.runs.sources import open_path

    dtypes = [torch.bfloat16, torch.float16, torch.float32, torch.float8_e5m2]
    for name, seed in (("a", 1), ("b", 2)):
        with BundleWriter(tmp_path / name, run_name=name) as w:
            add_noisy_tensors(w, dtypes, 60, torch.Generator().manual_seed(seed), odd=(6, math.nan))
    va, vb = open_path(tmp_path / "a"), open_path(tmp_path / "b")
    ga, gb = group_logical(va.tensors), group_logical(vb.tensors)
    pairs = [PairToMeasure(ga[k], gb[k], rounding_floor=i % 2 == 0) for i, k in enumerate(sorted(ga, key=lambda k: (k[0], repr(k[1]))))]
    batched = list(_measure_all(pairs))  # the pairs of a batch in one pass of the engine
    assert bits([vars(m) for m in batched]) == bits([vars(_measure(*p)) for p in pairs])
    by_pair = compare_runs(va, vb, executor=lambda fn, ps: (fn(*p) for p in ps)).to_dict()  # one by one, as Ray does
    assert bits(compare_runs(va, vb).to_dict()) == bits(by_pair)


def test_pairs_side_by_side_in_one_buffer_are_measured_where_they_lie() -> None:
    """Tensors that lie end to end in one buffer (a batch of stored tensors: ``materialize_many``) are measured
    without being copied together, with the bits of separate tensors."""
    from validator.numerics.backends.cpu import _end_to_end

    shapes = [(16, 64), (3, 5), (80, 8), (1, 7), (16, 64)]
    sizes = [math.prod(s) for s in shapes]
    flat_a, flat_b = pair(torch.bfloat16, sum(sizes), seed=7, noise=0.02)
    cuts = np.cumsum([0] + sizes).tolist()
    views = [(flat_a[lo:hi].view(s), flat_b[lo:hi].view(s), block_edges(s)) for lo, hi, s in zip(cuts, cuts[1:], shapes)]
    copies = [(a.clone(), b.clone(), e) for a, b, e in views]
    assert _end_to_end([a for a, _, _ in views]).data_ptr() == flat_a.data_ptr()
    assert torch.equal(_end_to_end([a for a, _, _ in views]), flat_a)
    apart = [a for a, _, _ in views[::2]]  # gaps between them: a copy
    assert torch.equal(_end_to_end(apart), torch.cat([a.reshape(-1) for a in apart]))
    one = [cpu_totals(a, b, atol=1e-5, rtol=1e-3, edges=e) for a, b, e in copies]
    assert bits(cpu_totals_many(views, atol=1e-5, rtol=1e-3)) == bits(one)
    assert bits(cpu_totals_many(copies, atol=1e-5, rtol=1e-3)) == bits(one)


def test_stored_runs_batched_equals_pair_by_pair(tmp_path: Path) -> None:
    """Stored runs: a batch's tensors (``materialize_many``: the small ones as NumPy, the others read side by side
    into one buffer per dtype) give the tensors and the report of the pairs loaded and measured one by one."""
    from probes import BundleWriter, ShardSpec
    from validator.numerics.backends import as_torch
    from validator.numerics.host import HostArray
    from validator.runs.reassembly import group_logical, materialize_many
    from validator.service import Service
    from validator.settings import Settings

    dtypes = [torch.bfloat16, torch.float16, torch.float32, torch.bfloat16]
    svc = Service(Settings(home=tmp_path / "home"))
    try:
        for name, seed in (("a", 1), ("b", 2)):
            with BundleWriter(tmp_path / name, run_name=name, part="rank0") as w:
                add_noisy_tensors(w, dtypes, 40, torch.Generator().manual_seed(seed), odd=(5, math.inf))
                full = torch.randn(8, 6, generator=torch.Generator().manual_seed(99)).to(torch.bfloat16)
                for rank, piece in enumerate(full.chunk(2, dim=1)):  # a logical tensor of two shards
                    w.add("split", piece.contiguous(), shard=ShardSpec.split(1, rank, 2))
                for i in range(2):  # above the NumPy pass's size: read into one buffer
                    big = torch.randn(130, 64, generator=torch.Generator().manual_seed(i))
                    w.add(f"big{i}", (big * (1 + 1e-2 * seed * big)).to(torch.bfloat16))
            svc.ingest(tmp_path / name, name=name)
        va, vb = svc.resolve("a", allow_paths=False), svc.resolve("b", allow_paths=False)
        logical = list(group_logical(va.tensors).values())
        together = materialize_many(logical)
        assert {isinstance(t, HostArray) for t in together} == {True, False}
        loaded = [as_torch(t) for t in together]
        assert all(torch.equal(t, lt.materialize()) and t.dtype == lt.materialize().dtype for t, lt in zip(loaded, logical))
        bf16 = [t for t, lt in zip(together, logical) if not isinstance(t, HostArray) and t.dtype == torch.bfloat16 and len(lt.shards) == 1]
        assert len(bf16) == 2 and len({t.untyped_storage().data_ptr() for t in bf16}) == 1  # one buffer for the large bfloat16 tensors
        by_pair = compare_runs(va, vb, executor=lambda fn, ps: (fn(*p) for p in ps)).to_dict()  # loaded one by one
        assert bits(svc.compare("a", "b", allow_paths=False).to_dict()) == bits(by_pair)
    finally:
        svc.close()


def test_small_pairs_take_the_numpy_pass_alone_and_together() -> None:
    """Pairs of at most small.NUMPY_MAX elements: totals_of and totals_of_many give small_totals's bits, the
    pairs read one by one or end to end in groups (every dtype, NaN/Inf, empty, mixed dtypes, views)."""
    pairs = [p for p in mixed_pairs() if p[0].numel() <= NUMPY_MAX]
    rows = NUMPY_MAX // 1024  # pairs of NUMPY_MAX elements: the largest the NumPy pass takes
    for seed in range(12):
        a, b = pair(torch.bfloat16, NUMPY_MAX, seed=seed)
        pairs.append((a.view(rows, 1024), b.view(rows, 1024), block_edges((rows, 1024))))
    assert len(pairs) > 20 and sum(a.numel() for a, _, _ in pairs) > small.GROUP  # read in several groups
    one = [small_totals(a, b, atol=1e-5, rtol=1e-3, edges=e) for a, b, e in pairs]
    assert bits([totals_of(a, b, atol=1e-5, rtol=1e-3, chunk_elems=1000, edges=e) for a, b, e in pairs]) == bits(one)
    assert bits(totals_of_many(pairs, atol=1e-5, rtol=1e-3, chunk_elems=1000)) == bits(one)
    assert bits(small.small_totals_many(pairs, atol=1e-5, rtol=1e-3)) == bits(one)


def test_chain_adds_rows_in_order_from_zero() -> None:
    """small.chain (every pass adds its rows with it) is a sequential float64 sum from 0.0, bit for bit, in both of
    its strategies, -0.0 rows and cancelling rows included; small.block_sums is that chain over each block."""
    rng = np.random.default_rng(3)
    rows = rng.standard_normal((300, 5)) * 10.0 ** rng.integers(-8, 8, (300, 1))
    rows[:7] = -0.0
    rows[20:24, 4] = [1e30, 1.0, -1e30, -1.0]

    def in_order(part: np.ndarray) -> list[float]:
        out = [0.0] * part.shape[1]
        for row in part.tolist():
            out = [x + y for x, y in zip(out, row)]
        return out

    for first in (np.array([0, 7, 7, 150, 300]), np.arange(301), np.array([0, 300])):  # few long pairs, many short
        want = [in_order(rows[lo:hi]) for lo, hi in zip(first, first[1:])]
        assert bits(small.chain(rows, first)) == bits(np.array(want))
    owner = np.sort(rng.integers(0, 9, 300))
    want = np.zeros((2, 10))
    for j in range(10):
        mine = rows[owner == j]
        if len(mine):
            want[:, j] = in_order(mine[:, [2, 0]])
    assert bits(small.block_sums(rows, owner, 10)) == bits(want)


def test_small_comparison_imports_no_numba(tmp_path: Path) -> None:
    """Measuring and judging small pairs (the floors, the bootstrap) waits for no compiler: numba is not imported."""
    code = (
        "import sys, torch\n"
        "from validator.judging.compare import measure_tensors\n"
        "from validator.numerics.floors import bootstrap_interval\n"
        "a = torch.randn(64, 64, dtype=torch.float32)\n"
        "m = measure_tensors(a.bfloat16(), (a * 1.01).bfloat16(), rounding_dtype='bfloat16')\n"
        "bootstrap_interval(m.blocks, m.rounding)\n"
        "bootstrap_interval(m.blocks)\n"
        "assert 'numba' not in sys.modules, sorted(k for k in sys.modules if 'numba' in k)[:5]\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=tmp_path, timeout=120)
