"""Logprob records as a run artifact: pushed in a bundle part, stored as Parquet, judged by the API, the
dashboard page and the CLI from the store."""

from __future__ import annotations

import json
import math
from pathlib import Path

import httpx
import numpy as np
import pytest

from probes.core.bundle import MANIFEST
from probes.rl.logprobs import LogprobRecorder
from validator.app.cli import main
from validator.service import Service

pytestmark = pytest.mark.anyio


def _bundle(root: Path, levels: list[float]) -> Path:
    rng = np.random.default_rng(0)
    with LogprobRecorder(root, part="trainer", run_name="rl", labels={"model": "m"}) as rec:
        for step, lv in enumerate(levels):
            for s in range(8):
                ro = -1.0 - rng.exponential(size=12)
                r = rng.normal(-lv, math.sqrt(2 * lv), 12)
                rec.record_sample(step=step, sample_id=f"s{s}", rollout_logprobs=ro.tolist(), train_logprobs=(ro + r).tolist(),
                                  weight_version=step)
    return root


async def _push(client: httpx.AsyncClient, bundle: Path, name: str) -> None:
    assert (await client.post("/api/v1/runs", json={"name": name})).status_code == 201
    r = await client.put(f"/api/v1/runs/{name}/files/_root/{MANIFEST}", content=(bundle / MANIFEST).read_bytes())
    assert r.status_code == 200, r.text
    r = await client.put(f"/api/v1/runs/{name}/files/trainer/logprobs.jsonl",
                         content=(bundle / "parts" / "trainer" / "logprobs.jsonl").read_bytes())
    assert r.status_code == 200, r.text
    r = await client.post(f"/api/v1/runs/{name}/finalize")
    assert r.status_code == 200, r.text


async def test_logprob_records_pushed_stored_and_judged(client: httpx.AsyncClient, api_service: Service, tmp_path: Path) -> None:
    await _push(client, _bundle(tmp_path / "b", [2e-3] * 8 + [2e-2] * 2), "rl-run")
    run = (await client.get("/api/v1/runs/rl-run")).json()
    assert "logprobs" in {a["kind"] for a in run["artifacts"]}
    r = await client.get("/api/v1/rl/runs/rl-run/kl", params={"floor": 2e-3})
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["verdict"] == "above floor" and [s["step"] for s in doc["steps"] if s["status"] == "above floor"] == [8, 9]
    assert doc["steps"][3]["weight_versions"] == [3]
    page = await client.get("/runs/rl-run/rl-kl", params={"floor": 2e-3})
    assert page.status_code == 200 and "<svg" in page.text and "ABOVE FLOOR" in page.text
    js = await client.get("/runs/rl-run/rl-kl", params={"format": "json"})
    assert js.status_code == 200 and js.json()["kl"]["kind"] == "rl_kl"
    assert (await client.get("/api/v1/rl/runs/nope/kl")).status_code == 404
    assert (await client.get("/runs/nope/rl-kl")).status_code == 404


def test_cli_reads_a_stored_run_or_a_bundle(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from validator.settings import Settings

    bundle = _bundle(tmp_path / "b", [2e-3] * 8 + [2e-2] * 2)
    home = tmp_path / "home"
    svc = Service(Settings(home=home))
    try:
        svc.ingest(bundle, name="rl-local")
    finally:
        svc.close()
    assert main(["--home", str(home), "rl", "kl", "rl-local", "--floor", "2e-3"]) == 1
    assert "verdict: ABOVE FLOOR" in capsys.readouterr().out
    assert main(["--home", str(home), "rl", "kl", str(bundle), "--floor", "2e-3"]) == 1
    assert main(["--home", str(home), "rl", "kl", "no-such-run"]) == 2
    assert "no-such-run" in capsys.readouterr().err


def test_run_without_logprob_records(api_service: Service, tmp_path: Path) -> None:
    import torch
    from safetensors.torch import save_file

    save_file({"w": torch.ones(2)}, str(tmp_path / "w.safetensors"))
    api_service.ingest(tmp_path / "w.safetensors", name="plain")
    from validator.errors import NotFoundError

    with pytest.raises(NotFoundError, match="no logprob records"):
        api_service.rl_kl("plain")


def _weights(d: Path, name: str, scale: float) -> Path:
    import torch
    from safetensors.torch import save_file

    path = d / f"{name}.safetensors"
    save_file({"w": torch.arange(6, dtype=torch.float32) * scale, "x.lora_B.weight": torch.zeros(2, 2)}, str(path))
    return path


async def test_manifest_diff_of_stored_runs(client: httpx.AsyncClient, api_service: Service, tmp_path: Path) -> None:
    from validator.runs.weight_manifest import manifest_of_safetensors, manifest_of_view

    for name, scale in (("w1", 1.0), ("w1b", 1.0), ("w2", 1.5)):
        api_service.ingest(_weights(tmp_path, name, scale), name=name)
    stored = manifest_of_view(api_service.resolve("w1", allow_paths=False))
    assert stored.tensors == manifest_of_safetensors(tmp_path / "w1.safetensors").tensors
    r = await client.get("/api/v1/rl/manifest-diff", params={"a": "w1", "b": "w1b"})
    assert r.status_code == 200 and r.json()["verdict"] == "identical"
    r = await client.get("/api/v1/rl/manifest-diff", params={"a": "w1", "b": "w2", "numeric": True})
    doc = r.json()
    assert doc["verdict"] == "different" and doc["changed"][0]["name"] == "w" and doc["changed"][0]["numeric"]["rel_l2"] == 0.5
    assert (await client.get("/api/v1/rl/manifest-diff", params={"a": "w1", "b": "nope"})).status_code == 404
    page = await client.get("/rl/manifest-diff", params={"a": "w1", "b": "w2"})
    assert page.status_code == 200 and "DIFFERENT" in page.text and "float32 -&gt; float64" in page.text
    js = await client.get("/rl/manifest-diff", params={"a": "w1", "b": "w1b", "format": "json"})
    assert js.json()["diff"]["verdict"] == "identical"
    assert (await client.get("/rl/manifest-diff", params={"a": "w1", "b": "nope"})).status_code == 404


def test_cli_manifest_diff_of_stored_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from validator.settings import Settings

    home = tmp_path / "home"
    svc = Service(Settings(home=home))
    try:
        svc.ingest(_weights(tmp_path, "w1", 1.0), name="w1")
        svc.ingest(_weights(tmp_path, "w2", 2.0), name="w2")
    finally:
        svc.close()
    assert main(["--home", str(home), "manifest", "diff", "w1", str(tmp_path / "w1.safetensors")]) == 0
    assert main(["--home", str(home), "manifest", "diff", "w1", "w2", "--json"]) == 1
    out = capsys.readouterr().out
    doc = json.loads(out[out.index("{"):])
    assert doc["changed"][0]["numeric"]["rel_l2"] == 1.0
    assert main(["--home", str(home), "manifest", "diff", "w1", "nope"]) == 2
