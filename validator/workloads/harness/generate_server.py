"""Serve the reference harness over HTTP with SGLang's ``/generate`` contract and ``/v1/completions``.

    python -m validator.workloads.harness.generate_server --port 30000 [--mode pd] [--oracle test.jsonl]

The tokenizer is UTF-8 bytes (token = byte, plus EOS). Decoding is greedy only. Every response's
``meta_info`` carries the ``spec_*`` fields computed from the verify steps the harness actually ran, and
``GET /stats`` returns the server's running totals of the same counters, so a client's aggregate can be
checked against what the server did.

The harness cannot do arithmetic. With ``--oracle FILE`` (GSM8K JSONL), a prompt whose last
``Question: ...`` is in the file is answered with that question's reference answer text (cut at a stop
string and at ``max_new_tokens`` bytes), while the speculative loop still runs the model for exactly as
many tokens as the text has, so accuracy is meaningful and the acceptance counters are real (they count
model tokens, not the oracle's). Other prompts get the model's own bytes.

Fault injection for client tests (counted over generation requests, 1-based): ``--malformed-every N``
answers every N-th request with a body that is not JSON or JSON without ``text`` (alternately);
``--slow-every N`` sleeps ``--slow-seconds`` before answering every N-th request.
"""

from __future__ import annotations

import argparse
import itertools
import json
import threading
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from validator.errors import InputError
from validator.runs.jsonlines import json_lines
from validator.workloads.harness.model import EOS, Harness, HarnessConfig, spec_counters, write_acceptance_part

__all__ = ["HarnessEngine", "ServerSettings", "create_app", "main", "question_of"]

_QUESTION = "Question:"
_ANSWER = "Answer:"


@dataclass(frozen=True)
class ServerSettings:
    mode: str = "d-only"
    block: int = 4
    seed: int = 0
    device: str = "cpu"
    oracle: Path | None = None
    malformed_every: int = 0
    slow_every: int = 0
    slow_seconds: float = 5.0
    acceptance_out: Path | None = None  # write every request's verify steps here as a bundle on shutdown
    model_name: str = "validator-harness"
    broken_stage: int = -1


def question_of(prompt: str) -> str | None:
    """The text of the last ``Question: ...`` in a few-shot prompt ending in ``Answer:``, stripped."""
    at = prompt.rfind(_QUESTION)
    if at < 0:
        return None
    q = prompt[at + len(_QUESTION):].rstrip()
    q = q.removesuffix(_ANSWER)
    return q.strip()


def load_oracle(path: Path) -> dict[str, str]:
    """The reference answer of each question of a GSM8K JSONL file (``question``, ``answer`` per line)."""
    out = {}
    with open(path, encoding="utf-8") as f:
        for n, row in json_lines(path, f):
            if not isinstance(row, dict) or "question" not in row or "answer" not in row:
                raise InputError(f"{path} line {n}: expected an object with 'question' and 'answer'")
            out[str(row["question"]).strip()] = str(row["answer"])
    return out


def _cut_at_stop(text: str, stops: Sequence[str]) -> tuple[str, str | None]:
    hits = [(text.find(s), s) for s in stops if s and s in text]
    if not hits:
        return text, None
    at, s = min(hits)
    return text[:at], s


class HarnessEngine:
    """One harness behind a lock, its fault schedule and its counters."""

    def __init__(self, settings: ServerSettings) -> None:
        self.settings = settings
        cfg = HarnessConfig(broken_stage=settings.broken_stage)
        self.harness = Harness(settings.seed, settings.mode, settings.block, settings.device, cfg)
        self.oracle = load_oracle(settings.oracle) if settings.oracle else {}
        self._lock = threading.Lock()
        self._count = itertools.count(1)
        self.records: list[dict[str, Any]] = []
        self.totals: dict[str, Any] = {
            "requests": 0, "prompt_tokens": 0, "completion_tokens": 0, "spec_verify_ct": 0,
            "spec_num_correct_drafts": 0, "spec_num_proposed_drafts": 0,
            "spec_accept_histogram": [0] * (settings.block + 1),
            "oracle_hits": 0, "faults": {"malformed": 0, "slow": 0},
        }

    def next_fault(self) -> str | None:
        n = next(self._count)
        s = self.settings
        with self._lock:
            if s.malformed_every and n % s.malformed_every == 0:
                self.totals["faults"]["malformed"] += 1
                return "malformed-json" if (n // s.malformed_every) % 2 else "malformed-fields"
            if s.slow_every and n % s.slow_every == 0:
                self.totals["faults"]["slow"] += 1
                return "slow"
        return None

    def complete(self, prompt: str, max_new_tokens: int, stops: Sequence[str], rid: str,
                 ignore_eos: bool = False) -> dict[str, Any]:
        """Run one request; returns ``text`` and SGLang-style ``meta_info``."""
        prompt_ids = list(prompt.encode("utf-8"))
        q = question_of(prompt)
        answer = self.oracle.get(q) if q is not None else None
        with self._lock:
            if answer is not None:
                text, matched = _cut_at_stop(answer, stops)
                data = text.encode("utf-8")
                n = min(len(data), max_new_tokens)
                tokens, records = self.harness.generate(prompt_ids, n, request_id=rid, ignore_eos=True)
                if len(data) > max_new_tokens:
                    text = data[:max_new_tokens].decode("utf-8", errors="ignore")
                    finish: dict[str, Any] = {"type": "length", "length": max_new_tokens}
                else:
                    finish = {"type": "stop", "matched": matched if matched is not None else EOS}
            else:
                stop_bytes = [s.encode("utf-8") for s in stops if s]

                def should_stop(out: list[int]) -> bool:
                    tail = bytes(t for t in out[-64:] if t < 256)
                    return any(tail.endswith(b) for b in stop_bytes)

                tokens, records = self.harness.generate(
                    prompt_ids, max_new_tokens, request_id=rid, ignore_eos=ignore_eos, should_stop=should_stop
                )
                raw = bytes(t for t in tokens if t < 256).decode("utf-8", errors="replace")
                text, matched = _cut_at_stop(raw, stops)
                if matched is not None:
                    finish = {"type": "stop", "matched": matched}
                elif tokens and tokens[-1] == EOS and not ignore_eos:
                    finish = {"type": "stop", "matched": EOS}
                else:
                    finish = {"type": "length", "length": max_new_tokens}
            c = spec_counters(records, len(tokens), self.settings.block)
            t = self.totals
            t["requests"] += 1
            t["oracle_hits"] += answer is not None
            t["prompt_tokens"] += len(prompt_ids)
            t["completion_tokens"] += c.completion_tokens
            t["spec_verify_ct"] += c.verify_ct
            t["spec_num_correct_drafts"] += c.correct_drafts
            t["spec_num_proposed_drafts"] += c.proposed_drafts
            t["spec_accept_histogram"] = [a + b for a, b in zip(t["spec_accept_histogram"], c.histogram)]
            if self.settings.acceptance_out is not None:
                self.records.extend(records)
        meta = {"id": rid, "prompt_tokens": len(prompt_ids), "completion_tokens": c.completion_tokens,
                "finish_reason": finish, **c.meta_info()}
        return {"text": text, "meta_info": meta}

    def stats(self) -> dict[str, Any]:
        with self._lock:
            out: dict[str, Any] = json.loads(json.dumps(self.totals))
        out["harness"] = self.harness.describe()
        out["oracle_questions"] = len(self.oracle)
        return out

    def write_records(self) -> Path | None:
        out = self.settings.acceptance_out
        if out is None:
            return None
        labels = {"workload": "harness", "mode": self.settings.mode, "block": str(self.settings.block),
                  "seed": str(self.settings.seed)}
        return write_acceptance_part(self.records, out, run_name=out.name, labels=labels,
                                     extra={"harness": self.harness.describe()})


def _stops(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        return value
    raise ValueError("stop must be a string or a list of strings")


def _greedy(temperature: Any) -> None:
    if temperature is not None and float(temperature) != 0.0:
        raise ValueError("the harness decodes greedily only: temperature must be 0")


def create_app(settings: ServerSettings) -> Any:
    from fastapi import FastAPI, HTTPException
    from fastapi.responses import JSONResponse, Response

    engine = HarnessEngine(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        engine.write_records()

    app = FastAPI(title="validator harness", lifespan=lifespan)
    app.state.engine = engine
    rid_counter = itertools.count()

    def faulty(kind: str | None) -> Response | None:
        if kind == "slow":
            time.sleep(settings.slow_seconds)
        elif kind == "malformed-json":
            return Response(content=b'{"text": "unterminated', media_type="application/json")
        elif kind == "malformed-fields":
            return JSONResponse({"meta_info": {"completion_tokens": "many"}})
        return None

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/stats")
    def stats() -> dict[str, Any]:
        return engine.stats()

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": settings.model_name, "object": "model"}]}

    @app.post("/generate", response_model=None)
    def generate(body: dict[str, Any]) -> Any:
        bad = faulty(engine.next_fault())
        if bad is not None:
            return bad
        sp = body.get("sampling_params") or {}
        try:
            _greedy(sp.get("temperature"))
            stops = _stops(sp.get("stop"))
            max_new = int(sp.get("max_new_tokens", 128))
        except (TypeError, ValueError) as exc:
            raise HTTPException(400, str(exc)) from None
        texts = body.get("text")
        single = isinstance(texts, str)
        if single:
            texts = [texts]
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
            raise HTTPException(400, "'text' must be a string or a non-empty list of strings")
        rid = str(body.get("rid") or f"harness-{next(rid_counter)}")
        outs = [engine.complete(t, max_new, stops, rid if single else f"{rid}-{i}", bool(sp.get("ignore_eos")))
                for i, t in enumerate(texts)]
        return outs[0] if single else outs

    @app.post("/v1/completions", response_model=None)
    def completions(body: dict[str, Any]) -> Any:
        bad = faulty(engine.next_fault())
        if bad is not None:
            return bad
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise HTTPException(400, "'prompt' must be a string")
        try:
            _greedy(body.get("temperature"))
            stops = _stops(body.get("stop"))
            max_new = int(body.get("max_tokens") or 16)
        except (TypeError, ValueError) as exc:
            raise HTTPException(400, str(exc)) from None
        rid = f"cmpl-{next(rid_counter)}"
        out = engine.complete(prompt, max_new, stops, rid)
        meta = out["meta_info"]
        return {
            "id": rid, "object": "text_completion", "created": int(time.time()), "model": settings.model_name,
            "choices": [{"index": 0, "text": out["text"], "logprobs": None,
                         "finish_reason": meta["finish_reason"]["type"]}],
            "usage": {"prompt_tokens": meta["prompt_tokens"], "completion_tokens": meta["completion_tokens"],
                      "total_tokens": meta["prompt_tokens"] + meta["completion_tokens"]},
        }

    return app


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m validator.workloads.harness.generate_server", description=__doc__.split("\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--mode", choices=("d-only", "pd", "pd-broken"), default="d-only")
    p.add_argument("--block", type=int, default=4, help="draft tokens per verify step (default %(default)s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    p.add_argument("--broken-stage", type=int, default=-1, help="pd-broken: the stage that goes missing (-1: last)")
    p.add_argument("--oracle", type=Path, help="GSM8K JSONL: answer its questions with the reference answer text")
    p.add_argument("--malformed-every", type=int, default=0, metavar="N")
    p.add_argument("--slow-every", type=int, default=0, metavar="N")
    p.add_argument("--slow-seconds", type=float, default=5.0)
    p.add_argument("--acceptance-out", type=Path, help="on shutdown, write every verify step as a run bundle here")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default %(default)s)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    import torch
    import uvicorn

    torch.set_num_threads(args.threads)
    settings = ServerSettings(
        mode=args.mode, block=args.block, seed=args.seed, device=args.device, oracle=args.oracle,
        malformed_every=args.malformed_every, slow_every=args.slow_every, slow_seconds=args.slow_seconds,
        acceptance_out=args.acceptance_out, broken_stage=args.broken_stage,
    )
    uvicorn.run(create_app(settings), host=args.host, port=args.port, log_level="warning", timeout_graceful_shutdown=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
