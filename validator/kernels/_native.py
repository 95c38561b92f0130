"""Building and loading the native CPU kernel (``_cpu_kernel.c``) with the system C compiler.

The library is compiled once per source text, compiler flags and CPU model, into a cache folder
(``$VALIDATOR_KERNEL_CACHE``, else ``$XDG_CACHE_HOME/validator/kernels``, else
``~/.cache/validator/kernels``), and loaded through :mod:`ctypes`, which releases the GIL during
each call so that several threads can run it at once. When no compiler works, :func:`library`
returns ``None`` and callers use the pure-torch reference instead. ``VALIDATOR_NATIVE=0`` turns the
native kernel off; ``VALIDATOR_NATIVE_FLAGS`` adds compiler flags (``-DVK_NO_AVX512`` builds the portable
code the tests check too).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shlex
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

__all__ = ["Acc", "Win", "Sampler", "library", "build_error"]

_SOURCE = Path(__file__).with_name("_cpu_kernel.c")
_BASE_FLAGS = ["-O3", "-ffp-contract=off", "-fopenmp-simd", "-fPIC", "-shared", "-std=gnu11", "-pthread"]
_ARCH_FLAGS = [["-march=native"], []]  # the portable build is the fallback
_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_tried = False
_error: str | None = None


class Acc(ctypes.Structure):
    """Mirror of ``vk_acc`` in ``_cpu_kernel.c``."""

    _fields_ = [
        ("s_aa", ctypes.c_double),
        ("s_bb", ctypes.c_double),
        ("s_ab", ctypes.c_double),
        ("s_dd", ctypes.c_double),
        ("s_ad", ctypes.c_double),
        ("max_ad", ctypes.c_double),
        ("n_both", ctypes.c_int64),
        ("n_pass", ctypes.c_int64),
        ("nf_a", ctypes.c_int64),
        ("nf_b", ctypes.c_int64),
        ("mismatch", ctypes.c_int64),
        ("max_ulp", ctypes.c_int64),
    ]


class Win(ctypes.Structure):
    """Mirror of ``vk_win`` in ``_cpu_kernel.c``: one thread's p99 window (inputs) and its counts (outputs)."""

    _fields_ = [
        ("lo", ctypes.c_uint32),
        ("width", ctypes.c_uint32),
        ("shift", ctypes.c_int32),
        ("pad", ctypes.c_int32),
        ("window", ctypes.c_void_p),
        ("list", ctypes.c_void_p),
        ("cap", ctypes.c_int64),
        ("nlist", ctypes.c_int64),
        ("below", ctypes.c_int64),
    ]


class Sampler(ctypes.Structure):
    """Mirror of ``vk_sampler`` in ``_cpu_kernel.c``: one sampling thread's histograms and results."""

    _fields_ = [
        ("fine", ctypes.c_void_p),
        ("coarse", ctypes.c_void_p),
        ("clear_fine", ctypes.c_int64),
        ("clear_coarse", ctypes.c_int64),
        ("maxd", ctypes.c_int64),
        ("total", ctypes.c_int64),
    ]


def _cache_dir() -> Path:
    env = os.environ.get("VALIDATOR_KERNEL_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "validator" / "kernels"


def _cpu_model() -> str:
    """What -march=native depends on: the CPU's model name and feature flags."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor()
    keep = [ln for ln in text.splitlines() if ln.startswith(("model name", "flags", "Features", "CPU part"))]
    return "\n".join(sorted(set(keep)))


def _compile(cc: str, flags: list[str], out: Path) -> str | None:
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, suffix=".so")
    os.close(fd)
    try:
        proc = subprocess.run(
            [cc, *_BASE_FLAGS, *flags, "-o", tmp, str(_SOURCE)], capture_output=True, text=True, timeout=300
        )
        if proc.returncode != 0:
            return proc.stderr.strip()[-2000:] or f"{cc} exited {proc.returncode}"
        os.replace(tmp, out)  # atomic: concurrent builders race harmlessly
        return None
    except (OSError, subprocess.SubprocessError) as exc:
        return str(exc)
    finally:
        Path(tmp).unlink(missing_ok=True)


def _load(path: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))
    p, i64, dbl, c_int = ctypes.c_void_p, ctypes.c_int64, ctypes.c_double, ctypes.c_int
    lib.vk_compare.argtypes = [p, c_int, p, c_int, i64, dbl, dbl, ctypes.POINTER(Acc), p, p, c_int]
    lib.vk_compare.restype = c_int
    lib.vk_compare_win.argtypes = [p, p, c_int, i64, i64, p, dbl, dbl, ctypes.POINTER(Acc), ctypes.POINTER(Win), c_int]
    lib.vk_compare_win.restype = c_int
    lib.vk_compare_win_par.argtypes = [
        p,
        p,
        c_int,
        i64,
        i64,
        dbl,
        dbl,
        ctypes.POINTER(Acc),
        ctypes.POINTER(Win),
        c_int,
        c_int,
    ]
    lib.vk_compare_win_par.restype = c_int
    lib.vk_sample_par.argtypes = [p, p, c_int, i64, i64, i64, i64, ctypes.POINTER(Sampler), c_int]
    lib.vk_sample_par.restype = i64
    lib.vk_sample_starts.argtypes = [i64, i64, i64, p]
    lib.vk_sample_starts.restype = None
    lib.vk_list_low.argtypes = [p, i64, i64, p]
    lib.vk_list_low.restype = None
    lib.vk_refine_f32.argtypes = [p, p, i64, i64, p]
    lib.vk_refine_f32.restype = None
    lib.vk_add_i64.argtypes = [p, p, i64]
    lib.vk_add_i64.restype = None
    lib.vk_set_fp8_tables.argtypes = [p, p]
    lib.vk_set_fp8_tables.restype = None
    _set_fp8_tables(lib)
    return lib


def _set_fp8_tables(lib: ctypes.CDLL) -> None:
    """The float8 decode tables, taken from torch's own conversion so both paths agree bit for bit."""
    import torch

    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    e4m3 = codes.view(torch.float8_e4m3fn).to(torch.float64).contiguous()
    e5m2 = codes.view(torch.float8_e5m2).to(torch.float64).contiguous()
    lib.vk_set_fp8_tables(e4m3.data_ptr(), e5m2.data_ptr())


def library() -> ctypes.CDLL | None:
    """The loaded kernel library, building it on first use; ``None`` when it cannot be had."""
    global _lib, _tried, _error
    if _lib is not None or (_tried and _lib is None):
        return _lib
    with _lock:
        if _tried:
            return _lib
        _tried = True
        if os.environ.get("VALIDATOR_NATIVE", "1") == "0":
            _error = "disabled by VALIDATOR_NATIVE=0"
            return None
        cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
        if cc is None:
            _error = "no C compiler (cc, gcc or clang) on PATH"
            return None
        errors = []
        extra = shlex.split(os.environ.get("VALIDATOR_NATIVE_FLAGS", ""))  # e.g. -DVK_NO_AVX512 (tests)
        for arch in _ARCH_FLAGS:
            flags = [*arch, *extra]
            key = hashlib.sha256(
                "\0".join([_SOURCE.read_text(), cc, *_BASE_FLAGS, *flags, platform.machine(), _cpu_model()]).encode()
            ).hexdigest()[:20]
            path = _cache_dir() / f"vkcpu-{key}.so"
            if not path.exists():
                err = _compile(cc, flags, path)
                if err is not None:
                    errors.append(err)
                    continue
            try:
                _lib = _load(path)
                return _lib
            except OSError as exc:
                errors.append(str(exc))
        _error = "; ".join(errors)[-2000:]
        return None


def build_error() -> str | None:
    """Why :func:`library` returned ``None`` (after it was called), else ``None``."""
    return _error
