"""The KL routes at scale (issue 39, item 1): a body of 10,000 one-sample steps and a stored run of 30,000
steps are judged in seconds, a body too large is refused with 413, and the server answers /health afterwards."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from probes.core.bundle import MANIFEST
from probes.rl.logprobs import LogprobRecorder
from tests.validator.app.api.conftest import TOKEN
from validator.app.api.routes import rl as rl_routes
from validator.settings import Settings

pytestmark = pytest.mark.anyio


@pytest.fixture
def api_settings(tmp_path: Path, db_url: str | None) -> Settings:
    """The suite's settings with room for a 3 MB logprobs.jsonl upload (the issue's 30,000-step run)."""
    return Settings(home=tmp_path / "home", database_url=db_url, tokens=(TOKEN,), max_upload_bytes=8 << 20)


def _one_sample_steps(n: int) -> list[dict[str, object]]:
    rng = np.random.default_rng(0)
    ro = -rng.random(n)
    tr = np.minimum(0.0, ro + rng.normal(0, 0.05, n))
    return [{"step": s, "sample_id": 0, "token_index": 0, "rollout_logprob": round(float(a), 6),
             "train_logprob": round(float(b), 6)} for s, a, b in zip(range(n), ro, tr)]


async def _healthy(client: httpx.AsyncClient) -> None:
    r = await client.get("/api/v1/health")
    assert r.status_code == 200, r.text


async def test_a_body_of_10000_one_sample_steps_is_judged_in_seconds(client: httpx.AsyncClient) -> None:
    records = _one_sample_steps(10_000)
    body = json.dumps({"records": records, "floor": 1e-3}, separators=(",", ":"))
    assert len(body) < 1 << 20  # under the body cap (11,600 such steps took 15.5 s and 1.77 GB)
    t = time.perf_counter()
    r = await client.post("/api/v1/rl/kl", content=body, headers={"Content-Type": "application/json"}, timeout=60)
    took = time.perf_counter() - t
    assert r.status_code == 200, r.text
    doc = r.json()
    assert len(doc["steps"]) == 10_000 and doc["trend"]["n"] == 10_000
    assert took < 5.0, took
    await _healthy(client)


async def test_an_oversized_body_is_413_and_the_server_stays_healthy(client: httpx.AsyncClient) -> None:
    body = json.dumps({"records": _one_sample_steps(20_000)})  # about 1.9 MiB
    r = await client.post("/api/v1/rl/kl", content=body, headers={"Content-Type": "application/json"}, timeout=60)
    assert r.status_code == 413, r.text
    await _healthy(client)


async def test_more_records_than_the_route_judges_is_413(client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch) -> None:
    # the cap matters where max_json_bytes is raised; a small cap stands for it here
    monkeypatch.setattr(rl_routes, "MAX_KL_RECORDS", 100)
    r = await client.post("/api/v1/rl/kl", json={"records": _one_sample_steps(101)})
    assert r.status_code == 413, r.text
    assert r.json()["detail"].startswith("101 records; POST /api/v1/rl/kl judges at most 100")
    r = await client.post("/api/v1/rl/kl", json={"records": _one_sample_steps(100)})
    assert r.status_code == 200, r.text
    await _healthy(client)


async def test_a_stored_run_of_30000_steps_is_judged_and_the_server_stays_healthy(client: httpx.AsyncClient, tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    n = 30_000
    ro = -rng.random(n)
    tr = np.minimum(0.0, ro + rng.normal(0, 0.05, n))
    root = tmp_path / "b"
    with LogprobRecorder(root, part="trainer", run_name="long") as rec:
        for s in range(n):
            rec.record_sample(step=s, sample_id=0, rollout_logprobs=[float(ro[s])], train_logprobs=[float(tr[s])])
    assert (await client.post("/api/v1/runs", json={"name": "long"})).status_code == 201
    r = await client.put(f"/api/v1/runs/long/files/_root/{MANIFEST}", content=(root / MANIFEST).read_bytes())
    assert r.status_code == 200, r.text
    r = await client.put("/api/v1/runs/long/files/trainer/logprobs.jsonl",
                         content=(root / "parts" / "trainer" / "logprobs.jsonl").read_bytes(), timeout=60)
    assert r.status_code == 200, r.text
    assert (await client.post("/api/v1/runs/long/finalize", timeout=60)).status_code == 200
    t = time.perf_counter()
    r = await client.get("/api/v1/rl/runs/long/kl", timeout=60)
    took = time.perf_counter() - t
    assert r.status_code == 200, r.text
    assert len(r.json()["steps"]) == n and r.json()["trend"]["n"] == n
    assert took < 10.0, took
    await _healthy(client)
