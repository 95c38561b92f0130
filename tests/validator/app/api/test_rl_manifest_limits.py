"""`POST /api/v1/rl/manifest-diff` refuses sizes before any work (issue 39, item 2): 400 naming the side and tensor."""

from __future__ import annotations

import httpx
import pytest

from validator.judging.manifest_diff import MAX_LORA_B_BYTES

pytestmark = pytest.mark.anyio


def _doc(shape: list[int], dtype: str = "float32") -> dict[str, object]:
    return {
        "format": "validator.weight_manifest",
        "version": 1,
        "tensors": {"x.lora_B.weight": {"dtype": dtype, "shape": shape, "sha256": "0" * 64}},
    }


async def test_manifest_diff_refuses_huge_sizes(client: httpx.AsyncClient) -> None:
    ok = _doc([2, 2])
    r = await client.post("/api/v1/rl/manifest-diff", json={"a": ok, "b": _doc([1099511627776])}, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["detail"] == (
        "b, tensor 'x.lora_B.weight': shape [1099511627776] of float32 is more than 68719476736 bytes (64 GiB), "
        "the largest tensor a manifest may declare"
    )
    r = await client.post("/api/v1/rl/manifest-diff", json={"a": _doc([MAX_LORA_B_BYTES // 4 + 1]), "b": ok}, timeout=30)
    assert r.status_code == 400 and r.json()["detail"].startswith("a, tensor 'x.lora_B.weight': a LoRA B factor of float32")
    assert "the version-1 zero check accepts" in r.json()["detail"]
    r = await client.get("/api/v1/health")
    assert r.status_code == 200
