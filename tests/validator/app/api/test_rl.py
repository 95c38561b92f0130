"""The RL gates: the KL verdict of posted logprob records and the diff of two posted manifests."""

from __future__ import annotations

import math

import httpx
import numpy as np
import pytest
import torch

from probes.rl.weights import manifest_from_state_dict

pytestmark = pytest.mark.anyio


def _records(levels: list[float], samples: int = 8, tokens: int = 10) -> list[dict[str, object]]:
    rng = np.random.default_rng(0)
    out: list[dict[str, object]] = []
    for step, lv in enumerate(levels):
        for s in range(samples):
            for t in range(tokens):
                ro = -1.0 - float(rng.exponential())
                r = float(rng.normal(-lv, math.sqrt(2 * lv)))
                out.append({"step": step, "sample_id": f"s{s}", "token_index": t, "rollout_logprob": ro, "train_logprob": ro + r})
    return out


async def test_kl_gate(client: httpx.AsyncClient) -> None:
    r = await client.post("/api/v1/rl/kl", json={"records": _records([2e-3] * 10), "floor": 2e-3})
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["kind"] == "rl_kl" and doc["verdict"] in ("at floor", "inconclusive") and len(doc["steps"]) == 10
    r = await client.post("/api/v1/rl/kl", json={"records": _records([2e-3] * 8 + [2e-2] * 2), "floor": 2e-3})
    assert r.status_code == 200 and r.json()["verdict"] == "above floor" and r.json()["exit_code"] == 1
    bad = _records([2e-3])
    del bad[3]["train_logprob"]
    r = await client.post("/api/v1/rl/kl", json={"records": bad})
    assert r.status_code == 400 and r.json()["detail"] == "records record 4: missing required field 'train_logprob'"
    r = await client.post("/api/v1/rl/kl", json={"records": []})
    assert r.status_code == 400 and "no records" in r.json()["detail"]
    r = await client.post("/api/v1/rl/kl", json={"records": _records([2e-3]), "floor": -1})
    assert r.status_code == 400
    r = await client.post("/api/v1/rl/kl", json={"records": _records([2e-3])}, headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401


async def test_manifest_gate(client: httpx.AsyncClient) -> None:
    sd = {"w": torch.ones(3), "x.lora_B.weight": torch.zeros(2, 2)}
    a = manifest_from_state_dict(sd, version=1)
    r = await client.post("/api/v1/rl/manifest-diff", json={"a": a, "b": a})
    assert r.status_code == 200 and r.json()["verdict"] == "identical" and r.json()["exit_code"] == 0
    b = manifest_from_state_dict(sd, version=2)
    r = await client.post("/api/v1/rl/manifest-diff", json={"a": a, "b": b})
    assert r.json()["verdict"] == "different" and "update changed nothing" in r.json()["reasons"][0]
    r = await client.post("/api/v1/rl/manifest-diff", json={"a": a, "b": {"format": "nope"}})
    assert r.status_code == 400 and r.json()["detail"].startswith("b: not a weight manifest")
