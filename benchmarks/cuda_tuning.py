"""The GPU backend's tuning constants and its handling of NaN/Inf, timed against alternatives in one process.

    PYTHONPATH=$PWD python3 benchmarks/cuda_tuning.py

Each alternative is this checkout's ``validator/numerics/backends/cuda.py`` loaded as a module of its own, with
its constants set or its source changed:

- ``FLUSH`` (tiles whose float32 per-lane sums go into float64 at once) at 64, 32 and 16: a group that holds a NaN
  or Inf is read again by its program, so a smaller group bounds what one NaN costs its program, and adds
  reductions to every program;
- ``second read pipelined``: that second read with Triton's software pipelining (``STAGES``) instead of one tile at a time;
- ``second read by the fix kernel``: no second read in the pass; the row is marked and the second kernel redoes it in float64;
- ``PROGRAMS`` (with ``FIX_ROWS`` keeping the second kernel at 1,024 programs) at 2,048 and 4,096: shorter programs,
  so that a program holding a NaN holds fewer tiles to read again.

Pairs of ``engine_bench.CLASSES`` (8192x7168 near 1e-3, drift 5e-2, nonfinite, bf16 vs fp32; 1 GiB per tensor
near 1e-3 and nonfinite, 64 row blocks as a comparison measures them). The alternatives are timed in turn, four
calls of each on each pair per round, 12 rounds, so that no alternative gets a warmer cache or a quieter card; each
call ends with its result on the host. Prints the median per call and GB/s (both tensors' bytes), and checks that
every alternative gives the counts, ``max_abs``, ULP and NaN/Inf counts of this checkout's and sums within 1e-6.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from benchmarks.engine_ab import load_module  # noqa: E402
from benchmarks.engine_bench import CLASSES  # noqa: E402
from validator.numerics import floors  # noqa: E402
from validator.numerics.backends import Totals  # noqa: E402

SOURCE = ROOT / "validator" / "numerics" / "backends" / "cuda.py"
REREAD = "TILE, BITS, A8, B8, F64, BAND, 1, MASKED, 1,"  # the pass's second read of a group: one tile in flight
ROUNDS, CALLS = 12, 4


def _by_fix_kernel(text: str) -> str:
    """The pass without its second read: a group that is not fine marks the row for the second kernel."""
    start = text.index("            if fine == 0:\n")
    end = text.index("            s_a2, s_b2, s_d2, s_abs, s_ad = s_a2 + qa")
    return text[:start] + "            if fine == 0:\n                over += 1\n" + text[end:]


def variants(tmp: Path) -> dict[str, Any]:
    text = SOURCE.read_text()
    assert text.count(REREAD) == 1, "cuda.py's second read has changed: update this benchmark"
    sources = {
        "this checkout": text,
        "second read pipelined": text.replace(REREAD, REREAD.replace("BAND, 1,", "BAND, STAGES,")),
        "second read by the fix kernel": _by_fix_kernel(text),
    }
    paths = {name: tmp / f"cuda_{i}.py" for i, name in enumerate(sources)}
    out: dict[str, Any] = {}
    for name, src in sources.items():
        paths[name].write_text(src)
        for flush in (64, 32, 16):  # 64: this checkout's FLUSH
            module = load_module(str(paths[name]), f"cuda_tuning_{len(out)}")
            module.FLUSH = flush  # type: ignore[attr-defined]
            out[name if flush == 64 else f"{name}, FLUSH {flush}"] = module
    for programs, fix_rows in ((2048, 2), (4096, 4)):
        module = load_module(str(paths["this checkout"]), f"cuda_tuning_{len(out)}")
        module.PROGRAMS, module.FIX_ROWS = programs, fix_rows  # type: ignore[attr-defined]
        out[f"PROGRAMS {programs}, FIX_ROWS {fix_rows}"] = module
    return out


def main() -> None:
    import tempfile

    print(torch.cuda.get_device_name(), f"torch {torch.__version__}", flush=True)
    pairs = []
    for label, shape in (("8192x7168", (8192, 7168)), ("1 GiB", (65536, 8192))):
        classes = (
            ("near 1e-3", "drift 5e-2", "nonfinite", "bf16 vs fp32") if label != "1 GiB" else ("near 1e-3", "nonfinite")
        )
        for cls in classes:
            a, b = CLASSES[cls](shape[0] * shape[1], "cuda")
            pairs.append((f"{label} {cls}", a.view(shape), b.view(shape), floors._edges(shape)))
    with tempfile.TemporaryDirectory() as tmp:
        modules = variants(Path(tmp))
        first: dict[str, Totals] = {}
        for label, module in modules.items():  # compile each, and check its results against this checkout's
            for name, a, b, edges in pairs:
                got = module.cuda_totals(a, b, atol=1e-5, rtol=1e-3, chunk_elems=1 << 26, edges=edges)
                ref = first.setdefault(name, got)
                exact = [(t.counts, t.max_abs, t.max_ulp, t.nonfinite) for t in (got, ref)]
                sums = zip(got.sums + got.block_d2, ref.sums + ref.block_d2)
                rel = max(abs(p - q) / max(abs(q), 1e-300) for p, q in sums)
                assert exact[0] == exact[1] and rel < 1e-6, f"{label} differs on {name}: {rel:.1e}"
        times: dict[tuple[str, str], list[float]] = {(label, name): [] for label in modules for name, *_ in pairs}
        for _ in range(ROUNDS):
            for label, module in modules.items():
                for name, a, b, edges in pairs:
                    for _ in range(CALLS):
                        torch.cuda.synchronize()
                        start = time.perf_counter()
                        module.cuda_totals(a, b, atol=1e-5, rtol=1e-3, chunk_elems=1 << 26, edges=edges)
                        times[(label, name)].append(time.perf_counter() - start)
    print("\nGB/s (median µs per call); every alternative gave this checkout's counts, max_abs and ULP\n")
    print("| alternative | " + " | ".join(name for name, *_ in pairs) + " |")
    print("| --- " * (len(pairs) + 1) + "|")
    for label in modules:
        cells = []
        for name, a, b, _ in pairs:
            med = statistics.median(times[(label, name)])
            cells.append(f"{a.numel() * (a.element_size() + b.element_size()) / med / 1e9:,.0f} ({med * 1e6:.0f})")
        print(f"| {label} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
