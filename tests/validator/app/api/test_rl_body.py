"""The RL routes' bodies: duplicate JSON keys are refused (422), and ``variation`` picks how KL steps are judged."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from probes.rl.logprobs import LogprobRecorder
from tests.validator.app.api.test_rl_store import _push
from tests.validator.judging.test_rl_kl import _series
from tests.validator.judging.test_rl_kl_variation import HEALTHY, _levels
from validator.app.cli import main

pytestmark = pytest.mark.anyio


def _healthy_records(samples: int = 8, tokens: int = 10) -> list[dict[str, object]]:
    """The healthy series of benchmarks/rl_h200.md (its floor moves 30-40% from step to step) as records."""
    st, sm, ro, tr = _series(_levels(HEALTHY), samples=samples, tokens=tokens)
    return [{"step": int(a), "sample_id": f"s:{int(b)}", "token_index": i % tokens, "rollout_logprob": float(c),
             "train_logprob": float(d)} for i, (a, b, c, d) in enumerate(zip(st, sm, ro, tr))]


async def _post(client: httpx.AsyncClient, path: str, text: str) -> httpx.Response:
    return await client.post(path, content=text.encode(), headers={"Content-Type": "application/json"})


async def test_a_key_named_twice_is_refused_with_422(client: httpx.AsyncClient) -> None:
    records = _healthy_records()[:40]
    good = json.dumps({"records": records})  # ':' inside sample ids: a count of colons alone is not a refusal
    r = await _post(client, "/api/v1/rl/kl", good)
    assert r.status_code == 200, r.text
    # a record that gives train_logprob twice: FastAPI alone would judge the last value
    line = json.dumps(records[3])
    twice = line[:-1] + ', "train_logprob": -9.0}'
    r = await _post(client, "/api/v1/rl/kl", good.replace(line, twice))
    assert r.status_code == 422
    (err,) = r.json()["detail"]
    assert err["type"] == "json_duplicate_key" and err["loc"] == ["body"]
    assert err["msg"] == "key 'train_logprob' appears twice in one object: the request body must name each key once per object"
    r = await _post(client, "/api/v1/rl/kl", '{"floor": 1.0, ' + good[1:-1] + ', "floor": 0.001}')  # top level
    assert r.status_code == 422 and "'floor' appears twice" in r.json()["detail"][0]["msg"]
    r = await _post(client, "/api/v1/rl/manifest-diff", '{"a": {}, "a": {}, "b": {}}')
    assert r.status_code == 422 and "'a' appears twice" in r.json()["detail"][0]["msg"]
    r = await _post(client, "/api/v1/rl/kl", '{"records": [')  # not JSON: FastAPI's own answer
    assert r.status_code == 422 and r.json()["detail"][0]["type"] == "json_invalid"
    r = await client.post("/api/v1/rl/kl", content=twice.encode(), headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401  # auth first


async def test_variation_picks_how_steps_are_judged(client: httpx.AsyncClient) -> None:
    records = _healthy_records()
    r = await client.post("/api/v1/rl/kl", json={"records": records})
    assert r.status_code == 200 and r.json()["settings"]["variation"] == "measured" and r.json()["verdict"] == "at floor"
    r = await client.post("/api/v1/rl/kl", json={"records": records, "variation": "sampling"})
    doc = r.json()
    assert doc["settings"]["variation"] == "sampling" and doc["verdict"] == "above floor" and doc["exit_code"] == 1
    r = await client.post("/api/v1/rl/kl", json={"records": records, "variation": "both"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "variation"]


async def test_variation_on_a_stored_run_and_in_the_cli(client: httpx.AsyncClient, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    with LogprobRecorder(tmp_path / "b", part="trainer", run_name="rl") as rec:
        records = _healthy_records()
        for i in range(0, len(records), 10):  # a sample's 10 tokens at a time
            rs = records[i : i + 10]
            rec.record_sample(step=int(rs[0]["step"]), sample_id=str(rs[0]["sample_id"]),
                              rollout_logprobs=[x["rollout_logprob"] for x in rs], train_logprobs=[x["train_logprob"] for x in rs])
    await _push(client, tmp_path / "b", "healthy")
    verdicts = {}
    for variation in ("measured", "sampling"):
        r = await client.get("/api/v1/rl/runs/healthy/kl", params={"variation": variation})
        assert r.status_code == 200 and r.json()["settings"]["variation"] == variation
        verdicts[variation] = r.json()["verdict"]
    assert verdicts == {"measured": "at floor", "sampling": "above floor"}
    assert (await client.get("/api/v1/rl/runs/healthy/kl", params={"variation": "x"})).status_code == 422

    lp = tmp_path / "lp.jsonl"
    lp.write_text("".join(json.dumps(r) + "\n" for r in _healthy_records()))
    assert main(["rl", "kl", str(lp), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["settings"]["variation"] == "measured"
    assert main(["rl", "kl", str(lp), "--variation", "sampling", "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["verdict"] == "above floor"
    with pytest.raises(SystemExit) as exc:
        main(["rl", "kl", str(lp), "--variation", "both"])
    assert exc.value.code == 2 and "invalid choice: 'both'" in capsys.readouterr().err
