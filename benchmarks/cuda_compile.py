"""The GPU backend's kernels compiled for a GPU this machine need not have: registers, spills, loop sizes.

    PYTHONPATH=$PWD python3 benchmarks/cuda_compile.py                   # this checkout's cuda.py, sm_90
    git show REV:validator/numerics/backends/cuda.py > /tmp/old_cuda.py
    PYTHONPATH=$PWD python3 benchmarks/cuda_compile.py /tmp/old_cuda.py  # another version beside it
    PYTHONPATH=$PWD python3 benchmarks/cuda_compile.py --arch 100        # another target

Nothing here runs a kernel: ``triton.compile`` builds each ``*_kernel`` of ``cuda.py`` for the target (compute
capability ``--arch``, default 90: the H100 and H200) with the compile-time arguments the backend gives a pair
of dtypes (``cuda._constants``), aligned (16-element vectors) and not; Triton's own ``cuobjdump`` reads the
binary. So a change to a kernel can be weighed where no GPU is at hand, before it is timed on one: for each
kernel, the registers per thread and the bytes of stack (where registers ran out), the local loads and stores
(spills) in the SASS, the instructions in all, and the size of each innermost loop that loads from global
memory, in code order (the first is the pass's tile loop: its instructions per element bound the pass
where it is not bound by memory). The figures are the installed Triton's code generation, which can differ from
another version's.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402

from benchmarks.engine_ab import load_module  # noqa: E402
from validator.numerics.backends import cuda as this  # noqa: E402

POINTER = {torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.float32: "*fp32", torch.float64: "*fp64"}
POINTER |= {torch.float8_e4m3fn: "*fp8e4nv", torch.float8_e5m2: "*fp8e5"}
PAIRS = [
    (torch.bfloat16, torch.bfloat16), (torch.bfloat16, torch.float32), (torch.float32, torch.float32),
    (torch.bfloat16, torch.float64), (torch.float16, torch.float16), (torch.float8_e4m3fn, torch.float8_e4m3fn),
]  # fmt: skip
CUOBJDUMP = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
_INSTR = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?);")


def signature(kernel: Any, dtype_a: torch.dtype, dtype_b: torch.dtype) -> dict[str, str]:
    """The types of the kernel's runtime arguments, by name, as ``cuda_totals`` passes them: the pair's two
    pointers, the segment edges (int64), the tolerances and the buffer (float64), ``zero`` a flag, the rest int32."""
    out = {}
    for p in kernel.params:
        if p.is_constexpr:
            out[p.name] = "constexpr"
        elif p.name in ("a_ptr", "b_ptr"):
            out[p.name] = POINTER[dtype_a if p.name == "a_ptr" else dtype_b]
        elif p.name.endswith("_ptr"):
            out[p.name] = "*i64" if p.name == "seg_ptr" else "*fp64"
        else:
            out[p.name] = "i1" if p.name == "zero" else "i32"
    return out


def constants(module: ModuleType, kernel: Any, dtype_a: torch.dtype, dtype_b: torch.dtype, align: int) -> dict[str, Any]:
    """The kernel's compile-time arguments for such a pair (``_constants`` gives one dict, or one per kernel)."""
    got = module._constants(dtype_a, dtype_b, align, True)
    names = {p.name for p in kernel.params if p.is_constexpr}
    for d in got if isinstance(got, tuple) else (got,):
        if names <= set(d):
            return dict(d)
    raise SystemExit(f"{module.__name__}._constants gives no arguments for {kernel.__name__}")


def sass_figures(cubin: bytes) -> dict[str, Any]:
    """Registers, stack bytes, spill instructions, instructions, and innermost global-load loops' sizes."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        usage = subprocess.run([CUOBJDUMP, "--dump-resource-usage", f.name], capture_output=True, text=True, check=True)
        sass = subprocess.run([CUOBJDUMP, "-sass", f.name], capture_output=True, text=True, check=True).stdout
    code = [(int(m.group(1), 16), m.group(2)) for m in map(_INSTR.search, sass.splitlines()) if m]
    loops = []  # (start, end) of every backward branch's span
    for at, text in code:
        target = re.search(r"\bBRA\b.*?(0x[0-9a-f]+)", text)
        if target and int(target.group(1), 16) < at:
            loops.append((int(target.group(1), 16), at))
    loads = [(lo, hi) for lo, hi in loops if any(lo <= at <= hi and "LDG" in t for at, t in code)]
    innermost = sorted(s for s in loads if not any(o != s and s[0] <= o[0] and o[1] <= s[1] for o in loads))
    return {
        "registers": int(re.search(r"REG:(\d+)", usage.stdout).group(1)),  # type: ignore[union-attr]
        "stack": int(re.search(r"STACK:(\d+)", usage.stdout).group(1)),  # type: ignore[union-attr]
        "spills": sum(bool(re.match(r"(LDL|STL)\b", t)) for _, t in code),
        "instructions": len(code),
        "load loops": [sum(lo <= at <= hi for at, _ in code) for lo, hi in innermost],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("others", nargs="*", help="other versions of cuda.py, loaded by path")
    p.add_argument("--arch", type=int, default=90, help="compute capability (90: H100, H200)")
    args = p.parse_args()
    modules = {"this checkout": this} | {path: load_module(path, f"other_cuda_{i}") for i, path in enumerate(args.others)}
    target = GPUTarget("cuda", args.arch, 32)
    print(f"Triton {triton.__version__}, sm_{args.arch}; registers, stack bytes, spill instructions, instructions,")
    print("innermost global-load loops' instructions in code order")
    for name, module in modules.items():
        kernels = [v for k, v in vars(module).items() if k.endswith("_kernel") and isinstance(v, triton.JITFunction)]
        for dtype_a, dtype_b in PAIRS:
            for align in (module.VECTOR, 1):
                for kernel in kernels:
                    consts = constants(module, kernel, dtype_a, dtype_b, align)
                    warps = consts.pop("num_warps")
                    sig = signature(kernel, dtype_a, dtype_b)
                    pointers = {(i,): [["tt.divisibility", 16]] for i, t in enumerate(sig.values()) if t.startswith("*")}
                    src = triton.compiler.ASTSource(kernel, sig, consts, pointers)
                    compiled = triton.compile(src, target=target, options={"num_warps": warps})
                    got = sass_figures(compiled.asm["cubin"])
                    pair = f"{str(dtype_a)[6:]}/{str(dtype_b)[6:]}"
                    print(
                        f"{name:>16} {kernel.__name__:<13} {pair:<28} align {align:>2}: {got['registers']:>3} reg "
                        f"{got['stack']:>3} B stack {got['spills']:>3} spills {got['instructions']:>5} instr "
                        f"loops {got['load loops']}",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
