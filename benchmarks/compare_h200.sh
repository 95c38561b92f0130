#!/usr/bin/env bash
# The comparison-engine runs on the lent H200 (docs/results/perf-h200.md). Run from the repo root:
#   bash benchmarks/compare_h200.sh dev     # tests on the GPU + a kernel-configuration sweep
#   bash benchmarks/compare_h200.sh final   # sweep, then the numbers with the best exact configuration,
#                                           # the CUDA tests under that configuration, and the CPU section
# Writes under $OUT (the device tool's output folder), else /tmp/compare-h200.
set -o pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 VALIDATOR_KERNEL_CACHE=/tmp/vkc
OUT=${OUT:-/tmp/compare-h200}
mkdir -p "$OUT"
mode=${1:-final}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, triton, numpy, platform; print('torch', torch.__version__, 'triton', triton.__version__, 'numpy', numpy.__version__, platform.processor())"
echo "cpus: $(nproc)  cc: $(command -v cc)"
if [ "$mode" = dev ]; then
  timeout 150 python3 -m pytest -q -p no:cacheprovider --maxfail=8 tests/validator/test_cuda_window.py \
    tests/validator/test_p99_window.py tests/validator/test_fastmetrics.py tests/validator/test_metrics.py -k "cuda or CUDA or window" \
    2>&1 | tail -30 | tee "$OUT/tests.log"
  timeout 300 python3 benchmarks/compare_bench.py --sections gpu --sweep --profile --best-out "$OUT/best.json" --reps 10 \
    --json "$OUT/dev.json" 2>&1 | tee "$OUT/bench.log"
  timeout 100 python3 benchmarks/compare_bench.py --sections cpu --reps 5 --cpu-elems 67108864 --ref-elems 2097152 \
    --json "$OUT/dev-cpu.json" 2>&1 | tee "$OUT/bench-cpu.log"
else
  timeout 240 python3 benchmarks/compare_bench.py --sections gpu --sweep --profile --best-out "$OUT/best.json" --reps 10 \
    --json "$OUT/perf-h200-gpu.json" > "$OUT/bench-gpu.log" 2>&1
  grep -v "^ \|^-" "$OUT/bench-gpu.log" | cut -c1-400 | tail -40
  grep -A16 "== GPU: bf16" "$OUT/bench-gpu.log"
  export VALIDATOR_CUDA_CONFIG="$(cat "$OUT/best.json" 2>/dev/null || echo '{}')"
  echo "VALIDATOR_CUDA_CONFIG=$VALIDATOR_CUDA_CONFIG"
  timeout 120 python3 -m pytest -q -p no:cacheprovider tests/validator/test_cuda_window.py tests/validator/test_fastmetrics.py \
    tests/validator/test_metrics.py tests/validator/test_cpu_window.py -k "cuda or CUDA or window" 2>&1 | tail -8 | tee "$OUT/tests.log"
  timeout 150 python3 benchmarks/compare_bench.py --sections cpu --reps 5 --cpu-elems 67108864 --ref-elems 2097152 \
    --json "$OUT/perf-h200-cpu.json" > "$OUT/bench-cpu.log" 2>&1
  grep -A12 "== CPU" "$OUT/bench-cpu.log"
fi
