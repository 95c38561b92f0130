"""Identical `POST /comparisons` of a small pair at once: docs/api.md promises a small pair's result in the
answer (200, `done`), not a 202 to poll, whichever request computes it (no ``background`` given: the size
decides)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from tests.factories import tensors, write_tp_bundle
from tests.validator.app.api.helpers import push

pytestmark = pytest.mark.anyio


async def test_20_identical_small_comparisons_at_once_all_answer_the_result(client: httpx.AsyncClient, tmp_path: Path) -> None:
    full = tensors()
    await push(client, write_tp_bundle(tmp_path, "ref", full, tp=4), "ref")
    await push(client, write_tp_bundle(tmp_path, "bad", full, tp=4, noise=0.5), "bad")
    got = await asyncio.gather(*(client.post("/api/v1/comparisons", json={"a": "ref", "b": "bad"}) for _ in range(20)))
    assert {(r.status_code, r.json()["status"], r.json()["verdict"]) for r in got} == {(200, "done", "fail")}, [r.text for r in got][:2]
    assert len({r.json()["id"] for r in got}) == 1  # computed once
