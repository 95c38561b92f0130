"""Capture overhead on a DFlash-context-like step (needs a CUDA GPU). Prints a table; optional JSON/Markdown.

The step (bf16, hidden 7168, six capture layers, 8 KV heads x 128 for K and V)::

    x  [T, 6*7168]  --fc-->  h [T, 7168]  --RMSNorm-->  n [T, 7168]  --kv_proj-->  kv [T, 2048]

with 4 capture points (x, h, n, kv). Variants, timed in the same process on the same inputs:

- ``none``: no capture calls at all (the reference every ratio is taken against);
- ``disabled``: the 4 ``session.capture`` calls on the disabled session;
- ``summary``: summary mode (5 statistics per point computed on the device, 40 bytes copied back);
- ``full``: full capture (a device snapshot per point, async copy to pinned host memory);
- ``none-again``: the reference once more, last, to show the run-to-run spread.

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

from probes.capture import DISABLED, ProbeSession
from probes.config import ProbeConfig

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


def make_session(mode: str, graph: bool = False) -> ProbeSession:
    if mode in ("none", "disabled"):
        return DISABLED
    cfg = ProbeConfig(bundle="unused", mode=mode, budget_bytes=None, graph_slots=graph)
    return ProbeSession(cfg, writer=DiscardWriter())


def time_loop(run: Callable[[int], None], s: ProbeSession, iters: int, reps: int, warm: int) -> dict[str, float]:
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
    return {
        "stream_ms": statistics.median(stream),
        "drained_ms": statistics.median(drained),
        "stream_ms_min": min(stream),
        "stream_ms_max": max(stream),
    }


def eager_case(model: Model, tokens: int, mode: str, iters: int, reps: int) -> dict[str, float]:
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

    out = time_loop(run, s, iters, reps, warm=max(3, iters))
    s.close()
    return out


def graph_case(model: Model, tokens: int, mode: str, iters: int, reps: int) -> dict[str, float]:
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
        s.after_replay(step=i)

    out = time_loop(run, s, iters, reps, warm=max(3, iters))
    s.close()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", default="16,64,8192", help="comma-separated step sizes")
    ap.add_argument("--iters", type=int, default=50, help="steps per timing (decode sizes)")
    ap.add_argument("--prefill-iters", type=int, default=5, help="steps per timing at >= 1024 tokens")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--graph", action=argparse.BooleanOptionalAction, default=True, help="CUDA graph variant")
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
    rows = []
    for tokens in (int(t) for t in args.tokens.split(",")):
        iters = args.prefill_iters if tokens >= 1024 else args.iters
        kinds = [("eager", eager_case)] + ([("graph", graph_case)] if args.graph and tokens < 1024 else [])
        for kind, case in kinds:
            base = None
            for label in ("none", "disabled", "summary", "full", "none-again"):
                mode = label.removesuffix("-again")
                if kind == "graph" and mode == "disabled":
                    continue  # a disabled session adds no kernel: the graph is the uninstrumented one
                r = case(model, tokens, mode, iters, args.reps)
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
                rows.append(r)
                print(
                    f"{tokens:>6} {kind:<5} {label:<10} step {r['stream_ms']:8.3f} ms  x{r['ratio']:6.3f}  "
                    f"drained {r['drained_ms']:8.3f} ms (x{r['drained_ratio']:6.3f})  "
                    f"+{r['added_us_per_point']:8.1f} us/point",
                    flush=True,
                )
    result = {"env": env, "points_per_step": POINTS, "rows": rows}
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    table = render(result)
    print(table)
    if args.md:
        args.md.write_text(table)
    return 0


def render(result: dict[str, Any]) -> str:
    env = result["env"]
    lines = [
        f"GPU: {env['gpu']}; torch {env['torch']} (CUDA {env['cuda']}); Python {env['python']}",
        f"Command: `{env['command']}`",
        "",
        "| tokens | run | variant | step (ms, median) | ratio to none | drained (ms) | drained ratio | added per point (us) |",
        "| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['tokens']} | {r['kind']} | {r['mode']} | {r['stream_ms']:.3f} | {r['ratio']:.3f} | "
            f"{r['drained_ms']:.3f} | {r['drained_ratio']:.3f} | {r['added_us_per_point']:.1f} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
