#!/usr/bin/env bash
# The comparison-engine runs on the lent H200 (docs/performance.md). Run from the repo root:
#   bash benchmarks/compare_h200.sh final   # CUDA tests, then (if they pass) the GPU numbers with the
#                                           # default configuration, the call-overhead breakdown, the
#                                           # interleaved kernel A/B and the CPU section on the host
#   bash benchmarks/compare_h200.sh sweep   # the kernel configurations of compare_bench.py's SWEEP
# Writes under $OUT (the device tool's output folder), else /tmp/compare-h200.
set -o pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 VALIDATOR_KERNEL_CACHE=/tmp/vkc
OUT=${OUT:-/tmp/compare-h200}
mkdir -p "$OUT"
mode=${1:-final}
# the device tool returns at most 8 files: everything also goes into one archive, whatever happens
trap 'tar -czf /tmp/results.tar.gz -C "$OUT" . && mv /tmp/results.tar.gz "$OUT/results.tar.gz"' EXIT
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, triton, numpy, platform; print('torch', torch.__version__, 'triton', triton.__version__, 'numpy', numpy.__version__, platform.processor())"
echo "cpus: $(nproc)  cc: $(command -v cc)"
if [ "$mode" = sweep ]; then
  timeout 300 python3 benchmarks/compare_bench.py --sections gpu --sweep --best-out "$OUT/best.json" --reps 10 \
    --json "$OUT/sweep.json" 2>&1 | tee "$OUT/sweep.log"
  exit
fi
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/validator/test_cuda_window.py tests/validator/test_fastmetrics.py \
  tests/validator/test_metrics.py tests/validator/test_p99_window.py tests/validator/test_cpu_window.py \
  -k "cuda or CUDA or window" > "$OUT/tests.log" 2>&1
tail -3 "$OUT/tests.log"
grep -q " failed\| error" "$OUT/tests.log" && exit 3
timeout 60 python3 benchmarks/call_overhead.py --json "$OUT/call-overhead.json" > "$OUT/call-overhead.log" 2>&1
grep elements "$OUT/call-overhead.log"
timeout 120 python3 benchmarks/kernel_ab.py --json "$OUT/kernel-ab.json" > "$OUT/kernel-ab.log" 2>&1
cut -c1-200 "$OUT/kernel-ab.log"
timeout 200 python3 benchmarks/compare_bench.py --sections gpu --profile --reps 20 --json "$OUT/perf-h200-gpu.json" \
  > "$OUT/bench-gpu.log" 2>&1
grep -A16 "== GPU: bf16" "$OUT/bench-gpu.log" | cut -c1-200
timeout 180 python3 benchmarks/compare_bench.py --sections cpu --reps 5 --cpu-elems 67108864 --ref-elems 2097152 \
  --json "$OUT/perf-h200-cpu.json" > "$OUT/bench-cpu.log" 2>&1
grep -A12 "== CPU" "$OUT/bench-cpu.log"
