"""A plain NumPy float64 comparison of two single-tensor bf16/fp16/fp32 .safetensors files: the baseline
``file_compare_bench.py`` times ``validator compare`` against. Prints rel_l2, cosine, max_abs, mean_abs,
the non-finite counts and the allclose pass ratio (atol 1e-5, rtol 1e-3), all in float64."""

import json
import sys

import numpy as np


def load(path: str) -> np.ndarray:
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(size))
    (name,) = [k for k in header if k != "__metadata__"]
    info = header[name]
    lo, hi = info["data_offsets"]
    raw = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + size + lo, shape=(hi - lo,))
    if info["dtype"] == "BF16":
        return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return raw.view({"F16": np.float16, "F32": np.float32}[info["dtype"]]).astype(np.float64)


a, b = load(sys.argv[1]), load(sys.argv[2])
ok = np.isfinite(a) & np.isfinite(b)
x, y = np.where(ok, a, 0.0), np.where(ok, b, 0.0)
d = y - x
norm_a, norm_b, norm_d = np.linalg.norm(x), np.linalg.norm(y), np.linalg.norm(d)
absd = np.abs(d)
print(
    json.dumps(
        {
            "rel_l2": norm_d / norm_a,
            "cosine": float(np.dot(x, y) / (norm_a * norm_b)),
            "max_abs": float(absd.max()),
            "mean_abs": float(absd.sum() / ok.sum()),
            "nonfinite_a": int((~np.isfinite(a)).sum()),
            "nonfinite_b": int((~np.isfinite(b)).sum()),
            "pass_ratio": float((ok & (absd <= 1e-5 + 1e-3 * np.abs(x))).sum() / a.size),
        }
    )
)
