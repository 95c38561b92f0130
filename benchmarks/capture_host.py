"""Host time of one capture on the serving thread, and of the torch calls it makes (CUDA; issue 19).

An eager engine that is bound by its host (transformers' decode loop) pays every microsecond of Python a probe
adds. This times, on one 1 x 2048 bf16 CUDA tensor (a decode step's layer output):

- ``session.capture`` in summary mode with deferred summaries (the end-of-step summaries included, spread over
  the captures of a step), the writer dropping what it gets: what the serving thread pays per point;
- the same with the bundle writer, on its own thread (whose Python shares the GIL with the serving thread) and
  on the serving thread;
- the torch calls a capture makes, one by one.

Usage (a CUDA machine): ``python3 benchmarks/capture_host.py [--points 56] [--steps 400]``
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from capture_overhead import DiscardWriter  # the writer that keeps nothing (this folder, next to this script)

from probes.core.capture import ProbeSession
from probes.core.config import ProbeConfig


def per_call(fn: Any, n: int = 20000) -> float:
    """Median over 5 rounds of the microseconds per call of fn()."""
    rounds = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        rounds.append((time.perf_counter() - t0) / n * 1e6)
    return sorted(rounds)[2]


def per_capture(points: int, steps: int, writer: str) -> tuple[float, float]:
    """Microseconds per capture from the first capture to the last step's end (its summaries queued, the
    completed writes handed on), and from there to the closed session (median of 3 runs).
    ``writer``: ``discard`` (a writer that keeps nothing), ``thread`` or ``inline`` (the bundle writer, on
    its own thread or on the serving thread: ``ProbeConfig.drain``)."""
    xs = [torch.randn(1, 1, 2048, device="cuda", dtype=torch.bfloat16) for _ in range(points)]
    runs = []
    for _ in range(3):
        with tempfile.TemporaryDirectory() as tmp:
            cfg = ProbeConfig(bundle=tmp, part="tp0", mode="summary", defer_summaries=True, budget_bytes=None,
                              drain="inline" if writer == "inline" else "thread")
            session = ProbeSession(cfg, writer=DiscardWriter() if writer == "discard" else None)
            for step in range(3):  # warm-up: kernels compiled, names steady
                for i, x in enumerate(xs):
                    session.capture("target.hidden", x[0], step=step, request="r", tokens=(0, 1), layer=i)
            session.flush()
            t0 = time.perf_counter()
            for step in range(3, 3 + steps):
                for i, x in enumerate(xs):
                    session.capture("target.hidden", x[0], step=step, request="r", tokens=(0, 1), layer=i)
                session.end_step()
            t1 = time.perf_counter()
            session.close()  # the last copies and writes, the part's files
            runs.append(((t1 - t0) / (steps * points) * 1e6, (time.perf_counter() - t1) / (steps * points) * 1e6))
    return sorted(runs)[1]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--points", type=int, default=56)
    p.add_argument("--steps", type=int, default=400)
    args = p.parse_args()
    x = torch.randn(1, 1, 2048, device="cuda", dtype=torch.bfloat16)
    t, dev = x[0], x.device
    rows = {
        "t[0] (the hook's view of one request)": lambda: x[0],
        "t.detach()": t.detach,
        "torch.cuda.is_current_stream_capturing()": torch.cuda.is_current_stream_capturing,
        "t.untyped_storage().nbytes()": lambda: t.untyped_storage().nbytes(),
        "t.device": lambda: t.device,
        "torch.cuda.current_stream(device)": lambda: torch.cuda.current_stream(dev),
        "t._version": lambda: t._version,
        "a Python call with 5 keyword arguments": lambda: dict(step=1, request="r", tokens=(0, 1), layer=3, a=1),
    }
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, Python {sys.version.split()[0]}")
    print("| call | us per call |\n| --- | ---: |")
    for name, fn in rows.items():
        print(f"| {name} | {per_call(fn):.2f} |")
    print(f"\n{args.points} points per step, {args.steps} steps, summary mode, deferred summaries:\n")
    print("| writer | us per capture, in the steps | us per capture, closing |\n| --- | ---: | ---: |")
    for writer in ("discard", "thread", "inline"):
        steps_us, close_us = per_capture(args.points, args.steps, writer)
        print(f"| {writer} | {steps_us:.1f} | {close_us:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
