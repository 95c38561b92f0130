#!/usr/bin/env bash
# Root cause first, on the GPU: the transformers engine's broken PD hand-offs against its decode-only run, and
# where `validator compare` says they first part (benchmarks/frontier_gpu.md). The committed GSM8K-trained tiny
# pair, bf16 on CUDA, 24 GSM8K test prompts from row 40 on, 48 new tokens, full capture.
# Usage: benchmarks/frontier_gpu.sh OUT_DIR   (repository root; the `validator` package importable)
# A quick check on the CPU: LIMIT=2 TOKENS=8 DEVICE=cpu DTYPE=float32 benchmarks/frontier_gpu.sh /tmp/f
set -euo pipefail
out=${1:?usage: benchmarks/frontier_gpu.sh OUT_DIR}
mkdir -p "$out"
work=$(mktemp -d)
sed -n '41,64p' tests/data/gsm8k/test.jsonl > "$work/prompts.jsonl"
common=(--prompts "$work/prompts.jsonl" --limit "${LIMIT:-24}" --max-new-tokens "${TOKENS:-48}" --device "${DEVICE:-cuda}" --dtype "${DTYPE:-bfloat16}")
python3 -m validator probe transformers --mode d-only --out "$work/d-only" "${common[@]}"
for broken in ${BREAKS:-head layer}; do
  python3 -m validator probe transformers --mode pd-broken --break "$broken" --out "$work/$broken" "${common[@]}"
  set +e
  python3 -m validator --home "$work/home" compare "$work/d-only" "$work/$broken" \
    --policy examples/policies/hf-tiny-pd.toml --json > "$out/$broken.json"
  echo "exit $? (pd-broken --break $broken)" | tee "$out/$broken.exit"
  python3 -m validator --home "$work/home" compare "$work/d-only" "$work/$broken" \
    --policy examples/policies/hf-tiny-pd.toml | sed -n '/^verdict:/,$p' | head -40 > "$out/$broken.txt"
  set -e
  cat "$out/$broken.txt"
done
python3 - "$out" "${BREAKS:-head layer}" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
for broken in sys.argv[2].split():
    doc = json.loads((out / f"{broken}.json").read_text())
    failing = [p for p in doc["pairs"] if p["status"] in ("fail", "error")]
    summary = {
        "verdict": doc["verdict"], "headline": doc["headline"], "first_divergence": doc["first_divergence"]["where"],
        "problem_nodes": sorted({p["where"] for p in doc["problem_nodes"]}), "problem_node_count": len(doc["problem_nodes"]),
        "failing_pairs": len(failing), "downstream_pairs": doc["downstream"]["pairs"],
        "step0_failing": sorted({(p["name"], p["coords"].get("layer")) for p in failing if p["coords"].get("step") == 0}),
        "acceptance_frontier": doc["acceptance"]["frontier"] if doc.get("acceptance") else None,
    }
    (out / f"{broken}.summary.json").write_text(json.dumps(summary, indent=1, default=str))
    print(json.dumps(summary, indent=1, default=str)[:3000])
PY
