from __future__ import annotations

from pathlib import Path

import httpx

from probes.core.bundle import MANIFEST, PART_FILE


async def push(client: httpx.AsyncClient, bundle: Path, name: str) -> dict:
    """Upload a bundle file by file over the API, the way `validator push` does."""
    r = await client.post("/api/v1/runs", json={"name": name, "labels": {"via": "api"}})
    assert r.status_code == 201, r.text
    r = await client.put(f"/api/v1/runs/{name}/files/_root/{MANIFEST}", content=(bundle / MANIFEST).read_bytes())
    assert r.status_code == 200, r.text
    for part in sorted((bundle / "parts").iterdir()):
        files = sorted(f for f in part.iterdir() if f.name != PART_FILE) + [part / PART_FILE]
        for f in files:
            r = await client.put(f"/api/v1/runs/{name}/files/{part.name}/{f.name}", content=f.read_bytes())
            assert r.status_code == 200, r.text
    r = await client.post(f"/api/v1/runs/{name}/finalize")
    assert r.status_code == 200, r.text
    return r.json()
