#!/usr/bin/env bash
# The flagship question at Kimi-K3 shapes: does the PP-partial projection match the single GEMM?
# Runs the projection probe (hidden 7168, capture [19,37,54,66,78,90], PP8, 6 draft layers, 4096 tokens,
# torch kernels) and judges both PP hand-offs with the default policy, exactly as a user would:
#   validator compare ref partial-fp32 --floor ref concat   (expected: PASS)
#   validator compare ref partial-bf16 --floor ref concat   (expected: FAIL, on ctx.pre_norm)
# Usage: benchmarks/projection_flagship.sh OUT_DIR [device]   (device: cuda by default; cpu works, slowly)
set -uo pipefail
OUT=${1:?usage: $0 OUT_DIR [device]}
DEVICE=${2:-cuda}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
"$PY" -m validator.workloads.projection_report --hidden 7168 --layers 93 --capture-layers 19,37,54,66,78,90 --pp 8 \
  --draft-layers 6 --kv-heads 8 --head-dim 128 --rope-theta 10000 --eps 1e-6 --tokens 4096 --dtype bf16 \
  --seed 0 --device "$DEVICE" --kernels torch --out "$OUT/bundles" > "$OUT/probe.txt" || exit 1
for cand in partial-fp32 partial-bf16; do
  echo "\$ validator compare ref $cand --floor ref concat"
  "$PY" -m validator compare "$OUT/bundles/ref" "$OUT/bundles/$cand" --floor "$OUT/bundles/ref" \
    "$OUT/bundles/concat" --json > "$OUT/$cand.json"
  echo "exit $?"
  "$PY" -c "import json, sys; from validator.judging.report import format_comparison; print(format_comparison(json.load(open(sys.argv[1])), limit=None))" "$OUT/$cand.json"
done
