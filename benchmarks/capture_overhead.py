"""Capture overhead on a DFlash-context-like step (needs a CUDA GPU). Prints a table; optional JSON/Markdown.

The step (bf16, hidden 7168, six capture layers, 8 KV heads x 128 for K and V)::

    x  [T, 6*7168]  --fc-->  h [T, 7168]  --RMSNorm-->  n [T, 7168]  --kv_proj-->  kv [T, 2048]

with 4 capture points (x, h, n, kv). Variants, timed in the same process on the same inputs:

- ``none``: no capture calls at all (the reference every ratio is taken against);
- ``disabled``: the 4 ``session.capture`` calls on the disabled session;
- ``summary``: summary mode (5 statistics per point computed on the device, one copy back per step);
- ``full``: full capture (a device snapshot per point, async copies to pinned host memory per step);
- ``read``: no probes, but one read of each captured tensor (``torch.amax``) where the capture points
  are: the reference for "summary within 1.2x of one read of the captured tensors";
- ``none-again``: the reference once more, last, to show the run-to-run spread.

Device work per point is counted with ``torch.profiler`` on one step (all streams): kernels, device-to-
device copies and device-to-host copies, less what the uninstrumented step runs.

Enabled sessions write into a writer that discards what it receives, so the numbers are the capture cost
seen by the serving process (the bundle files are written by a background thread in production).
Each variant: warm-up, then ``reps`` timings of ``iters`` consecutive steps with CUDA events on the
serving stream, median per step. ``drained`` also waits until every copy has reached the host.
With ``--graph``, the decode sizes are also run as CUDA graph replays (graph slots + ``after_replay``).

    python benchmarks/capture_overhead.py --json out.json --md out.md
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from probes.core.capture import DISABLED, ProbeSession
from probes.core.config import ProbeConfig

HIDDEN = 7168
FEATURES = 6 * HIDDEN
KV = 2 * 8 * 128
POINTS = 4


class DiscardWriter:
    """Bundle-writer stand-in: counts what it is given, keeps nothing."""

    def __init__(self) -> None:
        self.count = 0
        self.nbytes = 0

    def add(self, name: str, tensor: torch.Tensor, **_: Any) -> None:
        self.count += 1
        self.nbytes += tensor.numel() * tensor.element_size()

    def flush(self) -> None:
        pass

    def close(self, extra: Any = None) -> None:
        pass


class Model:
    def __init__(self, device: str) -> None:
        g = torch.Generator(device=device).manual_seed(0)
        self.w_fc = (torch.randn(HIDDEN, FEATURES, device=device, generator=g) / FEATURES**0.5).to(torch.bfloat16)
        self.w_kv = (torch.randn(KV, HIDDEN, device=device, generator=g) / HIDDEN**0.5).to(torch.bfloat16)
        self.g = (1 + 0.1 * torch.randn(HIDDEN, device=device, generator=g)).to(torch.bfloat16)

    def plain(self, x: torch.Tensor) -> torch.Tensor:
        h = x @ self.w_fc.t()
        n = torch.nn.functional.rms_norm(h, (HIDDEN,), self.g, 1e-6)
        return n @ self.w_kv.t()

    def probed(self, x: torch.Tensor, s: ProbeSession) -> torch.Tensor:
        s.capture("ctx.features", x)
        h = x @ self.w_fc.t()
        s.capture("ctx.fc_out", h)
        n = torch.nn.functional.rms_norm(h, (HIDDEN,), self.g, 1e-6)
        s.capture("ctx.hidden_norm", n)
        kv = n @ self.w_kv.t()
        s.capture("ctx.kv", kv, layer=0)
        return kv


class ReadOnce:
    """Stands in for a session: reads each captured tensor once (an amax), keeps nothing."""

    enabled = True

    def capture(self, name: str, tensor: torch.Tensor, **_: Any) -> None:
        torch.amax(tensor)

    def set_coords(self, **_: Any) -> None:
        pass

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass

    def after_replay(self, **_: Any) -> None:
        pass


def make_session(mode: str, graph: bool = False) -> Any:
    if mode in ("none", "disabled"):
        return DISABLED
    if mode == "read":
        return ReadOnce()
    # "summary-unread": the graph's kernels run at every replay, after_replay samples every step out
    every = 10**9 if mode.endswith("-unread") else 1
    cfg = ProbeConfig(bundle="unused", mode=mode.removesuffix("-unread"), budget_bytes=None,  # type: ignore[arg-type]
                      graph_slots=graph, step_every=every, defer_summaries=True)
    return ProbeSession(cfg, writer=DiscardWriter())


def count_activity(run: Callable[[int], None], step: int) -> dict[str, int]:
    """Device activities of one step (all streams), by kind."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run(step)
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if str(e.device_type).endswith("CUDA")]
    kernels = [n for n in names if not n.startswith(("Memcpy", "Memset"))]
    return {
        "kernels": len(kernels),
        # device copies: device-to-device memcpy and copy kernels (strided copies, torch.cat)
        "copies": sum(1 for n in names if n.startswith("Memcpy DtoD")) + sum(1 for n in kernels if "copy" in n.lower()),
        "dtoh": sum(1 for n in names if n.startswith("Memcpy DtoH")),
    }


def time_loop(
    run: Callable[[int], None], s: Any, iters: int, reps: int, warm: int, count: bool = False
) -> dict[str, float]:
    step = 0
    for _ in range(warm):
        run(step)
        step += 1
    s.flush()
    torch.cuda.synchronize()
    stream, drained = [], []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        start.record()
        for _ in range(iters):
            run(step)
            step += 1
        end.record()
        end.synchronize()
        s.flush()
        drained.append((time.perf_counter() - t0) * 1e3 / iters)
        stream.append(start.elapsed_time(end) / iters)
    out: dict[str, Any] = {
        "stream_ms": statistics.median(stream),
        "drained_ms": statistics.median(drained),
        "stream_ms_min": min(stream),
        "stream_ms_max": max(stream),
    }
    if count:
        # two steps: the second one's first capture (a new step) submits the first one's copies
        first = count_activity(run, step)
        second = count_activity(run, step + 1)
        out["activity"] = {k: (first[k] + second[k]) / 2 for k in first}
        s.flush()
    return out


def eager_case(model: Model, tokens: int, mode: str, iters: int, reps: int, count: bool) -> dict[str, Any]:
    g = torch.Generator(device="cuda").manual_seed(tokens)
    xs = [torch.randn(tokens, FEATURES, device="cuda", generator=g).to(torch.bfloat16) for _ in range(2)]
    s = make_session(mode)

    def run(i: int) -> None:
        x = xs[i % len(xs)]
        if mode == "none":
            model.plain(x)
        else:
            s.set_coords(step=i)
            model.probed(x, s)

    out = time_loop(run, s, iters, reps, warm=max(3, iters), count=count)
    s.close()
    return out


def graph_case(model: Model, tokens: int, mode: str, iters: int, reps: int, count: bool) -> dict[str, Any]:
    x = torch.randn(tokens, FEATURES, device="cuda").to(torch.bfloat16)
    s = make_session(mode, graph=True)
    if s.enabled:
        s.prepare_graphs("cuda")
    fn = (lambda: model.plain(x)) if mode == "none" else (lambda: model.probed(x, s))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            model.plain(x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()

    def run(i: int) -> None:
        graph.replay()
        s.after_replay(step=i + 1)  # sampled out in "-unread" variants

    out = time_loop(run, s, iters, reps, warm=max(3, iters), count=count)
    s.close()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", default="16,64,8192", help="comma-separated step sizes")
    ap.add_argument("--iters", type=int, default=50, help="steps per timing (decode sizes)")
    ap.add_argument("--prefill-iters", type=int, default=5, help="steps per timing at >= 1024 tokens")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--graph", action=argparse.BooleanOptionalAction, default=True, help="CUDA graph variant")
    ap.add_argument("--count", action=argparse.BooleanOptionalAction, default=True, help="count device work per point")
    ap.add_argument("--tune", action="store_true", help="also time the fused summary's tile settings on its own")
    ap.add_argument("--check", action="store_true", help="compare the device summary with the float64 one first")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--md", type=Path)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("capture_overhead: needs a CUDA device", file=sys.stderr)
        return 2
    env = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
    }
    model = Model("cuda")
    if args.check:
        check()
    isolated = [isolated_case(model, t) for t in (int(t) for t in args.tokens.split(",")) if t >= 1024]
    for r in isolated:
        print(f"isolated {r}", flush=True)
    rows = []
    for tokens in (int(t) for t in args.tokens.split(",")):
        iters = args.prefill_iters if tokens >= 1024 else args.iters
        kinds = [("eager", eager_case)] + ([("graph", graph_case)] if args.graph and tokens < 1024 else [])
        for kind, case in kinds:
            base = None
            for label in ("none", "disabled", "summary", "summary-unread", "full", "read", "none-again"):
                mode = label.removesuffix("-again")
                if kind == "graph" and mode in ("disabled", "read"):
                    continue  # a disabled session adds no kernel: the graph is the uninstrumented one
                if kind == "eager" and mode == "summary-unread":
                    continue
                r = case(model, tokens, mode, iters, args.reps, args.count)
                base = r if label == "none" else base
                assert base is not None
                r.update(
                    tokens=tokens,
                    kind=kind,
                    mode=label,
                    ratio=r["stream_ms"] / base["stream_ms"],
                    drained_ratio=r["drained_ms"] / base["stream_ms"],
                    added_us_per_point=(r["stream_ms"] - base["stream_ms"]) * 1e3 / POINTS,
                )
                if "activity" in r and "activity" in base:
                    r["per_point"] = {k: (v - base["activity"][k]) / POINTS for k, v in r["activity"].items()}
                rows.append(r)
                pp = r.get("per_point", {})
                print(
                    f"{tokens:>6} {kind:<5} {label:<10} step {r['stream_ms']:8.3f} ms  x{r['ratio']:6.3f}  "
                    f"drained {r['drained_ms']:8.3f} ms (x{r['drained_ratio']:6.3f})  "
                    f"+{r['added_us_per_point']:8.1f} us/point  {pp}",
                    flush=True,
                )
    result = {"env": env, "points_per_step": POINTS, "rows": rows, "isolated": isolated,
              "targets": targets(rows, isolated)}
    if args.tune:
        result["tune"] = tune()
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    table = render(result)
    print(table)
    if args.md:
        args.md.write_text(table)
    return 0


def _time_us(fn: Callable[[], Any], iters: int = 20) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / iters)
    return statistics.median(times)


def check() -> None:
    """The device summary (fused where Triton imports) against the float64 torch path on the CPU."""
    from probes.core.summary import summarize

    g = torch.Generator(device="cuda").manual_seed(5)
    for dtype in (torch.bfloat16, torch.float32):
        t = (torch.randn(1000, 4099, device="cuda", generator=g) * 3).to(dtype)
        t[7, 9] = float("nan") if dtype == torch.bfloat16 else t[7, 9]
        got, want = summarize(t).cpu(), summarize(t.cpu(), backend="torch")
        same = [(a == b) or (a != a and b != b) for a, b in zip(got.tolist(), want.tolist(), strict=True)]
        close = torch.allclose(got, want, rtol=1e-5, equal_nan=True)
        print(f"check {dtype}: device {got.tolist()} float64 {want.tolist()}", flush=True)
        assert close and same[1] and same[3] and same[4], (dtype, got, want)


def isolated_case(model: Model, tokens: int) -> dict[str, Any]:
    """The 4 captured tensors of one step, on their own: the summary's kernels vs one read (amax) of each."""
    from probes.core.summary import summarize

    x = torch.randn(tokens, FEATURES, device="cuda").to(torch.bfloat16)
    h = x @ model.w_fc.t()
    n = torch.nn.functional.rms_norm(h, (HIDDEN,), model.g, 1e-6)
    ts = [x, h, n, n @ model.w_kv.t()]
    slot = torch.empty(5, dtype=torch.float64, device="cuda")
    nbytes = sum(t.numel() * t.element_size() for t in ts)
    summary = _time_us(lambda: [summarize(t, out=slot) for t in ts], iters=10)
    read = _time_us(lambda: [torch.amax(t) for t in ts], iters=10)
    copy = _time_us(lambda: [t.clone() for t in ts], iters=10)
    return {"tokens": tokens, "bytes": nbytes, "summary_us": summary, "read_us": read, "copy_us": copy,
            "summary_over_read": summary / read, "summary_gb_s": nbytes / summary / 1e3, "read_gb_s": nbytes / read / 1e3}


def tune() -> list[dict[str, Any]]:
    """The fused summary alone on the 8192-token input x [8192, 43008] bf16 (and on fp32), per tile setting,
    against one read (torch.amax) and a device copy (read + write) of the same tensor."""
    from probes import fused_summary as fs

    saved = (fs.TILE_BYTES, fs.PROGRAMS_PER_SM, fs.NUM_WARPS)
    out = []
    for dtype in (torch.bfloat16, torch.float32):
        x = torch.randn(8192, FEATURES if dtype == torch.bfloat16 else FEATURES // 2, device="cuda").to(dtype)
        nbytes = x.numel() * x.element_size()
        slot = torch.empty(5, dtype=torch.float64, device="cuda")
        ref = {"amax": _time_us(lambda: torch.amax(x)), "copy": _time_us(lambda: x.clone())}
        for tile_bytes in (2048, 4096):
            for per_sm in (4, 6, 8):
                for warps in (4, 8):
                    fs.TILE_BYTES, fs.PROGRAMS_PER_SM, fs.NUM_WARPS = tile_bytes, per_sm, warps
                    fs._PROGRAMS.clear()
                    us = _time_us(lambda: fs.summarize_fused(x, slot))
                    row = {"dtype": str(dtype), "tile_bytes": tile_bytes, "per_sm": per_sm, "warps": warps, "us": us,
                           "gb_s": nbytes / us / 1e3, "vs_amax": us / ref["amax"], **{f"{k}_us": v for k, v in ref.items()}}
                    out.append(row)
                    print(f"tune {row}", flush=True)
    fs.TILE_BYTES, fs.PROGRAMS_PER_SM, fs.NUM_WARPS = saved
    fs._PROGRAMS.clear()
    return out


def targets(rows: list[dict[str, Any]], isolated: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Issue 19's targets, checked on these rows."""
    by = {(r["tokens"], r["kind"], r["mode"]): r for r in rows}
    out = []

    def add(what: str, value: float | None, limit: float, unit: str) -> None:
        if value is not None:
            out.append({"target": what, "value": value, "limit": limit, "unit": unit, "met": value <= limit})

    for (tokens, kind, mode), r in sorted(by.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        pp = r.get("per_point")
        if kind == "graph" and mode == "summary":
            add(f"{tokens} tokens, CUDA graph: summary added per point", r["added_us_per_point"], 15, "us")
        if kind == "eager" and mode == "summary" and pp:
            add(f"{tokens} tokens, eager: summary kernel launches per point", pp["kernels"], 2, "launches")
        if kind == "eager" and mode == "full" and pp and tokens < 1024:
            add(f"{tokens} tokens, eager: full capture device copies per point", pp["copies"], 1, "copies")
        if kind == "graph" and mode == "summary-unread":
            add(f"{tokens} tokens, CUDA graph: summary kernels in the graph per point (after_replay sampled out)",
                r["added_us_per_point"], 15, "us")
    for r in isolated:
        add(f"{r['tokens']} tokens: summary of the 4 captured tensors / one read of them (amax)",
            r["summary_over_read"], 1.2, "x")
    return out


def render(result: dict[str, Any]) -> str:
    env = result["env"]
    lines = [
        f"GPU: {env['gpu']}; torch {env['torch']} (CUDA {env['cuda']}); Python {env['python']}",
        f"Command: `{env['command']}`",
        "",
        "| tokens | run | variant | step (ms, median) | ratio to none | drained (ms) | drained ratio | added per point (us) "
        "| kernels / point | device copies / point | D2H copies / point |",
        "| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in result["rows"]:
        pp = r.get("per_point")
        counts = " | ".join(f"{pp[k]:.2f}" for k in ("kernels", "copies", "dtoh")) if pp else "| |"
        lines.append(
            f"| {r['tokens']} | {r['kind']} | {r['mode']} | {r['stream_ms']:.3f} | {r['ratio']:.3f} | "
            f"{r['drained_ms']:.3f} | {r['drained_ratio']:.3f} | {r['added_us_per_point']:.1f} | {counts} |"
        )
    if result.get("isolated"):
        lines += ["", "| tokens | captured bytes | summary (us) | one read, amax (us) | copy (us) | summary / read | summary GB/s |",
                  "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for r in result["isolated"]:
            lines.append(f"| {r['tokens']} | {r['bytes']:,} | {r['summary_us']:.1f} | {r['read_us']:.1f} | {r['copy_us']:.1f} | "
                         f"{r['summary_over_read']:.2f} | {r['summary_gb_s']:.0f} |")
    if result.get("targets"):
        lines += ["", "| target | value | limit | met |", "| --- | ---: | ---: | --- |"]
        for t in result["targets"]:
            lines.append(f"| {t['target']} | {t['value']:.2f} {t['unit']} | {t['limit']} | {'yes' if t['met'] else 'NO'} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
