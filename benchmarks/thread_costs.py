"""What starting work on many threads costs on this machine, for the CPU kernel's thread model.

    python benchmarks/thread_costs.py [--threads 16] [--reps 50]

Medians, in microseconds, of getting ``--threads`` threads to do an empty job and be done:

- ``pthread_create``: POSIX threads created and joined (what ``vk_sample_par`` does);
- ``condvar_wake``: threads of a pool asleep on a condition variable, woken by a broadcast, and the
  caller waiting until each has checked in (a persistent pool after an idle spell);
- ``spin_wake``: the same pool threads spinning on a counter instead (a pool that was just busy);
- ``python_pool``: a ``ThreadPoolExecutor``'s workers each making one ctypes call (what the main
  pass does), idle before.

Each is measured after the threads have been idle for ``--idle-ms`` (CPUs of a virtual machine may
have halted by then).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

_SOURCE = r"""
#include <pthread.h>
#include <stdint.h>
#include <time.h>
static double now_us(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e6 + t.tv_nsec / 1e3; }
static void *noop(void *p) { (void)p; return 0; }
double create_join(int n) {
    pthread_t th[256];
    double t0 = now_us();
    for (int i = 0; i < n; i++) pthread_create(&th[i], 0, noop, 0);
    for (int i = 0; i < n; i++) pthread_join(th[i], 0);
    return now_us() - t0;
}
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static volatile int64_t gen, acks, stop, spin_mode;
static pthread_t pool[256];
static int npool;
static void *member(void *p) {
    (void)p;
    int64_t seen = 0;
    for (;;) {
        if (spin_mode) {
            while (__atomic_load_n(&gen, __ATOMIC_ACQUIRE) == seen && !stop) { }
        } else {
            pthread_mutex_lock(&mu);
            while (gen == seen && !stop) pthread_cond_wait(&cv, &mu);
            pthread_mutex_unlock(&mu);
        }
        if (stop) return 0;
        seen = gen;
        __atomic_add_fetch(&acks, 1, __ATOMIC_ACQ_REL);
    }
}
void pool_start(int n, int spin) {
    spin_mode = spin; stop = 0; gen = 0; npool = n;
    for (int i = 0; i < n; i++) pthread_create(&pool[i], 0, member, 0);
}
double pool_round(void) {
    __atomic_store_n(&acks, 0, __ATOMIC_RELEASE);
    double t0 = now_us();
    pthread_mutex_lock(&mu);
    __atomic_add_fetch(&gen, 1, __ATOMIC_ACQ_REL);
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
    while (__atomic_load_n(&acks, __ATOMIC_ACQUIRE) < npool) { }
    return now_us() - t0;
}
void pool_stop(void) {
    pthread_mutex_lock(&mu); stop = 1; pthread_cond_broadcast(&cv); pthread_mutex_unlock(&mu);
    for (int i = 0; i < npool; i++) pthread_join(pool[i], 0);
}
void touch(void) { }
"""


def build() -> ctypes.CDLL:
    cc = shutil.which("cc") or "cc"
    tmp = Path(tempfile.mkdtemp())
    src, lib = tmp / "threads.c", tmp / "threads.so"
    src.write_text(_SOURCE)
    subprocess.run([cc, "-O2", "-shared", "-fPIC", "-pthread", "-o", str(lib), str(src)], check=True)
    dll = ctypes.CDLL(str(lib))
    dll.create_join.restype = ctypes.c_double
    dll.pool_round.restype = ctypes.c_double
    return dll


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--threads", type=int, default=16)
    p.add_argument("--reps", type=int, default=50)
    p.add_argument("--idle-ms", type=float, default=20.0)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    lib = build()
    n, idle = args.threads - 1, args.idle_ms / 1e3
    out: dict[str, float] = {}

    def median_of(fn) -> float:  # type: ignore[no-untyped-def]
        vals = []
        for _ in range(args.reps):
            time.sleep(idle)
            vals.append(fn())
        return statistics.median(vals)

    out["pthread_create"] = median_of(lambda: lib.create_join(n))
    for name, spin in (("condvar_wake", 0), ("spin_wake", 1)):
        lib.pool_start(n, spin)
        out[name] = median_of(lambda: lib.pool_round())
        lib.pool_stop()
    pool = ThreadPoolExecutor(max_workers=args.threads)
    list(pool.map(lambda _: lib.touch(), range(args.threads)))

    def python_round() -> float:
        t = time.perf_counter()
        futures = [pool.submit(lib.touch) for _ in range(n)]
        lib.touch()
        for f in futures:
            f.result()
        return 1e6 * (time.perf_counter() - t)

    out["python_pool"] = median_of(python_round)
    pool.shutdown()
    for k, v in out.items():
        print(f"{k:16s} {v:9.1f} us  ({args.threads} threads, idle {args.idle_ms:g} ms before each)")
    if args.json:
        args.json.write_text(json.dumps({"threads": args.threads, "idle_ms": args.idle_ms, "us": out}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
