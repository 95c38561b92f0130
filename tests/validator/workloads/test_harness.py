from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from validator.errors import InputError
from validator.runs.acceptance_records import normalize_record, read_acceptance_bundle
from validator.workloads.harness import EOS, Harness, HarnessConfig, spec_counters, write_acceptance_part


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    # Tiny ops: OpenMP threads only add barrier waits (10x slower on a busy 2-core machine).
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


PROMPTS = [f"Question: A farmer has {i} cows and buys {i + 3} more. How many?\nAnswer:".encode() for i in range(4)]


def _run(mode: str, tokens: int = 128, config: HarnessConfig | None = None) -> tuple[list[list[int]], list[dict]]:
    h = Harness(seed=0, mode=mode, block=4, config=config)
    outs, recs = [], []
    for i, p in enumerate(PROMPTS):
        out, r = h.generate(list(p), tokens, request_id=f"r{i}", ignore_eos=True)
        outs.append(out)
        recs.extend(r)
    return outs, recs


def _accepted_per_step(recs: list[dict]) -> float:
    return sum(r["accepted"] for r in recs) / len(recs)


@pytest.fixture(scope="module")
def runs() -> dict[str, tuple[list[list[int]], list[dict]]]:
    out = {m: _run(m) for m in ("d-only", "pd", "pd-broken")}
    out["no-context"] = _run("d-only", config=HarnessConfig(draft_context=False))
    return out


def test_modes_emit_the_same_tokens_and_differ_only_in_acceptance(runs) -> None:
    ref = runs["d-only"][0]
    assert all(outs == ref for outs, _ in runs.values())  # greedy verification is lossless
    d, pd, broken, blind = (_accepted_per_step(runs[m][1]) for m in ("d-only", "pd", "pd-broken", "no-context"))
    assert 1.0 < d < 2.5  # accept length (incl. bonus) about 2-3.5 at block 4
    assert abs(pd - d) < 0.1  # bf16 partial sums: a small divergence
    assert d - broken > 0.4  # a missing stage contribution: a clear drop
    assert d - blind > 0.15 and blind > broken  # the context is worth something; a wrong one is worse than none
    tokens = sum(len(o) for o in ref)
    steps = len(runs["d-only"][1])
    assert 2.0 < tokens / steps < 3.5


def test_pd_context_really_differs_from_d_only() -> None:
    feats = [torch.randn(1, 96, generator=torch.Generator().manual_seed(s)) for s in range(3)]
    exact = Harness(mode="d-only").context(feats)
    pd = Harness(mode="pd").context(feats)
    broken = Harness(mode="pd-broken").context(feats)

    def rel(x: torch.Tensor) -> float:
        return float((x - exact).norm() / exact.norm())

    assert 0 < rel(pd) < 0.02
    assert rel(broken) > 0.3


def test_records_follow_the_acceptance_schema(runs) -> None:
    outs, recs = runs["pd"]
    by_req: dict[str, list[dict]] = {}
    for r in recs:
        row = normalize_record(r, strict=True)
        assert row["accepted"] <= len(r["proposed"]) == 4
        assert len(r["target_tokens"]) == 5 and len(r["draft_logprobs"]) == 4
        assert all(lp <= 0 for lp in r["draft_logprobs"])
        # accepted drafts are a prefix equal to the target's argmax; the bonus is the target's next token
        acc = r["accepted"]
        assert r["proposed"][:acc] == r["target_tokens"][:acc]
        assert acc == 4 or r["proposed"][acc] != r["target_tokens"][acc]
        assert r["output_tokens"] == (r["proposed"][:acc] + [r["target_tokens"][acc]])[: len(r["output_tokens"])]
        by_req.setdefault(r["request_id"], []).append(r)
    for i, out in enumerate(outs):
        steps = by_req[f"r{i}"]
        assert [s["step"] for s in steps] == list(range(len(steps)))
        # first token from prefill, the rest from verify steps
        assert out[1:] == [t for s in steps for t in s["output_tokens"]]
        assert len({s["prompt_hash"] for s in steps}) == 1


def test_limits_stop_and_counters() -> None:
    h = Harness(seed=1, mode="d-only", block=6)
    out, recs = h.generate(list(b"abc"), 17, ignore_eos=True)
    assert len(out) == 17
    assert recs[-1]["bonus"] is (len(recs[-1]["output_tokens"]) == recs[-1]["accepted"] + 1)
    c = spec_counters(recs, len(out), 6)
    assert c.verify_ct == len(recs) and sum(c.histogram) == len(recs) and len(c.histogram) == 7
    assert c.meta_info()["spec_accept_length"] == pytest.approx(17 / len(recs))
    out2, _ = h.generate(list(b"abc"), 100, should_stop=lambda toks: len(toks) >= 9)
    assert len(out2) == 9 or (out2[-1] == EOS and len(out2) < 9)
    assert h.generate(list(b"abc"), 0) == ([], [])
    with pytest.raises(ValueError):
        Harness(mode="tp")
    with pytest.raises(ValueError):
        Harness(config=HarnessConfig(broken_stage=5))


def test_write_acceptance_part_reads_back(tmp_path: Path, runs) -> None:
    _, recs = runs["pd-broken"]
    path = write_acceptance_part(recs, tmp_path / "b", run_name="harness-pd-broken", labels={"mode": "pd-broken"})
    assert path.name == "acceptance.jsonl" and (path.parent / "part.json").is_file()
    assert json.loads((tmp_path / "b" / "manifest.json").read_text())["run"]["name"] == "harness-pd-broken"
    df = read_acceptance_bundle(tmp_path / "b", strict=True)
    assert len(df) == len(recs) and int(df["accepted"].sum()) == sum(r["accepted"] for r in recs)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu_tokens() -> None:  # pragma: no cover - CPU CI
    cpu, _ = Harness(mode="pd").generate(list(PROMPTS[0]), 64, ignore_eos=True)
    gpu, _ = Harness(mode="pd", device="cuda").generate(list(PROMPTS[0]), 64, ignore_eos=True)
    assert sum(a == b for a, b in zip(cpu, gpu)) >= 48  # float32 GEMMs may differ at near-ties


def test_server_contract_in_process(tmp_path: Path) -> None:
    import asyncio

    import httpx

    from validator.workloads.harness.generate_server import ServerSettings, create_app, question_of

    oracle = tmp_path / "oracle.jsonl"
    oracle.write_text(json.dumps({"question": "What is 2+2?", "answer": "2+2=4\n#### 4"}) + "\n")
    app = create_app(ServerSettings(mode="pd", oracle=oracle, acceptance_out=tmp_path / "rec"))
    assert question_of("Question: a\nAnswer: b\n\nQuestion: What is 2+2?\nAnswer:") == "What is 2+2?"
    q = "Question: What is 2+2?\nAnswer:"

    async def exchange() -> dict:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://h") as client:
            r = await client.post("/generate", json={"text": q, "sampling_params": {"temperature": 0,
                                                                                   "max_new_tokens": 64}})
            assert r.status_code == 200
            body = r.json()
            meta = body["meta_info"]
            assert body["text"] == "2+2=4\n#### 4" and meta["finish_reason"]["type"] == "stop"
            assert meta["completion_tokens"] == len(body["text"].encode())
            assert meta["spec_accept_length"] == pytest.approx(meta["completion_tokens"] / meta["spec_verify_ct"])
            assert sum(meta["spec_accept_histogram"]) == meta["spec_verify_ct"]
            assert meta["spec_num_proposed_drafts"] == 4 * meta["spec_verify_ct"]
            # the oracle answer cut by max_new_tokens
            r = await client.post("/generate", json={"text": q, "sampling_params": {"max_new_tokens": 5}})
            assert r.json()["text"] == "2+2=4"
            assert r.json()["meta_info"]["finish_reason"] == {"type": "length", "length": 5}
            # no oracle entry: the model's own bytes, up to max_new_tokens; a batch gives a list
            r = await client.post("/generate", json={"text": ["hello", "world"],
                                                     "sampling_params": {"max_new_tokens": 20, "ignore_eos": True}})
            assert [o["meta_info"]["completion_tokens"] for o in r.json()] == [20, 20]
            assert [o["meta_info"]["finish_reason"]["type"] for o in r.json()] == ["length", "length"]
            r = await client.post("/generate", json={"text": "x", "sampling_params": {"temperature": 0.7}})
            assert r.status_code == 400
            r = await client.post("/v1/completions", json={"model": "m", "prompt": q, "max_tokens": 64,
                                                           "temperature": 0, "stop": ["####"]})
            choice = r.json()["choices"][0]
            assert choice["text"] == "2+2=4\n" and choice["finish_reason"] == "stop"
            assert r.json()["usage"]["completion_tokens"] == len("2+2=4\n")
            return (await client.get("/stats")).json()

    stats = asyncio.run(exchange())
    assert stats["requests"] == 5 and stats["oracle_hits"] == 3
    assert sum(stats["spec_accept_histogram"]) == stats["spec_verify_ct"]
    app.state.engine.write_records()  # what the server does on shutdown
    df = read_acceptance_bundle(tmp_path / "rec", strict=True)
    assert len(df) == stats["spec_verify_ct"]


def test_oracle_file_problems_name_file_and_line(tmp_path: Path) -> None:
    from validator.workloads.harness.generate_server import load_oracle

    p = tmp_path / "oracle.jsonl"
    p.write_text('{"question": " Q1 ", "answer": "A1"}\n\n{"question": "Q2"}\n')
    with pytest.raises(InputError, match=r"oracle\.jsonl line 3: expected an object with 'question' and 'answer'$"):
        load_oracle(p)
    p.write_text('{"question": " Q1 ", "answer": "A1"}\noops\n')
    with pytest.raises(InputError, match=r"oracle\.jsonl line 2: not valid JSON \("):
        load_oracle(p)
    p.write_text('{"question": " Q1 ", "answer": "A1"}\n')
    assert load_oracle(p) == {"Q1": "A1"}
