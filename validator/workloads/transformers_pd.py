"""`validator probe transformers`: a Hugging Face causal LM (and a draft) run D-only or PD, captured.

Modes (greedy, one request at a time, ``generate(assistant_model=draft)`` for the decode):

- ``d-only``: one process prefills the prompt (target and draft), then decodes from those caches.
- ``pd``: a *prefill* process (P) prefills and writes the hand-off as safetensors, one file per P rank
  (TP ``--tp-prefill``, the KV heads split by rank): the target's KV cache, the draft's KV cache (its
  context state) and the first output token. A second *decode* process (D) reads it as TP
  ``--tp-decode`` ranks would (each D rank takes its KV heads from the P rank that holds them,
  :mod:`probes.engines.sglang.heads`), rebuilds both caches and decodes.
- ``pd-broken``: as ``pd``, but D misplaces part of the hand-off (``--break head``: two D ranks swap
  their head slices of target layer 1; ``--break layer``: target layer 1 gets layer 2's cache).

Captured into the bundle ``--out`` (:mod:`probes.engines.transformers`): per step the target's and draft's layer,
attention, MLP, final-norm and logits tensors; the KV caches at step 0 as D holds them (``target.k``,
``target.v``, ``draft.k``, ``draft.v``; in PD as ``split(dim=1)`` shards of the D ranks); acceptance
(``acceptance.jsonl``) per verify step. Parts: ``donly``; or ``prefill`` and ``decode``.
``validator compare DONLY PD`` then pairs the tensors by name and coordinates and the acceptance by
request and position.
"""

from __future__ import annotations

import argparse
import json
import os
import stat
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from validator.errors import InputError
from validator.runs.jsonlines import json_lines
from validator.workloads.transformers_models import EOS, ByteTokenizer, check_size, load_model, read_config

__all__ = ["MODES", "PDConfig", "add_arguments", "load_prompts", "run", "run_from_args"]

MODES = ("d-only", "pd", "pd-broken")
BREAKS = ("head", "layer")
BROKEN_LAYER = 1
_REPO = Path(__file__).resolve().parents[2]
DEFAULT_MODEL = _REPO / "examples" / "models" / "gsm8k-llama-tiny"
DEFAULT_PROMPTS = _REPO / "tests" / "data" / "gsm8k" / "test.jsonl"
MAX_PROMPTS_BYTES = 64 << 20  # a prompts file larger than this is refused (GSM8K's test split is 0.7 MB)


@dataclass
class PDConfig:
    model: str
    draft: str | None = None
    mode: str = "d-only"
    prompts: str = str(DEFAULT_PROMPTS)
    out: str = "hf-run"
    limit: int = 16
    max_new_tokens: int = 64
    block: int = 4
    capture: str = "full"  # full | summary | off
    names: tuple[str, ...] = ()
    budget: str = "1GiB"
    device: str = "cpu"
    dtype: str = "float32"
    tp_prefill: int = 4
    tp_decode: int = 8
    break_kind: str = "head"
    seed: int = 0
    run_name: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    threads: int = 0

    def check(self) -> None:
        if self.mode not in MODES:
            raise InputError(f"--mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.capture not in ("full", "summary", "off"):
            raise InputError(f"--capture must be full, summary or off, got {self.capture!r}")
        if self.break_kind not in BREAKS:
            raise InputError(f"--break must be one of {', '.join(BREAKS)}, got {self.break_kind!r}")
        for name in ("limit", "max_new_tokens", "block", "tp_prefill", "tp_decode"):
            if getattr(self, name) < 1:
                raise InputError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")


# -- prompts -----------------------------------------------------------------------------------------


def load_prompts(path: str | os.PathLike[str], limit: int | None = None) -> list[tuple[str, str]]:
    """``(request id, prompt text)``: GSM8K JSONL (``question`` -> ``Question: q\\nAnswer:``) or JSONL with
    ``prompt`` (and optional ``id``) per line."""
    p = Path(path)
    try:
        st = p.stat()
        if not stat.S_ISREG(st.st_mode):  # a device (/dev/zero), a pipe: no end, or no size to check
            raise InputError(f"{path}: the prompts must be a regular file (JSONL), not a device, pipe or folder")
        if st.st_size > MAX_PROMPTS_BYTES:
            raise InputError(f"{path}: {st.st_size:,} bytes of prompts; at most {MAX_PROMPTS_BYTES:,} are read")
        with p.open("rb") as f:
            raw = f.read(MAX_PROMPTS_BYTES + 1)  # bounded even if the file grows meanwhile
        if len(raw) > MAX_PROMPTS_BYTES:
            raise InputError(f"{path}: more than {MAX_PROMPTS_BYTES:,} bytes of prompts")
        lines = raw.decode("utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read the prompts: {getattr(exc, 'strerror', None) or exc}") from None
    out: list[tuple[str, str]] = []
    for n, obj in json_lines(path, lines, limit):
        if isinstance(obj, dict) and isinstance(obj.get("prompt"), str):
            out.append((str(obj.get("id", f"q{len(out):03d}")), obj["prompt"]))
        elif isinstance(obj, dict) and isinstance(obj.get("question"), str):
            out.append((str(obj.get("id", f"q{len(out):03d}")), f"Question: {obj['question']}\nAnswer:"))
        else:
            raise InputError(f"{path} line {n}: expected an object with a string 'question' or 'prompt'")
    if not out:
        raise InputError(f"{path}: no prompts")
    return out


# -- models, sessions --------------------------------------------------------------------------------


def _model_paths(cfg: PDConfig) -> tuple[str, str | None]:
    m = Path(cfg.model)
    if cfg.draft is None and m.is_dir() and (m / "target").is_dir():
        return str(m / "target"), str(m / "draft") if (m / "draft").is_dir() else None
    return cfg.model, cfg.draft


def check_fit(cfg: PDConfig, prompts: Sequence[tuple[str, str]]) -> None:
    """Before any model is allocated: each model's sizes fit the device (``transformers_models.check_size``, naming the
    field), and every prompt with ``max_new_tokens`` fits the models' context (``max_position_embeddings``)."""
    context = None
    for path in _model_paths(cfg):
        if path is not None:
            conf = read_config(path)
            check_size(conf, where=str(path), dtype=cfg.dtype, device=cfg.device)
            ctx = getattr(conf, "max_position_embeddings", None)
            if isinstance(ctx, int) and not isinstance(ctx, bool):
                context = ctx if context is None else min(context, ctx)
    if context is None:
        return
    tok = ByteTokenizer()
    for rid, text in prompts:
        n = len(tok.encode(text))
        if n + cfg.max_new_tokens > context:
            raise InputError(
                f"{cfg.prompts}: prompt {rid!r} is {n:,} tokens; with --max-new-tokens {cfg.max_new_tokens} that passes "
                f"the model's context of {context:,} tokens (max_position_embeddings): shorten it or lower --max-new-tokens"
            )


def _models(cfg: PDConfig) -> tuple[Any, Any]:
    import torch

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    tpath, dpath = _model_paths(cfg)
    target = load_model(tpath, seed=cfg.seed, dtype=cfg.dtype, device=cfg.device)
    draft = load_model(dpath, seed=cfg.seed + 1, dtype=cfg.dtype, device=cfg.device) if dpath else None
    if draft is not None:
        if draft.config.vocab_size != target.config.vocab_size:
            raise InputError(f"{dpath}: the draft's vocabulary ({draft.config.vocab_size}) differs from the "
                             f"target's ({target.config.vocab_size})")
        gc = draft.generation_config
        gc.num_assistant_tokens = cfg.block
        gc.num_assistant_tokens_schedule = "constant"
        gc.assistant_confidence_threshold = 0.0
    return target, draft


def _session(cfg: PDConfig, part: str) -> Any:
    from probes.core.capture import ProbeSession
    from probes.core.config import ProbeConfig, ProbeConfigError, parse_bytes

    try:
        budget = parse_bytes(cfg.budget)
    except ProbeConfigError as exc:
        raise InputError(f"--budget: {exc}") from None
    if cfg.capture == "off":
        return ProbeSession(ProbeConfig(enabled=False))
    labels = {"engine": "transformers", "mode": cfg.mode, **cfg.labels}
    pc = ProbeConfig(bundle=cfg.out, run_name=cfg.run_name or f"hf-{cfg.mode}", part=part,
                     mode="summary" if cfg.capture == "summary" else "full",
                     labels=labels, names=tuple(cfg.names) or None, budget_bytes=budget,
                     defer_summaries=True)  # module outputs: torch sees any in-place write to them
    return ProbeSession(pc)


def _recorder(cfg: PDConfig, part: str) -> Any:
    from probes.core.acceptance import AcceptanceRecorder

    return AcceptanceRecorder(cfg.out, part, run_name=cfg.run_name or f"hf-{cfg.mode}",
                              labels={"engine": "transformers", "mode": cfg.mode, **cfg.labels})


def _new_cache(model: Any) -> Any:
    import importlib

    cache_cls = importlib.import_module("transformers").DynamicCache
    try:
        return cache_cls(config=model.config)
    except TypeError:
        return cache_cls()


def _cache_kw(model: Any) -> str:
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


# -- the two halves ----------------------------------------------------------------------------------


def prefill(target: Any, draft: Any, ids: Any, caps: Sequence[Any]) -> tuple[int, Any, Any]:
    """Target and draft forwards over the prompt (step 0): the first output token and both caches.
    ``caps``: the target's and the draft's ``ModelCapture`` (the draft's forward is pinned to step 0)."""
    import torch

    cd = caps[1] if len(caps) > 1 else None
    with torch.no_grad():
        tcache = _new_cache(target)
        out = target(input_ids=ids, use_cache=True, **{_cache_kw(target): tcache})
        first = int(out.logits[0, -1].argmax())
        dcache = None
        if draft is not None:
            dcache = _new_cache(draft)
            if cd is not None:
                with cd.at_step(0):
                    draft(input_ids=ids, use_cache=True, **{_cache_kw(draft): dcache})
            else:
                draft(input_ids=ids, use_cache=True, **{_cache_kw(draft): dcache})
    return first, tcache, dcache


def decode(target: Any, draft: Any, ids: Any, first: int, tkv: Any, dkv: Any, *, max_new_tokens: int,
           acceptance: Any, injector: Any) -> list[int]:
    """Continue from the prefill state: ``generate`` over prompt + first token, the target's cache given,
    the draft's cache handed to its first forward by ``injector``. Returns the output tokens."""
    import torch

    from probes.engines.transformers import cache_kv

    full = torch.cat([ids, torch.tensor([[first]], device=ids.device)], dim=1)
    if max_new_tokens <= 1 or first == EOS:
        return [first]
    tcache = _new_cache(target)
    for i, (k, v) in enumerate(tkv if isinstance(tkv, list) else cache_kv(tkv)):
        tcache.update(k, v, i)
    kw: dict[str, Any] = {_cache_kw(target): tcache}
    if draft is not None:
        injector.arm(dkv if isinstance(dkv, list) else cache_kv(dkv))
        kw["assistant_model"] = draft
        kw["logits_processor"] = [acceptance.processor]
    with torch.no_grad():
        g = target.generate(full, attention_mask=torch.ones_like(full), max_new_tokens=max_new_tokens - 1,
                            do_sample=False, eos_token_id=EOS, pad_token_id=EOS, **kw)
    return [first] + [int(x) for x in g[0, full.shape[1]:].tolist()]


# -- hand-off files ------------------------------------------------------------------------------------


def _handoff_name(rid: str, rank: int) -> str:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in rid)
    return f"{safe}.p{rank}.safetensors"


def write_handoff(folder: Path, rid: str, ids: list[int], first: int, tkv: Any, dkv: Any, tp: int) -> None:
    """One safetensors file per P rank: that rank's KV heads of every layer, target and draft."""
    from safetensors.torch import save_file

    from probes.engines.sglang.heads import rank_heads
    from probes.engines.transformers import cache_kv

    folder.mkdir(parents=True, exist_ok=True)
    kinds = [("target", cache_kv(tkv))] + ([("draft", cache_kv(dkv))] if dkv is not None else [])
    heads = int(kinds[0][1][0][0].shape[1])
    for r in range(tp):
        hs = rank_heads(r, tp, heads)
        tensors = {}
        for role, kv in kinds:
            for i, (k, v) in enumerate(kv):
                tensors[f"{role}.k.{i}"] = k[:, hs.start:hs.stop].contiguous().cpu()
                tensors[f"{role}.v.{i}"] = v[:, hs.start:hs.stop].contiguous().cpu()
        meta = {"request": rid, "prompt": json.dumps(ids), "first_token": str(first), "tp_rank": str(r),
                "tp_size": str(tp), "kv_heads": str(heads)}
        save_file(tensors, str(folder / _handoff_name(rid, r)), metadata=meta)


def read_handoff(folder: Path, rid: str, tp_p: int, tp_d: int, broken: str | None, device: str
                 ) -> tuple[list[int], int, dict[str, list[list[tuple[Any, Any]]]]]:
    """Read the P ranks' files as the D ranks would: per role, per D rank, per layer ``(k, v)`` with that
    rank's heads. ``broken`` misplaces part of it (see the module doc)."""
    import torch
    from safetensors import safe_open

    from probes.engines.sglang.heads import head_ranks, rank_heads

    files = []
    for r in range(tp_p):
        path = folder / _handoff_name(rid, r)
        if not path.is_file():
            raise InputError(f"{path}: hand-off file of P rank {r} is missing")
        with safe_open(str(path), "pt", device="cpu") as f:
            files.append(({k: f.get_tensor(k) for k in f.keys()}, f.metadata() or {}))
    meta = files[0][1]
    ids, first, heads = json.loads(meta["prompt"]), int(meta["first_token"]), int(meta["kv_heads"])
    out: dict[str, list[list[tuple[Any, Any]]]] = {}
    for role in ("target", "draft"):
        n_layers = sum(1 for k in files[0][0] if k.startswith(f"{role}.k."))
        if not n_layers:
            continue
        per_rank = []
        for q in range(tp_d):
            layers = []
            for i in range(n_layers):
                src_layer = i
                if broken == "layer" and role == "target" and i == BROKEN_LAYER:
                    src_layer = BROKEN_LAYER + 1
                ks, vs = [], []
                for h in rank_heads(q, tp_d, heads):
                    hh = h
                    if broken == "head" and role == "target" and i == BROKEN_LAYER and h in (2, 3):
                        hh = 5 - h  # D ranks 2 and 3 (TP8) swap their head slices of this layer
                    src = head_ranks(hh, tp_p, heads)[0]
                    local = hh - rank_heads(src, tp_p, heads).start
                    t = files[src][0]
                    ks.append(t[f"{role}.k.{src_layer}"][:, local:local + 1])
                    vs.append(t[f"{role}.v.{src_layer}"][:, local:local + 1])
                layers.append((torch.cat(ks, 1).to(device), torch.cat(vs, 1).to(device)))
            per_rank.append(layers)
        out[role] = per_rank
    return ids, first, out


def _gather(per_rank: list[list[tuple[Any, Any]]]) -> list[tuple[Any, Any]]:
    import torch

    return [(torch.cat([r[i][0] for r in per_rank], 1), torch.cat([r[i][1] for r in per_rank], 1))
            for i in range(len(per_rank[0]))]


# -- the processes -----------------------------------------------------------------------------------


def _captures(cfg: PDConfig, target: Any, draft: Any, session: Any) -> list[Any]:
    from probes.engines.transformers import ModelCapture

    caps = [ModelCapture(target, session, role="target").attach()]
    if draft is not None:
        caps.append(ModelCapture(draft, session, role="draft", step_from=caps[0]).attach())
    return caps


def _process(cfg: PDConfig, role: str, handoff: Path | None) -> dict[str, Any]:
    """``role``: ``donly`` (prefill + decode), ``prefill`` (P) or ``decode`` (D)."""
    import torch

    from probes.engines.transformers import AssistedAcceptance, HandoffInjector, capture_kv

    torch.manual_seed(cfg.seed)
    target, draft = _models(cfg)
    prompts = load_prompts(cfg.prompts, cfg.limit)
    tok = ByteTokenizer()
    session = _session(cfg, role)
    caps = _captures(cfg, target, draft, session)
    rec = _recorder(cfg, role) if draft is not None and role != "prefill" and cfg.capture != "off" else None
    acc = AssistedAcceptance(rec, target, draft) if draft is not None else None
    inj = HandoffInjector(draft) if draft is not None else None
    outputs: dict[str, list[int]] = {}
    t0 = time.perf_counter()
    broken = cfg.break_kind if cfg.mode == "pd-broken" else None
    try:
        for rid, text in prompts:
            for c in caps:
                c.begin_request(rid)
            if role in ("donly", "prefill"):
                ids = torch.tensor([tok.encode(text)], device=cfg.device)
                if acc is not None:
                    acc.begin_request(rid)
                first, tkv, dkv = prefill(target, draft, ids, caps)
                if role == "prefill":
                    assert handoff is not None
                    write_handoff(handoff, rid, ids[0].tolist(), first, tkv, dkv, cfg.tp_prefill)
                    outputs[rid] = [first]
                    continue
                capture_kv(session, _kv(tkv), role="target", step=0, request=rid)
                if dkv is not None:
                    capture_kv(session, _kv(dkv), role="draft", step=0, request=rid)
                tkv_l, dkv_l = _kv(tkv), _kv(dkv) if dkv is not None else None
            else:
                assert handoff is not None
                plist, first, ranks = read_handoff(handoff, rid, cfg.tp_prefill, cfg.tp_decode, broken, cfg.device)
                ids = torch.tensor([plist], device=cfg.device)
                for role_name, per_rank in ranks.items():
                    for q, layers in enumerate(per_rank):
                        capture_kv(session, layers, role=role_name, step=0, request=rid, tp=(q, cfg.tp_decode))
                tkv_l = _gather(ranks["target"])
                dkv_l = _gather(ranks["draft"]) if "draft" in ranks else None
            for c in caps:
                c.begin_request(rid, last_step=0)
            if acc is not None:
                acc.begin_request(rid, last_step=0)
            outputs[rid] = decode(target, draft, ids, first, tkv_l, dkv_l, max_new_tokens=cfg.max_new_tokens,
                                  acceptance=acc, injector=inj)
            if acc is not None:
                acc.end_request()
    finally:
        for c in caps:
            c.detach()
        if acc is not None:
            acc.remove()
        if inj is not None:
            inj.remove()
        if rec is not None:
            rec.close()
        if session.enabled:
            session.close()
    seconds = time.perf_counter() - t0
    summary: dict[str, Any] = {"role": role, "requests": len(prompts), "seconds": round(seconds, 2),
                               "outputs": outputs}
    if acc is not None:
        recs = acc.records
        summary["verify_steps"] = len(recs)
        summary["accepted_per_step"] = round(sum(r["accepted"] for r in recs) / max(1, len(recs)), 4)
        summary["per_position"] = [
            round(sum(1 for r in recs if r["accepted"] > i and len(r["proposed"]) > i)
                  / max(1, sum(1 for r in recs if len(r["proposed"]) > i)), 4) for i in range(cfg.block)]
    return summary


def _kv(cache: Any) -> list[tuple[Any, Any]]:
    from probes.engines.transformers import cache_kv

    return [(k, v) for k, v in cache_kv(cache)]


def _child(cfg: PDConfig, role: str, handoff: Path, job: Path) -> dict[str, Any]:
    job.write_text(json.dumps({"config": asdict(cfg), "role": role, "handoff": str(handoff)}))
    result = job.with_suffix(f".{role}.json")
    cmd = [sys.executable, "-m", "validator.workloads.transformers_pd", str(job), str(result)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(
        x for x in (str(_REPO), os.environ.get("PYTHONPATH")) if x)})
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-6:]
        raise InputError(f"the {role} process failed (exit {proc.returncode}): " + " | ".join(tail))
    return dict(json.loads(result.read_text()))


def run(cfg: PDConfig) -> dict[str, Any]:
    """Run one mode and write the bundle ``cfg.out``; returns a summary (also ``<out>/hf-run.json``)."""
    cfg.check()
    prompts = load_prompts(cfg.prompts, cfg.limit)  # a bad prompts file is refused before any model is loaded
    check_fit(cfg, prompts)
    out = Path(cfg.out)
    if (out / "parts").exists():
        raise InputError(f"{out}: a bundle is already there; give a new --out")
    out.mkdir(parents=True, exist_ok=True)
    if cfg.mode == "d-only":
        procs = [_process(cfg, "donly", None)]
    else:
        work = out / "handoff"
        job = out / "job.json"
        procs = [_child(cfg, "prefill", work, job), _child(cfg, "decode", work, job)]
        for p in work.glob("*.safetensors"):
            p.unlink()
        work.rmdir()
        job.unlink()
        for p in out.glob("job.*.json"):
            p.unlink()
    summary = {"config": asdict(cfg), "processes": procs}
    (out / "hf-run.json").write_text(json.dumps(summary, indent=1))
    return summary


# -- command line --------------------------------------------------------------------------------------


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=str(DEFAULT_MODEL),
                   help="a save_pretrained directory, a folder holding target/ and draft/, or a JSON config "
                        "(random init); default: the committed GSM8K-trained tiny pair")
    p.add_argument("--draft", help="the draft (directory or JSON config); default: <model>/draft when present")
    p.add_argument("--mode", choices=MODES, default="d-only")
    p.add_argument("--prompts", default=str(DEFAULT_PROMPTS),
                   help="JSONL: GSM8K rows ('question') or {'prompt': ...}; default: GSM8K test questions")
    p.add_argument("--out", required=True, help="bundle directory to write")
    p.add_argument("--push", metavar="URL", help="afterwards, push the bundle to this server (validator push)")
    p.add_argument("--limit", type=int, default=16, help="prompts to run (the first N of the file; default 16)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--block", type=int, default=4, help="draft tokens per verify step")
    p.add_argument("--capture", choices=("full", "summary", "off"), default="full")
    p.add_argument("--names", default="", help="capture only these tensor names (comma-separated globs)")
    p.add_argument("--budget", default="1GiB", help="capture byte budget per process")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    p.add_argument("--tp-prefill", type=int, default=4, help="P ranks the KV heads are split over")
    p.add_argument("--tp-decode", type=int, default=8, help="D ranks the KV heads are read by")
    p.add_argument("--break", dest="break_kind", choices=BREAKS, default="head",
                   help="pd-broken: misplace one head slice or one layer's cache")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--name", help="run name (default hf-<mode>)")
    p.add_argument("--label", action="append", default=[], help="KEY=VALUE, repeatable")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")


def run_from_args(args: argparse.Namespace) -> int:
    labels = {}
    for item in args.label:
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise InputError(f"--label {item!r}: expected KEY=VALUE")
        labels[k] = v
    cfg = PDConfig(model=args.model, draft=args.draft, mode=args.mode, prompts=args.prompts, out=args.out,
                   limit=args.limit, max_new_tokens=args.max_new_tokens, block=args.block, capture=args.capture,
                   names=tuple(n for n in args.names.split(",") if n), budget=args.budget, device=args.device,
                   dtype=args.dtype, tp_prefill=args.tp_prefill, tp_decode=args.tp_decode,
                   break_kind=args.break_kind, seed=args.seed, run_name=args.name, labels=labels,
                   threads=args.threads)
    s = run(cfg)
    last = s["processes"][-1]
    pos = " ".join(f"{x:.3f}" for x in last.get("per_position", []))
    print(f"{cfg.mode}: {last['requests']} requests, {last.get('verify_steps', 0)} verify steps, "
          f"acceptance per position {pos or '-'} -> {cfg.out}")
    if args.push:
        cmd = [sys.executable, "-m", "validator", "--server", args.push, "push", cfg.out]
        if args.name:
            cmd += ["--name", args.name]
        return subprocess.run(cmd, check=False).returncode
    return 0


def _main(argv: Sequence[str]) -> int:
    """Child process entry: ``python -m validator.workloads.transformers_pd JOB.json RESULT.json``."""
    job = json.loads(Path(argv[0]).read_text())
    c = job["config"]
    c["names"] = tuple(c.get("names") or ())
    cfg = PDConfig(**c)
    try:
        result = _process(cfg, job["role"], Path(job["handoff"]))
    except InputError as exc:
        print(f"validator: error: {exc}", file=sys.stderr)
        return 2
    Path(argv[1]).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
