#!/usr/bin/env bash
# The H200 run behind benchmarks/projection_h200.md: the projection probe at Kimi-K3 shapes
# (hidden 7168, 93 layers, capture 19,37,54,66,78,90, PP8 even split, 6 draft layers x 8 KV heads x 128,
# one 8192-token chunk, BF16), paths concat / partial-bf16 / partial-fp32 / ref (float64).
#
# Run from the repository root on a CUDA machine. flashinfer is optional: with it importable, RMSNorm and
# RoPE of the non-float64 paths use its kernels (the report says which were used). On the device
# machine it was carried as wheels and installed with
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
#       --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
# (.whl/: flashinfer-python 0.6.13, apache-tvm-ffi, nvidia-cudnn-frontend, einops).
#
# Usage: bash benchmarks/projection_h200.sh [WORKDIR]
#   WORKDIR/run/        one bundle per path (about 14 GB: keep it off the repository) + report.{json,md}
#   WORKDIR/run-torch/  the same inputs with torch RMSNorm/RoPE, report only (separates kernel effects)
set -euo pipefail
work=${1:-/tmp/projection-h200}
shapes=(--hidden 7168 --layers 93 --capture-layers 19,37,54,66,78,90 --pp 8
        --draft-layers 6 --kv-heads 8 --head-dim 128 --rope-theta 10000 --eps 1e-6
        --tokens 8192 --dtype bf16 --seed 0 --device cuda)
python3 -m validator.workloads.projection_report "${shapes[@]}" --kernels auto --out "$work/run"
python3 -m validator.workloads.projection_report "${shapes[@]}" --kernels torch --no-bundles --out "$work/run-torch" > /dev/null
du -sh "$work"/run/*/
