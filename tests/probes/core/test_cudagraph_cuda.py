"""CUDA-only: asynchronous capture on a side stream, and capture points inside CUDA graphs.

Skipped without a CUDA device; run on the GPU machine with
``python -m pytest --noconftest tests/probes/core/test_cudagraph_cuda.py``.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from probes.core.capture import ProbeSession, ProbeWarning
from probes.core.config import ProbeConfig
from probes.core.cudagraph import GraphCaptureError
from probes.core.summary import SUMMARY_FIELDS, summarize
from tests.probes.core.test_capture import np_summary, np_values, raw, read_part
from tests.probes.core.test_fused_summary import same_bits

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="needs a CUDA device (side-stream copies, CUDA graphs); run it on the GPU machine",
)

DEV = "cuda"


def session(tmp_path: Path, **kw: Any) -> ProbeSession:
    return ProbeSession(ProbeConfig(bundle=str(tmp_path / "b"), **kw))


def assert_device_summary(got: torch.Tensor, t: torch.Tensor) -> None:
    """float32 accumulation on the device: norm/mean to 1e-5 relative; the rest exact."""
    ref = np_summary(t.cpu())
    g = got.tolist()
    for i, field in enumerate(SUMMARY_FIELDS):
        if math.isnan(ref[i]):
            assert math.isnan(g[i]), field
        elif field == "mean":
            scale = float(np.mean(np.abs(np_values(t.cpu()))))
            assert abs(g[i] - ref[i]) <= 1e-5 * scale, (field, g[i], ref[i])
        elif field == "norm":
            assert g[i] == pytest.approx(ref[i], rel=1e-5), (field, g[i], ref[i])
        else:
            assert g[i] == ref[i], (field, g[i], ref[i])


@pytest.mark.parametrize("mode", ["full", "summary"])
def test_async_capture_bf16_views(tmp_path: Path, mode: str) -> None:
    g = torch.Generator(device=DEV).manual_seed(0)
    base = torch.randn(300, 1000, device=DEV, generator=g).to(torch.bfloat16)
    views = {"c": base, "t": base.t(), "s": base[1::3, ::2]}
    before = {k: (raw(v.cpu()), v._version) for k, v in views.items()}
    s = session(tmp_path, mode=mode)
    for k, v in views.items():
        s.capture(k, v, step=0)
    s.close()
    _, items = read_part(tmp_path / "b")
    stored = {r["name"].removesuffix(".summary"): t for r, t in items}
    for k, v in views.items():
        assert (raw(v.cpu()), v._version) == before[k]  # never modified
        if mode == "full":
            assert raw(stored[k]) == raw(v.cpu())
        else:
            assert_device_summary(stored[k], v)


def test_summary_non_finite_on_device() -> None:
    t = torch.randn(5000, device=DEV).to(torch.bfloat16)
    t[7] = float("nan")
    t[9] = float("inf")
    got = summarize(t)
    assert math.isnan(got[0].item()) and math.isnan(got[1].item()) and got[3].item() == 2
    assert got[4].item() == np_summary(t.cpu())[4]
    u = torch.randn(5000, device=DEV)
    u[3] = -float("inf")
    got = summarize(u).tolist()
    assert got[0] == math.inf and got[1] == math.inf and got[3] == 1


def _busy(a: torch.Tensor, n: int) -> torch.Tensor:
    y = a
    for _ in range(n):
        y = y @ a
    return y


def test_capture_does_not_synchronise_the_serving_stream(tmp_path: Path) -> None:
    a = torch.randn(8192, 8192, device=DEV).div_(90.5).to(torch.bfloat16)
    s = session(tmp_path)
    s.capture("warm", a[:1024], step=-1)  # pinned buffer of this size now in the host cache
    s.flush()
    torch.cuda.synchronize()
    y = _busy(a, 60)  # ~80 ms of queued matrix products
    t0 = time.perf_counter()
    s.capture("y", y[:1024], step=0)
    dt = time.perf_counter() - t0
    still_busy = not torch.cuda.current_stream().query()
    expected = y[:1024].cpu()
    s.close()
    assert still_busy, "capture() waited for the serving stream"
    assert dt < 0.02, f"capture() took {dt * 1e3:.1f} ms on the host"
    _, items = read_part(tmp_path / "b")
    assert raw(items[1][1]) == raw(expected)


def test_snapshot_is_safe_against_later_in_place_updates(tmp_path: Path) -> None:
    a = torch.randn(4096, 4096, device=DEV).div_(64).to(torch.bfloat16)
    s = session(tmp_path, snapshot=True)
    y = _busy(a, 20)
    ref = y.clone()
    s.capture("y", y, step=0)
    y.add_(1.0)  # the serving code reuses the buffer in place right away
    s.close()
    _, [(_, stored)] = read_part(tmp_path / "b")
    assert raw(stored) == raw(ref.cpu())


def _graph(step_fn: Callable[[], Any]) -> tuple[torch.cuda.CUDAGraph, Any]:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step_fn(False)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = step_fn(True)
    return g, out


class Step:
    def __init__(self, s: ProbeSession) -> None:
        self.s = s
        self.x = torch.randn(32, 256, device=DEV).to(torch.bfloat16)
        self.w = torch.randn(512, 256, device=DEV).div_(16).to(torch.bfloat16)

    def __call__(self, probe: bool) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.x @ self.w.t()
        n = torch.nn.functional.rms_norm(h, (512,))
        if probe:
            self.s.capture("h", h, layer=1)
            self.s.capture("n", n[:, ::2], layer=1)
        return h, n

    def new_input(self) -> None:
        self.x.copy_(torch.randn(32, 256, device=DEV).to(torch.bfloat16))


def test_graph_capture_without_slots_is_refused(tmp_path: Path) -> None:
    s = session(tmp_path)
    step = Step(s)
    with pytest.raises(GraphCaptureError, match="CUDA graph capture"):
        _graph(step)
    s.close()


def test_graph_slots_need_prepare(tmp_path: Path) -> None:
    s = session(tmp_path, graph_slots=True)
    with pytest.raises(GraphCaptureError, match="prepare_graphs"):
        _graph(Step(s))
    s.close()


@pytest.mark.parametrize("mode", ["full", "summary"])
def test_graph_slots_record_every_replay(tmp_path: Path, mode: str) -> None:
    s = session(tmp_path, graph_slots=True, mode=mode)
    s.prepare_graphs(DEV)
    step = Step(s)
    with s.graph_scope("bs32"):
        g, (h, n) = _graph(step)
    refs = []
    for i in range(4):
        step.new_input()
        g.replay()
        s.after_replay(step=i, graph="bs32")
        refs.append((h.clone(), n[:, ::2].clone()))
    s.after_replay(step=99)  # the default graph has no slots: nothing to do
    s.close()
    meta, items = read_part(tmp_path / "b")
    assert meta["extra"]["probe"]["graph_slots"] == 2
    suffix = ".summary" if mode == "summary" else ""
    got = {(r["name"], r["coords"]["step"]): (r["coords"], t) for r, t in items}
    assert len(got) == 8
    for i, (h_ref, n_ref) in enumerate(refs):
        for name, ref in (("h", h_ref), ("n", n_ref)):
            coords, t = got[(name + suffix, i)]
            assert coords == {"layer": 1, "step": i}
            if mode == "full":
                assert raw(t) == raw(ref.cpu())
            else:
                assert_device_summary(t, ref)
    p = meta["extra"]["probe"]
    assert p["graph_missed_replays"] == p["graph_stale_reads"] == p["graph_unread_replays"] == 0


def test_missed_stale_and_unread_replays_are_reported(tmp_path: Path) -> None:
    s = session(tmp_path, graph_slots=True, mode="summary", names=("h",))
    s.prepare_graphs(DEV)
    g, _ = _graph(Step(s))
    with warnings.catch_warnings(record=True) as rec:  # reported when the counters reach the host
        warnings.simplefilter("always")
        g.replay()
        s.after_replay(step=0)  # fine
        g.replay()
        g.replay()
        s.after_replay(step=1)  # one replay was never read
        s.after_replay(step=2)  # no replay since the last read: stale
        g.replay()  # never read out before close
        s.close()
    assert rec and all(w.category is ProbeWarning for w in rec)
    text = " | ".join(str(w.message) for w in rec)
    assert "never read out (after_replay" in text and "stale" in text and "after the last after_replay" in text
    meta, items = read_part(tmp_path / "b")
    assert sorted(r["coords"]["step"] for r, _ in items) == [0, 1]
    p = meta["extra"]["probe"]
    assert (p["graph_missed_replays"], p["graph_stale_reads"], p["graph_unread_replays"]) == (1, 1, 1)
    assert p["filtered"] == 1 and p["captured"] == 2  # "n" is filtered out when the graph is captured


def _cuda_activity(fn: Callable[[], Any]) -> list[str]:
    """Names of the device activities (kernels, copies) ``fn`` queues, in order."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the profiler's notes about its own event buffers
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


def _kernels(names: list[str]) -> list[str]:
    return [n for n in names if not n.startswith("Memcpy") and not n.startswith("Memset")]


@pytest.mark.parametrize("mode", ["summary", "full"])
def test_eager_cost_per_point_and_one_copy_per_step(tmp_path: Path, mode: str) -> None:
    xs = [torch.randn(16, 4096, device=DEV).to(torch.bfloat16) for _ in range(4)]
    s = session(tmp_path, mode=mode, drain="inline")
    s.capture("warm", xs[0], step=-1)  # compile the kernels, fill the pinned pool
    s.end_step()
    s.flush()

    def step() -> None:
        for i, x in enumerate(xs):
            s.capture(f"p{i}", x, step=0)

    names = _cuda_activity(step)
    kernels = _kernels(names)
    if mode == "summary":
        assert len(kernels) <= 2 * len(xs), names  # the fused pass and its finishing program
    else:
        assert len([n for n in names if "DtoD" in n or "copy" in n.lower()]) == len(xs), names
        assert len(kernels) <= len(xs), names
    assert not any("DtoH" in n for n in names), names  # nothing leaves before the step ends
    out = _cuda_activity(s.end_step)
    assert len([n for n in out if "DtoH" in n]) == (1 if mode == "summary" else len(xs)), out
    assert not _kernels(out), out
    s.close()
    _, items = read_part(tmp_path / "b")
    stored = {r["name"].removesuffix(".summary"): t for r, t in items}
    for i, x in enumerate(xs):
        if mode == "full":
            assert raw(stored[f"p{i}"]) == raw(x.cpu())
        else:
            assert_device_summary(stored[f"p{i}"], x)


@pytest.mark.parametrize("mode", ["summary", "full"])
def test_steps_batch_and_reuse_pinned_buffers(tmp_path: Path, mode: str) -> None:
    s = session(tmp_path, mode=mode)
    refs = []
    for step in range(12):
        a = torch.randn(8, 300, device=DEV).to(torch.bfloat16)
        s.capture("a", a, step=step)
        s.capture("b", a[:, ::3], step=step, layer=2)
        refs.append(a.clone())
        a.add_(1.0)  # in place right after the capture: the snapshot / summary saw the old values
    s.close()
    assert s._transfer is not None and s._transfer.pool.allocated <= 12  # reused, not one per capture
    _, items = read_part(tmp_path / "b")
    got = {(r["name"], r["coords"]["step"]): t for r, t in items}
    assert len(got) == 24
    for step, a in enumerate(refs):
        for name, ref in (("a", a), ("b", a[:, ::3])):
            t = got[(name + (".summary" if mode == "summary" else ""), step)]
            if mode == "full":
                assert raw(t) == raw(ref.cpu())
            else:
                assert_device_summary(t, ref)


@pytest.mark.parametrize("mode", ["full", "summary"])
def test_graph_sampling_reads_only_sampled_steps_without_warnings(tmp_path: Path, mode: str) -> None:
    s = session(tmp_path, graph_slots=True, mode=mode, step_every=3)
    s.prepare_graphs(DEV)
    step = Step(s)
    g, (h, _) = _graph(step)
    refs = {}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no missed / stale / unread reports
        for i in range(8):
            step.new_input()
            g.replay()
            s.after_replay(step=i)
            if i % 3 == 0:
                refs[i] = h.clone()
        g.replay()
        s.after_replay(step=8)  # sampled out, then closed: not "unread"
        s.close()
    meta, items = read_part(tmp_path / "b")
    got = {(r["name"].removesuffix(".summary"), r["coords"]["step"]): t for r, t in items}
    assert sorted(st for n, st in got if n == "h") == [0, 3, 6]
    for i, ref in refs.items():
        if mode == "full":
            assert raw(got[("h", i)]) == raw(ref.cpu())
        else:
            assert_device_summary(got[("h", i)], ref)
    p = meta["extra"]["probe"]
    assert p["sampled_out"] == 2 * 6 and p["graph_missed_replays"] == p["graph_unread_replays"] == 0


def test_graph_after_replay_is_one_gather_kernel(tmp_path: Path) -> None:
    s = session(tmp_path, graph_slots=True, mode="full")
    s.prepare_graphs(DEV)
    step = Step(s)
    g, _ = _graph(step)
    g.replay()
    s.after_replay(step=0)
    s.flush()
    g.replay()
    names = _cuda_activity(lambda: s.after_replay(step=1))
    assert len(_kernels(names)) == 1 and len([n for n in names if "DtoH" in n]) == 1, names
    s.close()


def _step_tensors(step: int) -> dict[str, torch.Tensor]:
    g = torch.Generator(device=DEV).manual_seed(step)
    base = torch.randn(16, 2048, device=DEV, generator=g)
    return {
        "hidden": base.to(torch.bfloat16),
        "attn": (base * 3).to(torch.float16),
        "logits": torch.randn(4, 32000, device=DEV, generator=g) * 20,
        "kv": (base / 4).to(torch.float8_e4m3fn),
        "view": base.to(torch.bfloat16)[1::3, ::2],
        "empty": torch.empty(0, 8, device=DEV, dtype=torch.bfloat16),
    }


def test_deferred_summaries_are_the_one_by_one_bits(tmp_path: Path) -> None:
    s = session(tmp_path, mode="summary", drain="inline", defer_summaries=True)
    kept: list[dict[str, torch.Tensor]] = []
    for step in range(4):
        ts = _step_tensors(step)
        kept.append(ts)
        if step == 3:  # deferred: no kernel while the step runs, a few at its end for all six points
            during = _cuda_activity(lambda ts=ts, step=step: [s.capture(k, v, step=step) for k, v in ts.items()])
            assert not _kernels(during), during
            end = _cuda_activity(s.end_step)
            assert len(_kernels(end)) <= 6, end  # a pass per dtype (4), one finishing kernel, the view's copy
        else:
            for k, v in ts.items():
                s.capture(k, v, step=step)
            s.end_step()
    assert s._transfer is not None and s._transfer.steady_names == set(kept[0])
    s.close()
    meta, items = read_part(tmp_path / "b")
    assert meta["extra"]["probe"]["summaries_modified_in_place"] == 0
    got = {(r["name"].removesuffix(".summary"), r["coords"]["step"]): t for r, t in items}
    assert len(got) == 4 * 6
    for step, ts in enumerate(kept):
        for k, v in ts.items():
            assert same_bits(got[(k, step)], summarize(v).cpu()), (k, step)
            if v.numel():
                assert_device_summary(got[(k, step)], v)


def test_tensors_written_in_place_are_summarised_at_once(tmp_path: Path) -> None:
    s = session(tmp_path, mode="summary", drain="inline", defer_summaries=True)
    refs = []
    with pytest.warns(ProbeWarning, match="written in place"):
        for step in range(4):
            a = torch.randn(8, 512, device=DEV).to(torch.bfloat16)
            b = torch.randn(8, 512, device=DEV).to(torch.bfloat16)
            s.capture("a", a, step=step)
            s.capture("b", b, step=step)
            refs.append((a.clone(), b.clone()))
            a.add_(1.0)  # "a" is always updated in place after its capture point: never deferred
            if step == 2:
                b.mul_(2.0)  # "b" once, after it was found steady: that summary is lost, and counted
    s.close()
    meta, items = read_part(tmp_path / "b")
    assert meta["extra"]["probe"]["summaries_modified_in_place"] == 1
    assert meta["extra"]["probe"]["captured"] == 7  # the lost summary is not counted as captured
    assert meta["extra"]["probe"]["summaries_at_once_names"] == ["a", "b"]
    got = {(r["name"].removesuffix(".summary"), r["coords"]["step"]): t for r, t in items}
    assert sorted(got) == sorted({(n, st) for st in range(4) for n in "ab"} - {("b", 2)})
    for step, (a, b) in enumerate(refs):
        assert_device_summary(got[("a", step)], a)
        if step != 2:
            assert_device_summary(got[("b", step)], b)


def test_inference_tensors_are_summarised_at_once(tmp_path: Path) -> None:
    s = session(tmp_path, mode="summary", drain="inline", defer_summaries=True)
    refs = []
    with torch.inference_mode():
        for step in range(3):
            a = torch.randn(8, 512, device=DEV).to(torch.bfloat16)
            s.capture("a", a, step=step)
            refs.append(a.clone())
            a.add_(1.0)
    assert s._transfer is not None and not s._transfer.steady_names
    s.close()
    _, items = read_part(tmp_path / "b")
    for (_, t), a in zip(items, refs, strict=True):
        assert_device_summary(t, a)


def test_deferred_summaries_do_not_synchronise(tmp_path: Path) -> None:
    s = session(tmp_path, mode="summary", defer_summaries=True)
    for step in range(2):  # watched, then steady
        for k, v in _step_tensors(step).items():
            s.capture(k, v, step=step)
    s.end_step()
    s.flush()
    inputs = [_step_tensors(step) for step in range(2, 5)]
    torch.cuda.synchronize()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "a prototype feature"
            torch.cuda.set_sync_debug_mode("error")
        for step, ts in enumerate(inputs, start=2):
            for k, v in ts.items():
                s.capture(k, v, step=step)
            s.end_step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    s.close()
    _, items = read_part(tmp_path / "b")
    assert len(items) == 5 * 6
