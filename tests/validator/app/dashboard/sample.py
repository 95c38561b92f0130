"""A small store for the dashboard tests and screenshots: a toy model captured at TP2 and TP4.

- ``ref``: the reference (TP2); ``rerun``: the same at small noise (the noise floor pair is ref vs rerun);
- ``drift``: TP4 whose error grows from layer 3 on, in later tokens and in head 5 (fails vs the floor);
- ``ok``: TP4 at floor-level noise (passes);
- ``xss``: a run whose name and labels hold HTML and script.

ref, rerun, drift and ok carry acceptance records; drift's later draft positions are accepted less often.
ref and drift also carry GSM8K results on 12 questions: drift loses two and gains one (one of its outputs
holds a script tag).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from probes import BundleWriter, ShardSpec
from probes.core.bundle import write_json_atomic
from tests.paths import DATA
from tests.validator.judging.acceptance_factories import make_records
from validator.judging.gsm8k_scoring import question_hash, reference_number, score_output
from validator.runs.acceptance_records import write_acceptance_jsonl
from validator.service import Service
from validator.settings import Settings
from validator.workloads.gsm8k import load_questions

LAYERS = 6
TOKENS, HIDDEN, HEADS, HEAD_DIM = 48, 64, 8, 16
XSS = "<script>window.__xss = 1</script><b>bold</b>"
RATES_REF = [0.86, 0.74, 0.63, 0.52, 0.42]
RATES_DRIFT = [0.85, 0.71, 0.57, 0.44, 0.33]
GSM8K_DATA = DATA / "gsm8k" / "test.jsonl"
GSM8K_WRONG = {"ref": {7}, "drift": {2, 5}}  # question indices answered wrongly


def gsm8k_rows(role: str, *, script: bool = True) -> list[dict[str, object]]:
    """Probe rows (validator.workloads.gsm8k's format) for 12 questions; the wrong ones answer reference + 1
    (``script``: drift's wrong outputs start with a script tag)."""
    rows = []
    for i, q in enumerate(load_questions(GSM8K_DATA, 12)):
        ref = reference_number(q["answer"])
        wrong = i in GSM8K_WRONG[role]
        output = q["answer"].rsplit("####", 1)[0] + f"#### {int(ref) + 1 if wrong else ref}"
        if wrong and role == "drift" and script:
            output = "<script>window.__xss = 2</script> " + output
        answers, correct = score_output(output, q["answer"])
        rows.append({"index": i, "question_hash": question_hash(q["question"]), "question": q["question"],
                     "reference": ref, "in_shots": False, "ok": True, "output": output, "finish_reason": "stop",
                     "completion_tokens": 60, "prompt_tokens": 700, "latency_s": 0.8,
                     "spec": {"spec_verify_ct": 20, "spec_num_correct_drafts": 40, "spec_num_proposed_drafts": 80},
                     "http_status": 200, "error_kind": None, "error": None, "answers": answers, "correct": correct})
    return rows


def _reference() -> dict[tuple[str, int | None], torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    out: dict[tuple[str, int | None], torch.Tensor] = {}
    for layer in range(LAYERS):
        out["hidden", layer] = torch.randn(TOKENS, HIDDEN, generator=g)
        out["attn.q", layer] = torch.randn(TOKENS, HEADS, HEAD_DIM, generator=g)
        out["attn.k", layer] = torch.randn(TOKENS, HEADS, HEAD_DIM, generator=g)
        out["mlp.out", layer] = torch.randn(TOKENS, HIDDEN, generator=g)
    out["final.norm", None] = torch.randn(TOKENS, HIDDEN, generator=g)
    return out


def _noise_scale(name: str, layer: int | None, shape: torch.Size, base: float, drift: bool) -> torch.Tensor:
    """Relative noise per element: ``base`` everywhere; with ``drift``, growing from layer 3 on, in the
    second half of the tokens and (for per-head tensors) in head 5."""
    scale = torch.full(shape, base)
    depth = LAYERS if layer is None else layer
    if drift and depth >= 3:
        grow = base * 4.0 * (depth - 2)
        scale[TOKENS // 2 :] += grow
        if len(shape) == 3:
            scale[:, 5] += grow
    return scale


def write_model_bundle(root: Path, name: str, *, tp: int, noise: float, drift: bool = False, seed: int = 1,
                       labels: dict[str, str] | None = None, acceptance: list[float] | None = None,
                       gsm8k: list[dict[str, object]] | None = None) -> Path:
    """One part per TP rank: per-head tensors split by head, the rest replicated (mlp.out as partial sums)."""
    path = root / name
    g = torch.Generator().manual_seed(seed)
    ref = _reference()
    noisy = {}
    for (tname, layer), t in ref.items():
        eps = torch.randn(t.shape, generator=g) * _noise_scale(tname, layer, t.shape, noise, drift)
        noisy[tname, layer] = t + t.abs().mean() * eps
    for r in range(tp):
        with BundleWriter(path, run_name=name, part=f"tp{r}", labels=labels or {}) as w:
            for (tname, layer), t in noisy.items():
                coords = {"step": 0, "tokens": (0, TOKENS), "tp_rank": r, "tp_size": tp}
                if layer is not None:
                    coords["layer"] = layer
                if t.dim() == 3:
                    per = HEADS // tp
                    w.add(tname, t[:, r * per : (r + 1) * per].contiguous(), shard=ShardSpec.split(1, r, tp), **coords)
                elif tname == "mlp.out":
                    w.add(tname, t / tp, shard=ShardSpec.partial(r, tp), **coords)
                else:
                    w.add(tname, t, shard=ShardSpec.replicated(r, tp), **coords)
    if acceptance is not None:
        part = path / "parts" / "acceptance"
        part.mkdir(parents=True)
        write_acceptance_jsonl(make_records(1500, acceptance, seed=seed, output_tokens=True), part / "acceptance.jsonl")
    if gsm8k is not None:
        part = path / "parts" / "gsm8k"
        part.mkdir(parents=True)
        (part / "gsm8k.jsonl").write_text("".join(json.dumps(r) + "\n" for r in gsm8k), encoding="utf-8")
        write_json_atomic(part / "part.json", {"part": "gsm8k", "tensors": []})
    return path


def build_store(home: Path, work: Path, *, xss: bool = True) -> dict[str, str]:
    """Ingest the sample runs into the store at ``home``; returns role -> run name (``xss``: include the run
    with HTML in its name and labels, and script tags in drift's GSM8K outputs)."""
    common = {"model": "toy-llm-6l", "draft": "dflash-2l"}
    specs = {
        "ref": dict(tp=2, noise=0.0, seed=1, acceptance=RATES_REF, gsm8k=gsm8k_rows("ref"),
                    labels={**common, "topology": "D:TP2", "engine_commit": "a1b2c3d"}),
        "rerun": dict(tp=2, noise=2e-4, seed=2, acceptance=RATES_REF,
                      labels={**common, "topology": "D:TP2", "engine_commit": "a1b2c3d", "rerun": "1"}),
        "drift": dict(tp=4, noise=2e-4, seed=3, drift=True, acceptance=RATES_DRIFT, gsm8k=gsm8k_rows("drift", script=xss),
                      labels={**common, "topology": "P:TP4/PP2 D:TP4", "engine_commit": "e4f5a6b"}),
        "ok": dict(tp=4, noise=2e-4, seed=4, acceptance=RATES_REF,
                   labels={**common, "topology": "P:TP4/PP2 D:TP4", "engine_commit": "c7d8e9f"}),
        "xss": dict(tp=1, noise=0.0, seed=5, labels={"model": XSS, "note": XSS}),
    }
    names = {"ref": "toy-d-tp2", "rerun": "toy-d-tp2-rerun", "drift": "toy-pd-tp4-e4f5a6b", "ok": "toy-pd-tp4-c7d8e9f",
             "xss": "xss-<i>run<b>"}
    svc = Service(Settings(home=home))
    try:
        for role, spec in specs.items():
            if role == "xss" and not xss:
                continue
            bundle = write_model_bundle(work, role, **spec)  # type: ignore[arg-type]
            svc.ingest(bundle, name=names[role])
    finally:
        svc.close()
    return names
